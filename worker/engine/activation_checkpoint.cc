#include "worker/engine/activation_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <optional>
#include <utility>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/ivalue.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/custom_class.h>

#include "worker/engine/autocast.h"
#include "worker/engine/config.h"

namespace loom::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Carries the segment from forward to backward in the autograd context
// (saved_data holds IValues; a capsule holds any CustomClassHolder).
struct SegmentHolder : torch::CustomClassHolder {
  explicit SegmentHolder(SegmentFunction f) : fn(std::move(f)) {}
  SegmentFunction fn;
};

// The default generator of `device`: the CPU's, or an accelerator's (CUDA
// draws dropout masks from the device's own generator, not the CPU's).
at::Generator DefaultGenerator(const c10::Device& device) {
  if (device.is_cpu()) return at::detail::getDefaultCPUGenerator();
  return at::globalContext().defaultGenerator(device);
}

torch::Tensor GetRngState(const c10::Device& device) {
  at::Generator gen = DefaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void SetRngState(const c10::Device& device, const torch::Tensor& state) {
  at::Generator gen = DefaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// Sets `device`'s generator to `state` and restores what it held on exit.
class RngReplay {
 public:
  RngReplay(const c10::Device& device, const torch::Tensor& state)
      : device_(device), previous_(GetRngState(device)) {
    SetRngState(device_, state);
  }
  ~RngReplay() { SetRngState(device_, previous_); }
  RngReplay(const RngReplay&) = delete;
  RngReplay& operator=(const RngReplay&) = delete;

 private:
  c10::Device device_;
  torch::Tensor previous_;
};

void SaveAutocast(AutogradContext* ctx, const char* key, c10::DeviceType device) {
  const AutocastState state = GetAutocastState(device);
  ctx->saved_data[std::string(key) + "_enabled"] = state.enabled;
  ctx->saved_data[std::string(key) + "_dtype"] = static_cast<int64_t>(state.dtype);
}

AutocastState LoadAutocast(AutogradContext* ctx, const char* key) {
  AutocastState state;
  state.enabled = ctx->saved_data[std::string(key) + "_enabled"].toBool();
  state.dtype = static_cast<c10::ScalarType>(ctx->saved_data[std::string(key) + "_dtype"].toInt());
  return state;
}

// Inputs: the segment's input, its parameters (flattened into the node's
// inputs, so that the graph has an edge to each parameter's AccumulateGrad),
// and the segment itself (not a tensor: a gradient slot that stays empty).
class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input,
                               torch::TensorList parameters,
                               const c10::intrusive_ptr<SegmentHolder>& segment) {
    // Function::apply runs this with grad mode off: nothing inside the
    // segment is recorded, so its activations are freed as it goes.
    // The generators the segment may draw from (dropout): the CPU's, and
    // the input's device's when that is an accelerator, replayed in backward
    // so that the rerun draws the same masks.
    ctx->saved_data["rng"] = GetRngState(c10::Device(c10::kCPU));
    if (!input.device().is_cpu()) {
      ctx->saved_data["device_rng"] = GetRngState(input.device());
    }
    SaveAutocast(ctx, "cpu_autocast", c10::kCPU);
    SaveAutocast(ctx, "cuda_autocast", c10::kCUDA);
    ctx->saved_data["segment"] = c10::IValue::make_capsule(segment);
    // Saving the parameters costs nothing (references to the leaves); the
    // input is the one activation kept.
    variable_list saved = {input};
    saved.insert(saved.end(), parameters.begin(), parameters.end());
    ctx->save_for_backward(saved);
    // Autocast's weight-cast cache stays off here, so that no graph-less
    // low-precision copy of a weight is cached where a later use with grad
    // mode on, in the same autocast region, would pick it up.
    AutocastCacheGuard no_cache(false);
    return segment->fn(input);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    auto segment =
        c10::static_intrusive_pointer_cast<SegmentHolder>(ctx->saved_data["segment"].toCapsule());
    // Inputs of the rerun's graph: a detached copy of the input (so the rerun
    // does not reach the graph before the segment) and the parameters.
    variable_list inputs = saved;
    inputs[0] = saved[0].detach().requires_grad_(true);
    torch::Tensor output;
    {
      RngReplay cpu_rng(c10::Device(c10::kCPU), ctx->saved_data["rng"].toTensor());
      std::optional<RngReplay> device_rng;
      if (!saved[0].device().is_cpu()) {
        device_rng.emplace(saved[0].device(), ctx->saved_data["device_rng"].toTensor());
      }
      AutocastGuard cpu_autocast(c10::kCPU, LoadAutocast(ctx, "cpu_autocast"));
      AutocastGuard cuda_autocast(c10::kCUDA, LoadAutocast(ctx, "cuda_autocast"));
      torch::AutoGradMode grad_mode(true);
      output = segment->fn(inputs[0]);
    }
    // Gradients for every input slot of forward: input, each parameter
    // (undefined where a parameter is unused or needs no gradient), segment.
    variable_list grads(inputs.size() + 1);
    variable_list wanted_inputs;
    std::vector<size_t> wanted_slots;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].requires_grad()) {
        wanted_inputs.push_back(inputs[i]);
        wanted_slots.push_back(i);
      }
    }
    if (output.requires_grad() && !wanted_inputs.empty()) {
      const variable_list computed =
          torch::autograd::grad({output}, wanted_inputs, {grad_outputs[0]},
                                /*retain_graph=*/false, /*create_graph=*/false,
                                /*allow_unused=*/true);
      for (size_t j = 0; j < wanted_slots.size(); ++j) grads[wanted_slots[j]] = computed[j];
    }
    return grads;
  }
};

}  // namespace

torch::Tensor CheckpointedForward(SegmentFunction segment, const torch::Tensor& input,
                                  const std::vector<torch::Tensor>& parameters) {
  bool needs_grad = input.requires_grad();
  for (const torch::Tensor& p : parameters) needs_grad = needs_grad || p.requires_grad();
  if (!torch::GradMode::is_enabled() || !needs_grad) return segment(input);
  auto holder = c10::make_intrusive<SegmentHolder>(std::move(segment));
  return CheckpointFunction::apply(input, torch::TensorList(parameters), holder);
}

int CheckpointSegmentBlocks(int n_layer, int setting) {
  if (setting == 0 || n_layer <= 0) return 0;
  if (setting == kActivationCheckpointingSqrt) {
    return std::max(1, static_cast<int>(std::ceil(std::sqrt(static_cast<double>(n_layer)))));
  }
  TORCH_CHECK(setting >= 1, "activation_checkpointing must be >= -1, got ", setting);
  return std::min(setting, n_layer);
}

}  // namespace loom::engine
