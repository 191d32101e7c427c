// Fused AdamW over raw fp32 arrays (the fused step): one pass over
// the gradients for the global norm and non-finite detection, then one pass
// over (param, grad, exp_avg, exp_avg_sq) that applies gradient unscale and
// clipping, decoupled weight decay, both moments, bias correction and the
// update. No LibTorch here; fused_adamw_torch.h adapts it to torch::optim.
//
// The arithmetic is torch::optim::AdamW's (LibTorch 1.13
// torch/csrc/api/src/optim/adamw.cpp; Loshchilov & Hutter 2019, Algorithm 2),
// per element of a tensor on its step t (1-based), in fp32, with the double
// scalars rounded to fp32 as LibTorch rounds a Scalar applied to a float
// tensor, and in the order of LibTorch's CPU kernels (p.mul_; exp_avg.mul_
// then add_ with alpha, which ATen evaluates as one FMA; exp_avg_sq.mul_
// then addcmul_; addcdiv_ as self + (value * t1) / t2):
//   g      = grad * grad_scale                      grad_scale = inv_scale * clip_coef
//   param  = param * (1 - lr * weight_decay)         decoupled weight decay
//   m      = fma(g, 1 - beta1, m * beta1)
//   v      = fma((1 - beta2) * g, g, v * beta2)
//   denom  = sqrt(v) / sqrt(1 - beta2^t) + eps
//   param  = param + (neg_step * m) / denom         neg_step = -lr / (1 - beta1^t)
// With Debian's LibTorch 1.13 on this project's hosts that reproduces
// torch::optim::AdamW bit for bit; fused_adamw_torch_test.cc asserts 1e-6
// relative, which LibTorch 2.11 meets as well. The kernels make exactly
// these roundings (explicit FMAs, no other contraction: the file is compiled
// with -ffp-contract=off), so every SIMD level and thread count gives
// bit-identical parameters and moments.
//
// Thread safety: the functions are reentrant; concurrent calls must not share
// arrays that either call writes.
#ifndef LOOM_WORKER_ENGINE_OPS_FUSED_ADAMW_H_
#define LOOM_WORKER_ENGINE_OPS_FUSED_ADAMW_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "worker/engine/ops/cpu_features.h"  // SimdLevel, part of this API

namespace loom::engine {

// One parameter tensor: four arrays of `size` contiguous fp32 elements,
// borrowed from the caller for the duration of a call. `grad` is only read.
// No array may overlap another array of any tensor in the same call.
struct AdamWTensor {
  float* param = nullptr;
  const float* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  int64_t size = 0;
  double weight_decay = 0;
  // The 1-based number of the update being made to this tensor (its AdamW
  // state's step count after incrementing); the bias corrections use it.
  // The caller increments its stored count only when the step is applied.
  int64_t step = 1;
};

struct AdamWHyperparams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

// Tensors that share hyperparameters, like one torch::optim param group.
struct AdamWGroup {
  AdamWHyperparams hyperparams;
  std::vector<AdamWTensor> tensors;
};

// How the kernels run; the results of AdamWUpdate do not depend on it.
struct AdamWKernelOptions {
  // Threads to split the elements over; 0 means omp_get_max_threads() (which
  // at::set_num_threads also sets). Small calls use fewer threads.
  int num_threads = 0;
  // A level above BestSimdLevel() is lowered to it.
  SimdLevel simd = SimdLevel::kAuto;
};

// Sum over every tensor of every group of grad[i]^2, accumulated in double.
// The result is inf or NaN exactly when some gradient element is inf or NaN
// (a finite fp32 squared is below 1.2e77, so the sum cannot overflow). Its
// last bits depend on the thread count and SIMD level (summation order).
double GradSquaredNorm(absl::Span<const AdamWGroup> groups, const AdamWKernelOptions& options = {});

// Applies one AdamW update to every tensor of every group with the gradient
// multiplied by `grad_scale` (inv_scale * clip_coef), unconditionally: the
// caller has checked the gradients.
void AdamWUpdate(absl::Span<const AdamWGroup> groups, double grad_scale,
                 const AdamWKernelOptions& options = {});

struct AdamWStepOptions {
  // Gradients are multiplied by this before anything else (1 / loss scale
  // with fp16 dynamic loss scaling).
  double inv_scale = 1.0;
  // When > 0 and the global norm of the unscaled gradients exceeds it, the
  // gradients are scaled by max_grad_norm / (norm + 1e-6), as
  // torch.nn.utils.clip_grad_norm_ and loom::engine::ClipGradNorm do.
  double max_grad_norm = 0;
};

struct AdamWStepResult {
  // False when some gradient was inf or NaN: then nothing was written.
  bool applied = false;
  // Global L2 norm of the unscaled gradients before clipping; inf or NaN
  // when the step was skipped.
  double grad_norm = 0;
  // The clip factor applied (1 when not clipped, 0 when skipped).
  double clip_coef = 0;
};

// The fused step: GradSquaredNorm (which doubles as the non-finite check),
// then, if every gradient is finite, the clip factor and AdamWUpdate with
// grad_scale = inv_scale * clip_coef. A skipped step changes no array.
AdamWStepResult FusedAdamWStep(absl::Span<const AdamWGroup> groups,
                               const AdamWStepOptions& step_options = {},
                               const AdamWKernelOptions& options = {});

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_OPS_FUSED_ADAMW_H_
