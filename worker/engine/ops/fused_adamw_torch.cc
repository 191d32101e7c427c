#include "worker/engine/ops/fused_adamw_torch.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include <c10/core/TensorImpl.h>
#include <torch/optim/serialize.h>
#include <torch/utils.h>

#include "absl/strings/str_format.h"
#include "worker/engine/optimizer_state_key.h"

// LOOM_HAVE_TORCH_CUDA: LibTorch has CUDA and nvcc built fused_adamw_cuda.cu
// (worker/engine/fused_adamw.cmake sets it to 1 only then).
#ifndef LOOM_HAVE_TORCH_CUDA
#define LOOM_HAVE_TORCH_CUDA 0
#endif
#if LOOM_HAVE_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "worker/engine/ops/fused_adamw_cuda.h"
#endif

namespace loom::engine {
namespace {

using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;
using torch::optim::OptimizerParamGroup;
using torch::optim::OptimizerParamState;

// Optimizer::state()'s key type differs between LibTorch 1.13 and 2.x
// (optimizer_state_key.h).
using StateMap = OptimizerStateMap;
using StateKey = OptimizerStateKey;

absl::Status CheckHyperparameters(const AdamWOptions& options, size_t group) {
  const double beta1 = std::get<0>(options.betas()), beta2 = std::get<1>(options.betas());
  if (options.amsgrad()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("param_groups[%d].amsgrad: not supported by FusedAdamW", group));
  }
  if (!(options.lr() >= 0) || !(options.eps() >= 0) || !(options.weight_decay() >= 0) ||
      !(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "param_groups[%d]: need lr, eps, weight_decay >= 0 and betas in [0, 1); got lr=%g "
        "eps=%g weight_decay=%g betas=(%g, %g)",
        group, options.lr(), options.eps(), options.weight_decay(), beta1, beta2));
  }
  return absl::OkStatus();
}

// `what` names the tensor in the error, e.g. "param_groups[0].params[3].grad".
absl::Status CheckFloatContiguous(const torch::Tensor& t, int64_t numel,
                                  const torch::Device& device, const std::string& what) {
  if (!t.defined()) return absl::InvalidArgumentError(what + ": undefined");
  if (t.scalar_type() != torch::kFloat || t.device() != device || !t.is_contiguous() ||
      t.is_sparse()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: FusedAdamW needs a contiguous dense fp32 tensor on %s, got %s %s%s%s", what,
        device.str(), std::string(c10::toString(t.scalar_type())), t.device().str(),
        t.is_sparse() ? " (sparse)" : "", t.is_contiguous() ? "" : " (not contiguous)"));
  }
  if (t.numel() != numel) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d elements, expected %d", what, t.numel(), numel));
  }
  return absl::OkStatus();
}

std::string ParamPath(size_t group, size_t index) {
  return absl::StrFormat("param_groups[%d].params[%d]", group, index);
}

// One parameter of a step, with its (possibly new) state.
struct StepEntry {
  torch::Tensor param, grad, exp_avg, exp_avg_sq;
  size_t group = 0;
  double weight_decay = 0;
  int64_t step = 1;  // 1-based number of this update
};

