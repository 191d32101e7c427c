// What the CPU this process runs on can do, for the kernels that pick a
// code path at run time (fused AdamW, fused loss, GELU, attention). Pure
// facts about the hardware; no LibTorch.
//
// Thread-safe: detection runs once, on first use.
#ifndef LOOM_WORKER_ENGINE_OPS_CPU_FEATURES_H_
#define LOOM_WORKER_ENGINE_OPS_CPU_FEATURES_H_

namespace loom::engine {

// SIMD instruction sets the kernels have paths for, narrowest first (so
// levels compare with < and std::min).
enum class SimdLevel {
  kAuto,    // the widest level this CPU supports
  kScalar,  // plain C++
  kAvx2,    // 8 lanes; needs AVX2 and FMA
  kAvx512,  // 16 lanes; needs AVX-512F
};

// The widest level this CPU supports (never kAuto); kScalar off x86.
SimdLevel BestSimdLevel();

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_OPS_CPU_FEATURES_H_
