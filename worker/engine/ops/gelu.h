// GELU with the tanh approximation, fused for CPU fp32 (the fused
// step):
//
//   gelu(x)  = ½·x·(1 + tanh(u)),  u = √(2/π)·(x + 0.044715·x³)
//   gelu'(x) = ½·(1 + t) + ½·x·(1 − t²)·√(2/π)·(1 + 3·0.044715·x²),  t = tanh(u)
//
// LibTorch 1.13's CPU kernels run each direction at ~0.3 G elements/s on
// two threads here (its vectorised tanh); this computes the same function
// as x·σ(2u) (½(1 + tanh u) = σ(2u), which keeps its digits where tanh u →
// −1) with the engine's AVX-512 exp (simd_exp.h), one pass each way,
// OpenMP over chunks. Same results as
// torch::gelu(x, "tanh") to ~1e-6 relative (gelu_test.cc); NaN in, NaN out.
#ifndef LOOM_WORKER_ENGINE_OPS_GELU_H_
#define LOOM_WORKER_ENGINE_OPS_GELU_H_

#include <torch/types.h>

namespace loom::engine {

// gelu(x) with the tanh approximation, differentiable. CPU fp32 tensors on a
// CPU with AVX-512 take the fused kernel; anything else goes to
// torch::gelu(x, "tanh").
torch::Tensor GeluTanh(const torch::Tensor& x);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_OPS_GELU_H_