// The step of fused_adamw.h (FusedAdamWStep) as LibTorch operations, in
// torch::optim::AdamW's order (LibTorch 1.13 adamw.cpp): p.mul_(1 - lr·wd);
// m.mul_(β1).add_(g, 1 - β1); v.mul_(β2).addcmul_(g, g, 1 - β2);
// denom = sqrt(v) / sqrt(1 - β2^t) + eps; p.addcdiv_(m, denom, -lr / (1 - β1^t)).
// The squared norm is summed in double per tensor, then over tensors in a
// fixed order; reading it is the one host synchronisation.
AdamWStepResult TorchOpsStep(const std::vector<StepEntry>& entries,
                             const std::vector<AdamWHyperparams>& hyperparams,
                             const AdamWStepOptions& options) {
  AdamWStepResult result;
  double sum_squares = 0;
  if (!entries.empty()) {
    std::vector<torch::Tensor> sums;
    sums.reserve(entries.size());
    for (const StepEntry& e : entries) sums.push_back(e.grad.to(torch::kDouble).square().sum());
    sum_squares = torch::stack(sums).sum().item<double>();
  }
  if (!std::isfinite(sum_squares)) {
    result.applied = false;
    result.grad_norm = sum_squares;
    result.clip_coef = 0;
    return result;
  }
  result.grad_norm = std::sqrt(sum_squares) * std::abs(options.inv_scale);
  result.clip_coef = 1;
  if (options.max_grad_norm > 0 && result.grad_norm > options.max_grad_norm) {
    result.clip_coef = options.max_grad_norm / (result.grad_norm + 1e-6);
  }
  const double grad_scale = options.inv_scale * result.clip_coef;
  for (const StepEntry& e : entries) {
    const AdamWHyperparams& h = hyperparams[e.group];
    const double step = static_cast<double>(e.step);
    const double bias_correction1 = 1 - std::pow(h.beta1, step);
    const double bias_correction2 = 1 - std::pow(h.beta2, step);
    const torch::Tensor g = grad_scale == 1.0 ? e.grad : e.grad.mul(grad_scale);
    torch::Tensor param = e.param, exp_avg = e.exp_avg, exp_avg_sq = e.exp_avg_sq;
    param.mul_(1 - h.lr * e.weight_decay);
    exp_avg.mul_(h.beta1).add_(g, 1 - h.beta1);
    exp_avg_sq.mul_(h.beta2).addcmul_(g, g, 1 - h.beta2);
    const torch::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(h.eps);
    param.addcdiv_(exp_avg, denom, -h.lr / bias_correction1);
  }
  result.applied = true;
  return result;
}

#if LOOM_HAVE_TORCH_CUDA
// One step of the CUDA kernel on `device`'s current stream; waits for its
// verdict (the caller updates step counts only for an applied step).
absl::StatusOr<AdamWStepResult> CudaKernelStep(FusedAdamWCuda& kernel,
                                               absl::Span<const AdamWGroup> groups,
                                               const AdamWStepOptions& options,
                                               const torch::Device& device) {
  const c10::cuda::CUDAGuard guard(device.index());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  AdamWStepResult result;
  cudaError_t err = kernel.Step(groups, options, stream);
  if (err == cudaSuccess) err = kernel.LastResult(&result);
  if (err != cudaSuccess) {
    return absl::InternalError(
        absl::StrFormat("FusedAdamW: CUDA kernel on %s: %s", device.str(), cudaGetErrorString(err)));
  }
  return result;
}
#endif

}  // namespace

void AdamWUpdateOn(const torch::Device& device, absl::Span<const AdamWGroup> groups,
                   double grad_scale, FusedAdamWPath path) {
  if (device.is_cpu() && path == FusedAdamWPath::kAuto) {
    AdamWUpdate(groups, grad_scale);
    return;
  }
  torch::NoGradGuard no_grad;
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(device);
  for (const AdamWGroup& group : groups) {
    const AdamWHyperparams& h = group.hyperparams;
    for (const AdamWTensor& t : group.tensors) {
      if (t.size == 0) continue;
      torch::Tensor param = torch::from_blob(t.param, {t.size}, f32);
      const torch::Tensor grad = torch::from_blob(const_cast<float*>(t.grad), {t.size}, f32);
      torch::Tensor exp_avg = torch::from_blob(t.exp_avg, {t.size}, f32);
      torch::Tensor exp_avg_sq = torch::from_blob(t.exp_avg_sq, {t.size}, f32);
      const double step = static_cast<double>(t.step);
      const double bias_correction1 = 1 - std::pow(h.beta1, step);
      const double bias_correction2 = 1 - std::pow(h.beta2, step);
      const torch::Tensor g = grad_scale == 1.0 ? grad : grad.mul(grad_scale);
      param.mul_(1 - h.lr * t.weight_decay);
      exp_avg.mul_(h.beta1).add_(g, 1 - h.beta1);
      exp_avg_sq.mul_(h.beta2).addcmul_(g, g, 1 - h.beta2);
      const torch::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(h.eps);
      param.addcdiv_(exp_avg, denom, -h.lr / bias_correction1);
    }
  }
}

bool FusedAdamW::HasCudaKernel() { return LOOM_HAVE_TORCH_CUDA != 0; }

const char* FusedAdamW::ImplementationFor(const torch::Device& device) const {
  if (path_ == FusedAdamWPath::kTorchOps) return "torch-ops";
  if (device.is_cpu()) return "cpu-kernel";
  if (device.is_cuda() && HasCudaKernel()) return "cuda-kernel";
  return "torch-ops";
}

