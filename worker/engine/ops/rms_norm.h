// RMSNorm (Zhang & Sennrich 2019) fused for CPU fp32 (fast where
// the profile says so: `./bench/run.sh llama` measured the LibTorch-ops
// RMSNorm at 1.22x GPT-2's time per model FLOP, the largest of the Llama
// knobs):
//
//   y = x · r · w,   r = 1 / sqrt(mean(x²) + eps)          (per row of d)
//   dx = r · (dy·w − x · r² · mean(dy·w·x)),  dw = Σ_rows dy · x · r
//
// One pass over each row in forward (keeping r per row) and one in backward,
// rows spread over OpenMP threads, dw from per-thread partial sums added in
// a fixed order (so it is deterministic for a given thread count). The
// unfused expression reads and writes the [rows, d] tensor about six times
// each way. Agrees with it to ~1e-6 relative (rms_norm_test.cc).
#ifndef LOOM_WORKER_ENGINE_OPS_RMS_NORM_H_
#define LOOM_WORKER_ENGINE_OPS_RMS_NORM_H_

#include <torch/types.h>

namespace loom::engine {

// RMSNorm of x [..., d] with weight w [d], differentiable in both. CPU fp32
// contiguous inputs take the fused kernel; anything else (GPU, other dtypes)
// the LibTorch expression, computed in fp32 and returned in x's dtype.
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// The LibTorch expression (the reference, and the fallback).
torch::Tensor RmsNormReference(const torch::Tensor& x, const torch::Tensor& weight, double eps);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_OPS_RMS_NORM_H_
