// FusedAdamW: a torch::optim::Optimizer whose step() runs the fused AdamW
// kernel of fused_adamw.h over the parameter groups' fp32 CPU tensors.
//
// It is a drop-in for torch::optim::AdamW (LibTorch 1.13 and 2.x):
//   * the same parameter groups and per-group torch::optim::AdamWOptions
//     (lr, betas, eps, weight_decay; amsgrad is not supported), so
//     SetLearningRate(optimizer, lr) from optimizer.h works unchanged;
//   * the same per-parameter state, torch::optim::AdamWParamState (step,
//     exp_avg, exp_avg_sq), created on a parameter's first step;
//   * the same archive format in save()/load(): a checkpoint written by
//     torch::optim::AdamW loads into FusedAdamW and the other way round;
//   * the same arithmetic to within fp32 rounding (fused_adamw.h).
// What it adds: Step() takes an inv_scale (fp16 loss scaling) and a
// max_grad_norm, clips inside the fused pass instead of rewriting the
// gradients, and skips the whole step — no parameter, moment or step count
// changes — when any gradient is inf or NaN, reporting that in its result.
//
// Thread safety: like every torch optimizer, not safe for concurrent use.
// It refers to the parameters' tensors; keep them alive as long as it.
#ifndef LOOM_WORKER_ENGINE_FUSED_ADAMW_TORCH_H_
#define LOOM_WORKER_ENGINE_FUSED_ADAMW_TORCH_H_

#include <memory>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/fused_adamw.h"

namespace loom::engine {

class FusedAdamW : public torch::optim::Optimizer {
 public:
  // INVALID_ARGUMENT when a group asks for amsgrad, a hyperparameter is out
  // of range (lr, eps, weight_decay >= 0; 0 <= beta < 1), or a parameter is
  // not a contiguous fp32 CPU tensor (the error names the group and index).
  static absl::StatusOr<std::unique_ptr<FusedAdamW>> Create(
      std::vector<torch::optim::OptimizerParamGroup> param_groups,
      const torch::optim::AdamWOptions& defaults = {},
      const AdamWKernelOptions& kernel_options = {});

  // One optimizer step over the parameters that have a gradient (others are
  // left alone and keep their step count, as in torch::optim::AdamW).
  // Returns the kernel's result: applied == false means the step was skipped
  // because a gradient was inf or NaN. INVALID_ARGUMENT when a parameter,
  // gradient or loaded state tensor is not contiguous fp32 on the CPU or has
  // the wrong size; then nothing changed either.
  absl::StatusOr<AdamWStepResult> Step(const AdamWStepOptions& options = {});

  // torch::optim::Optimizer interface: evaluates `closure` if given, then
  // Step() with no unscale and no clipping. Throws c10::Error where Step()
  // returns an error. A skipped step is visible in last_result().
  torch::Tensor step(LossClosure closure = nullptr) override;

  // The result of the last successful Step() or step(); {} before the first.
  const AdamWStepResult& last_result() const { return last_result_; }

  // torch::optim::AdamW's archive layout (see the header comment).
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
             const torch::optim::AdamWOptions& defaults, const AdamWKernelOptions& kernel_options);

  AdamWKernelOptions kernel_options_;
  AdamWStepResult last_result_;
};

// The AdamW state of `param` in `optimizer` (a FusedAdamW or a
// torch::optim::AdamW), or nullptr before the parameter's first step.
const torch::optim::AdamWParamState* FindAdamWState(const torch::optim::Optimizer& optimizer,
                                                    const torch::Tensor& param);

// FusedAdamW over `module`'s trainable parameters in the two groups of
// MakeAdamW (optimizer.h): group 0 (dim() >= 2) with `options`'
// weight_decay, group 1 (biases, norm gains) with weight_decay 0. Both groups
// are present even when empty.
absl::StatusOr<std::unique_ptr<FusedAdamW>> MakeFusedAdamW(
    const torch::nn::Module& module, const torch::optim::AdamWOptions& options,
    const AdamWKernelOptions& kernel_options = {});

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_FUSED_ADAMW_TORCH_H_