FusedAdamW::FusedAdamW(std::vector<OptimizerParamGroup> param_groups, const AdamWOptions& defaults,
                       const AdamWKernelOptions& kernel_options)
    : torch::optim::Optimizer(std::move(param_groups), std::make_unique<AdamWOptions>(defaults)),
      kernel_options_(kernel_options) {}

absl::StatusOr<std::unique_ptr<FusedAdamW>> FusedAdamW::Create(
    std::vector<OptimizerParamGroup> param_groups, const AdamWOptions& defaults,
    const AdamWKernelOptions& kernel_options) {
  std::unique_ptr<FusedAdamW> optimizer;
  try {
    optimizer.reset(new FusedAdamW(std::move(param_groups), defaults, kernel_options));
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(std::string("FusedAdamW: ") + e.what_without_backtrace());
  }
  const std::vector<OptimizerParamGroup>& groups = optimizer->param_groups();
  // Every parameter on the first one's device, which must be the CPU or CUDA.
  std::optional<torch::Device> device;
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& options = static_cast<const AdamWOptions&>(groups[g].options());
    if (absl::Status s = CheckHyperparameters(options, g); !s.ok()) return s;
    const std::vector<torch::Tensor>& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      if (!device.has_value() && params[i].defined()) {
        device = params[i].device();
        if (!device->is_cpu() && !device->is_cuda()) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "%s: FusedAdamW runs on the CPU or CUDA, not %s", ParamPath(g, i), device->str()));
        }
      }
      if (absl::Status s = CheckFloatContiguous(params[i], params[i].numel(),
                                                device.value_or(torch::kCPU), ParamPath(g, i));
          !s.ok()) {
        return s;
      }
    }
  }
  return optimizer;
}

