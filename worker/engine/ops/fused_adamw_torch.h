// FusedAdamW: a torch::optim::Optimizer whose step() runs the fused AdamW
// step of fused_adamw.h over the parameter groups' fp32 tensors: on the CPU
// the kernel of fused_adamw.h; on CUDA the multi-tensor kernel of
// fused_adamw_cuda.h when this build has it (HasCudaKernel()), else the same
// step as LibTorch operations (FusedAdamWPath).
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
#ifndef LOOM_WORKER_ENGINE_OPS_FUSED_ADAMW_TORCH_H_
#define LOOM_WORKER_ENGINE_OPS_FUSED_ADAMW_TORCH_H_

#include <memory>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/ops/fused_adamw.h"

namespace loom::engine {

// Which implementation FusedAdamW::Step() runs. All make fused_adamw.h's
// roundings except where LibTorch's element-wise kernels contract a
// multiply-add differently, and agree with torch::optim::AdamW to 1e-6
// relative (fused_adamw_torch_test.cc).
enum class FusedAdamWPath {
  // CPU parameters: the CPU kernel (fused_adamw.h). CUDA parameters: the
  // CUDA kernel (fused_adamw_cuda.h) when HasCudaKernel(), else kTorchOps.
  kAuto,
  // The step as LibTorch operations on the parameters' device, in
  // torch::optim::AdamW's order (one host synchronisation per step, for the
  // non-finite check). For CUDA builds without the kernel, and for tests.
  kTorchOps,
};

class FusedAdamW : public torch::optim::Optimizer {
 public:
  // INVALID_ARGUMENT when a group asks for amsgrad, a hyperparameter is out
  // of range (lr, eps, weight_decay >= 0; 0 <= beta < 1), or a parameter is
  // not a contiguous fp32 tensor on the CPU or a CUDA device, all on the
  // same device (the error names the group and index).
  static absl::StatusOr<std::unique_ptr<FusedAdamW>> Create(
      std::vector<torch::optim::OptimizerParamGroup> param_groups,
      const torch::optim::AdamWOptions& defaults = {},
      const AdamWKernelOptions& kernel_options = {});

  // One optimizer step over the parameters that have a gradient (others are
  // left alone and keep their step count, as in torch::optim::AdamW).
  // Returns the kernel's result: applied == false means the step was skipped
  // because a gradient was inf or NaN. INVALID_ARGUMENT when a parameter,
  // gradient or state tensor is not contiguous fp32 on the parameters'
  // device or has the wrong size; then nothing changed either. State on
  // another device than its parameter (loaded from a CPU checkpoint for
  // CUDA parameters) is moved to the parameter's device first. INTERNAL for
  // a CUDA error.
  absl::StatusOr<AdamWStepResult> Step(const AdamWStepOptions& options = {});

  // Whether this build runs CUDA parameters through the CUDA kernel: LibTorch
  // was built with CUDA and nvcc compiled fused_adamw_cuda.cu
  // (LOOM_HAVE_TORCH_CUDA, worker/engine/fused_adamw.cmake).
  static bool HasCudaKernel();

  FusedAdamWPath path() const { return path_; }
  void set_path(FusedAdamWPath path) { path_ = path; }

  // What Step() runs for parameters on `device` under path():
  // "cpu-kernel", "cuda-kernel" or "torch-ops".
  const char* ImplementationFor(const torch::Device& device) const;

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
  FusedAdamWPath path_ = FusedAdamWPath::kAuto;
  // The CUDA kernel's buffers (a FusedAdamWCuda), made on the first CUDA
  // step; type-erased so that this header needs no CUDA headers. Empty in
  // builds without the kernel.
  std::shared_ptr<void> cuda_kernel_;
};

// AdamWUpdate (fused_adamw.h) over arrays that live on `device`: under
// kAuto on the CPU it is AdamWUpdate itself; on another device (or under
// kTorchOps) the same update as LibTorch operations over views of the
// arrays (kTorchOps' update, in torch::optim::AdamW's order), on the
// device's current stream. Like AdamWUpdate it checks nothing: the caller
// has made the non-finite check. For optimizers that keep their own flat
// buffers (parallel/sharded_adamw.h).
void AdamWUpdateOn(const torch::Device& device, absl::Span<const AdamWGroup> groups,
                   double grad_scale, FusedAdamWPath path = FusedAdamWPath::kAuto);

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

#endif  // LOOM_WORKER_ENGINE_OPS_FUSED_ADAMW_TORCH_H_
