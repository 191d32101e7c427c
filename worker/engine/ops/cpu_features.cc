#include "worker/engine/ops/cpu_features.h"

namespace loom::engine {

SimdLevel BestSimdLevel() {
#if defined(__x86_64__) || defined(__i386__)
  static const SimdLevel best = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return SimdLevel::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return SimdLevel::kAvx2;
    return SimdLevel::kScalar;
  }();
  return best;
#else
  return SimdLevel::kScalar;
#endif
}

}  // namespace loom::engine