absl::StatusOr<AdamWStepResult> FusedAdamW::Step(const AdamWStepOptions& options) {
  torch::NoGradGuard no_grad;
  // Everything is checked, and new state is only prepared, before the kernel
  // runs; the state map and step counts change only if the step is applied.
  std::vector<AdamWGroup> kernel_groups;     // raw pointers, for the kernels
  std::vector<AdamWHyperparams> hyperparams;  // per group, for the torch-ops path
  std::vector<StepEntry> entries;             // every parameter stepped (keeps grads alive)
  std::vector<AdamWParamState*> stepped;      // existing states to increment
  std::vector<std::pair<StateKey, std::unique_ptr<AdamWParamState>>> created;
  std::vector<torch::Tensor> touched;    // params and state, for bump_version
  std::optional<torch::Device> device;   // of the first parameter with a gradient
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& group_options = static_cast<const AdamWOptions&>(param_groups_[g].options());
    if (absl::Status s = CheckHyperparameters(group_options, g); !s.ok()) return s;
    AdamWGroup group;
    group.hyperparams.lr = group_options.lr();
    group.hyperparams.beta1 = std::get<0>(group_options.betas());
    group.hyperparams.beta2 = std::get<1>(group_options.betas());
    group.hyperparams.eps = group_options.eps();
    const std::vector<torch::Tensor>& params = param_groups_[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const torch::Tensor& param = params[i];
      torch::Tensor grad = param.grad();
      if (!grad.defined()) continue;
      const std::string path = ParamPath(g, i);
      const int64_t numel = param.numel();
      if (!device.has_value()) device = param.device();
      if (absl::Status s = CheckFloatContiguous(param, numel, *device, path); !s.ok()) return s;
      if (grad.scalar_type() == torch::kFloat && grad.device() == *device && !grad.is_sparse() &&
          !grad.is_contiguous()) {
        grad = grad.contiguous();  // e.g. an expanded gradient; rare
      }
      if (absl::Status s = CheckFloatContiguous(grad, numel, *device, path + ".grad"); !s.ok()) {
        return s;
      }

      AdamWParamState* state = nullptr;
      const StateKey key = StateKeyOf(param);
      auto it = state_.find(key);
      if (it != state_.end()) {
        state = static_cast<AdamWParamState*>(it->second.get());
        stepped.push_back(state);
        // State restored on another device (a CPU checkpoint of CUDA
        // parameters) follows its parameter; the values do not change.
        if (state->exp_avg().defined() && state->exp_avg().device() != *device) {
          state->exp_avg(state->exp_avg().to(*device).contiguous());
        }
        if (state->exp_avg_sq().defined() && state->exp_avg_sq().device() != *device) {
          state->exp_avg_sq(state->exp_avg_sq().to(*device).contiguous());
        }
      } else {
        auto fresh = std::make_unique<AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(param, torch::MemoryFormat::Contiguous));
        fresh->exp_avg_sq(torch::zeros_like(param, torch::MemoryFormat::Contiguous));
        state = fresh.get();
        created.emplace_back(key, std::move(fresh));
      }
      if (absl::Status s =
              CheckFloatContiguous(state->exp_avg(), numel, *device, path + ".exp_avg");
          !s.ok()) {
        return s;
      }
      if (absl::Status s =
              CheckFloatContiguous(state->exp_avg_sq(), numel, *device, path + ".exp_avg_sq");
          !s.ok()) {
        return s;
      }
      AdamWTensor t;
      t.param = param.data_ptr<float>();
      t.grad = grad.data_ptr<float>();
      t.exp_avg = state->exp_avg().data_ptr<float>();
      t.exp_avg_sq = state->exp_avg_sq().data_ptr<float>();
      t.size = numel;
      t.weight_decay = group_options.weight_decay();
      t.step = state->step() + 1;
      group.tensors.push_back(t);
      entries.push_back({param, grad, state->exp_avg(), state->exp_avg_sq(), g, t.weight_decay,
                         t.step});
      touched.push_back(param);
      touched.push_back(state->exp_avg());
      touched.push_back(state->exp_avg_sq());
    }
    hyperparams.push_back(group.hyperparams);
    kernel_groups.push_back(std::move(group));
  }

  const std::string implementation = ImplementationFor(device.value_or(torch::kCPU));
  AdamWStepResult result;
  if (implementation == "cpu-kernel") {
    result = FusedAdamWStep(kernel_groups, options, kernel_options_);
  } else if (implementation == "cuda-kernel") {
#if LOOM_HAVE_TORCH_CUDA
    if (!cuda_kernel_) cuda_kernel_ = std::make_shared<FusedAdamWCuda>();
    absl::StatusOr<AdamWStepResult> cuda = CudaKernelStep(
        *static_cast<FusedAdamWCuda*>(cuda_kernel_.get()), kernel_groups, options, *device);
    if (!cuda.ok()) return cuda.status();
    result = *cuda;
#endif
  } else {
    result = TorchOpsStep(entries, hyperparams, options);
  }
  if (result.applied) {
    for (AdamWParamState* state : stepped) state->step(state->step() + 1);
    for (auto& [key, state] : created) {
      state->step(1);
      state_[key] = std::move(state);
    }
    // The kernel wrote through raw pointers; tell autograd the tensors
    // changed, as the in-place ops of torch::optim::AdamW would.
    for (torch::Tensor& t : touched) t.unsafeGetTensorImpl()->bump_version();
  }
  last_result_ = result;
  return result;
}

torch::Tensor FusedAdamW::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  absl::StatusOr<AdamWStepResult> result = Step();
  TORCH_CHECK(result.ok(), result.status().ToString());
  return loss;
}

void FusedAdamW::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<AdamWParamState, AdamWOptions>(archive, *this);
}

void FusedAdamW::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<AdamWParamState, AdamWOptions>(archive, *this);
}

const AdamWParamState* FindAdamWState(const torch::optim::Optimizer& optimizer,
                                      const torch::Tensor& param) {
  const StateMap& state = optimizer.state();
  auto it = state.find(StateKeyOf(param));
  return it == state.end() ? nullptr : static_cast<const AdamWParamState*>(it->second.get());
}

absl::StatusOr<std::unique_ptr<FusedAdamW>> MakeFusedAdamW(
    const torch::nn::Module& module, const AdamWOptions& options,
    const AdamWKernelOptions& kernel_options) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const torch::Tensor& p : module.parameters(/*recurse=*/true)) {
    if (!p.requires_grad()) continue;
    (p.dim() >= 2 ? decay : no_decay).push_back(p);
  }
  AdamWOptions no_decay_options = options;
  no_decay_options.weight_decay(0.0);
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(std::move(decay), std::make_unique<AdamWOptions>(options));
  groups.emplace_back(std::move(no_decay), std::make_unique<AdamWOptions>(no_decay_options));
  return FusedAdamW::Create(std::move(groups), options, kernel_options);
}

}  // namespace loom::engine
