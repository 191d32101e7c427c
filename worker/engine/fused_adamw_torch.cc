#include "worker/engine/fused_adamw_torch.h"

#include <cstdint>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include <c10/core/TensorImpl.h>
#include <torch/optim/serialize.h>
#include <torch/utils.h>

#include "absl/strings/str_format.h"

namespace loom::engine {
namespace {

using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;
using torch::optim::OptimizerParamGroup;
using torch::optim::OptimizerParamState;

// The key of Optimizer::state(): LibTorch 1.13 uses the TensorImpl address
// printed as a string, 2.x the address itself. A template, so that only the
// branch for the installed LibTorch is instantiated.
using StateMap = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;
using StateKey = typename StateMap::key_type;

template <typename Key>
Key StateKeyOf(const torch::Tensor& param) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;  // c10::guts::to_string(ptr) in 1.13 does this
    out << param.unsafeGetTensorImpl();
    return out.str();
  } else {
    return param.unsafeGetTensorImpl();
  }
}

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
absl::Status CheckFloatCpuContiguous(const torch::Tensor& t, int64_t numel,
                                     const std::string& what) {
  if (!t.defined()) return absl::InvalidArgumentError(what + ": undefined");
  if (t.scalar_type() != torch::kFloat || !t.device().is_cpu() || !t.is_contiguous() ||
      t.is_sparse()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: FusedAdamW needs a contiguous dense fp32 CPU tensor, got %s %s%s",
                        what, std::string(c10::toString(t.scalar_type())), t.device().str(),
                        t.is_contiguous() ? "" : " (not contiguous)"));
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

}  // namespace

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
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& options = static_cast<const AdamWOptions&>(groups[g].options());
    if (absl::Status s = CheckHyperparameters(options, g); !s.ok()) return s;
    const std::vector<torch::Tensor>& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      if (absl::Status s = CheckFloatCpuContiguous(params[i], params[i].numel(), ParamPath(g, i));
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
  std::vector<AdamWGroup> kernel_groups;
  std::vector<AdamWParamState*> stepped;  // existing states to increment
  std::vector<std::pair<StateKey, std::unique_ptr<AdamWParamState>>> created;
  std::vector<torch::Tensor> touched;           // params and state, for bump_version
  std::vector<torch::Tensor> contiguous_grads;  // keeps copies alive
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
      if (absl::Status s = CheckFloatCpuContiguous(param, numel, path); !s.ok()) return s;
      if (grad.scalar_type() == torch::kFloat && grad.device().is_cpu() && !grad.is_sparse() &&
          !grad.is_contiguous()) {
        grad = grad.contiguous();  // e.g. an expanded gradient; rare
        contiguous_grads.push_back(grad);
      }
      if (absl::Status s = CheckFloatCpuContiguous(grad, numel, path + ".grad"); !s.ok()) return s;

      AdamWParamState* state = nullptr;
      const StateKey key = StateKeyOf<StateKey>(param);
      auto it = state_.find(key);
      if (it != state_.end()) {
        state = static_cast<AdamWParamState*>(it->second.get());
        stepped.push_back(state);
      } else {
        auto fresh = std::make_unique<AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(param, torch::MemoryFormat::Contiguous));
        fresh->exp_avg_sq(torch::zeros_like(param, torch::MemoryFormat::Contiguous));
        state = fresh.get();
        created.emplace_back(key, std::move(fresh));
      }
      if (absl::Status s = CheckFloatCpuContiguous(state->exp_avg(), numel, path + ".exp_avg");
          !s.ok()) {
        return s;
      }
      if (absl::Status s =
              CheckFloatCpuContiguous(state->exp_avg_sq(), numel, path + ".exp_avg_sq");
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
      touched.push_back(param);
      touched.push_back(state->exp_avg());
      touched.push_back(state->exp_avg_sq());
    }
    kernel_groups.push_back(std::move(group));
  }

  const AdamWStepResult result = FusedAdamWStep(kernel_groups, options, kernel_options_);
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
  auto it = state.find(StateKeyOf<StateKey>(param));
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
