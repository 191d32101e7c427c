// Which BLAS the dynamic linker resolves libblas.so.3 to. Debian's LibTorch
// calls whatever the alternatives system selects, and the reference BLAS is
// ~100x slower than OpenBLAS for sgemm, so daemons report it at start-up.
#ifndef LOOM_WORKER_BLAS_INFO_H_
#define LOOM_WORKER_BLAS_INFO_H_

#include <string>

namespace loom::worker {

struct BlasInfo {
  std::string path;     // resolved real path, empty if libblas.so.3 is absent
  std::string vendor;   // "openblas", "blis", "mkl", "atlas", "reference" or "unknown"
  bool optimized = false;
};

BlasInfo DetectBlas();

}  // namespace loom::worker

#endif  // LOOM_WORKER_BLAS_INFO_H_
