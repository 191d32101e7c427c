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

// Caps the threads the process's BLAS starts inside one call at `threads`
// (>= 1), so a rank uses the cores it was given. OpenBLAS's pthreads build,
// the one Debian's LibTorch links (libopenblas.so.0), keeps its own pool of
// one thread per core that torch::set_num_threads does not size: a rank of
// threads_per_rank 1 ran its matrix products on two cores (measured: 176-194%
// CPU), so ranks sharing a host oversubscribed it (two single-rank jobs
// side by side took 1.6-1.75x their step alone) and every measured rate
// described two cores, not one. BLIS's pool likewise; OpenMP builds follow
// omp_set_num_threads, which torch::set_num_threads sets. Process-wide.
// Returns the thread count the BLAS reports afterwards, `threads` when it
// takes the setting without reporting one, and 0 when no BLAS in the
// process exposes a control.
int SetBlasThreads(int threads);

}  // namespace loom::worker

#endif  // LOOM_WORKER_BLAS_INFO_H_
