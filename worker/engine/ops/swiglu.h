// SwiGLU's gating (Shazeer 2020) fused for CPU fp32 (fast where
// the profile says so: `./bench/run.sh llama` ablates each Llama knob):
//
//   h = silu(g) · u = g · s · u,   s = sigmoid(g)
//   dg = dh · u · s · (1 + g · (1 − s)),   du = dh · g · s
//
// The sigmoid comes from LibTorch's vectorized kernel (its exp is SLEEF's;
// a scalar std::exp loop made the Llama step slower, not faster), then one
// pass makes the products forward and one both gradients backward. Only g
// and u are kept for backward (LibTorch's silu(g) * u also keeps silu(g),
// one more [rows, f] tensor per block, and makes three passes backward).
// Agrees with the LibTorch expression to ~1e-6 relative (swiglu_test.cc).
#ifndef LOOM_WORKER_ENGINE_OPS_SWIGLU_H_
#define LOOM_WORKER_ENGINE_OPS_SWIGLU_H_

#include <torch/types.h>

namespace loom::engine {

// silu(gate) * up for gate and up of one shape, differentiable in both.
// CPU fp32 inputs take the fused kernel; anything else (GPU, bf16 under
// autocast, other dtypes) the LibTorch expression.
torch::Tensor SwiGlu(const torch::Tensor& gate, const torch::Tensor& up);

// The LibTorch expression (the reference, and the fallback).
torch::Tensor SwiGluReference(const torch::Tensor& gate, const torch::Tensor& up);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_OPS_SWIGLU_H_
