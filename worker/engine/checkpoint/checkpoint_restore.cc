// Restoring a checkpoint's bytes into a module and its optimizer (checkpoint.h).
#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <torch/optim/adamw.h>
#include <torch/serialize/input-archive.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "common/formats/checkpoint_legacy.h"
#include "worker/engine/optimizer_state_key.h"

namespace loom::engine {
namespace {

// ---------------------------------------------------------------------------
// Versions 1 and 2: one torch::serialize archive (checkpoint_legacy.h).

constexpr char kFormatV2[] = "loom-checkpoint-v2";
constexpr char kFormatV1[] = "loom-checkpoint-v1";

// The archive holds the model and optimizer as nested archives
// (Module::save / Optimizer::save) beside the loop state.
absl::Status RestoreLegacy(absl::string_view bytes, const CheckpointShape& expected,
                     torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                     TrainingState* state) {
  torch::serialize::InputArchive root;
  root.load_from(bytes.data(), bytes.size());
  c10::IValue value;
  root.read("format", value);
  const bool v1 = value.toStringRef() == kFormatV1;
  if (!v1 && value.toStringRef() != kFormatV2) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint format ", value.toStringRef(), ", expected ", kFormatV2));
  }
#if TORCH_VERSION_MAJOR >= 2
  // These formats hold torch::optim's own archive, whose state keys
  // LibTorch 1.13 wrote as "0x..." address strings and 2.x reads as decimal
  // numbers: every parameter's state would land on one key. Refused before
  // anything is restored.
  return absl::FailedPreconditionError(absl::StrCat(
      "checkpoint format ", value.toStringRef(), " holds LibTorch 1.13's optimizer archive, which "
      "LibTorch ", TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR,
      " cannot read back; resume it with a LibTorch 1.13 build of Loom, or start a new job"));
#endif
  root.read("model_config", value);
  if (value.toStringRef() != expected.model) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint is for model ", value.toStringRef(), ", config says ", expected.model));
  }
  root.read("step", value);
  state->step = value.toInt();
  if (v1) {
    root.read("data_cursor", value);
    if (value.toInt() % expected.global_batch != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint's data cursor ", value.toInt(),
                       " is not a multiple of global_batch ", expected.global_batch));
    }
    state->next_data_batch = value.toInt() / expected.global_batch;
    state->generation = 0;
    state->lineage = {{0, 0}};
    state->skip_batches.clear();
  } else {
    root.read("global_batch", value);
    if (value.toInt() != expected.global_batch) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint was written with global_batch ", value.toInt(),
                       ", config says ", expected.global_batch,
                       "; data batch indices would not line up"));
    }
    root.read("next_data_batch", value);
    state->next_data_batch = value.toInt();
    root.read("skip_batches", value);
    const std::vector<int64_t> ranges = value.toIntVector();
    state->skip_batches.clear();
    for (size_t i = 0; i + 1 < ranges.size(); i += 2) {
      state->skip_batches.push_back({ranges[i], ranges[i + 1]});
    }
    root.read("generation", value);
    state->generation = value.toInt();
    root.read("lineage", value);
    const std::vector<int64_t> lineage = value.toIntVector();
    state->lineage.clear();
    for (size_t i = 0; i + 1 < lineage.size(); i += 2) {
      state->lineage.emplace_back(lineage[i], lineage[i + 1]);
    }
    torch::Tensor generator_state;
    root.read("cpu_generator_state", generator_state, /*is_buffer=*/true);
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(generator_state);
  }
  root.read("loss", value);
  state->loss = value.toDouble();
  root.read("has_val_loss", value);
  state->has_val_loss = value.toBool();
  root.read("val_loss", value);
  state->val_loss = value.toDouble();
  torch::serialize::InputArchive model_archive;
  root.read("model", model_archive);
  module.load(model_archive);
  torch::serialize::InputArchive optimizer_archive;
  root.read("optimizer", optimizer_archive);
  optimizer.load(optimizer_archive);
  return absl::OkStatus();
}


// ---------------------------------------------------------------------------
// Restore.

// A copy of a shard tensor's bytes as a tensor shaped like `like`.
class ShardTensors {
 public:
  explicit ShardTensors(const ShardView& shard) : shard_(shard) {
    for (size_t i = 0; i < shard.header.tensors.size(); ++i) {
      index_[shard.header.tensors[i].name] = i;
    }
  }

  bool Has(const std::string& name) const { return index_.count(name) > 0; }

  // A tensor viewing the shard's bytes (valid while the shard's bytes are);
  // FAILED_PRECONDITION if missing or of another dtype or shape than `like`.
  absl::StatusOr<torch::Tensor> View(const std::string& name, const torch::Tensor& like) const {
    auto it = index_.find(name);
    if (it == index_.end()) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint has no tensor ", name));
    }
    const ShardTensor& t = shard_.header.tensors[it->second];
    if (t.dtype != like.scalar_type() || t.shape != like.sizes().vec()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint tensor ", name, " is ", c10::toString(t.dtype), " [",
          absl::StrJoin(t.shape, ","), "], the model's ", c10::toString(like.scalar_type()), " [",
          absl::StrJoin(like.sizes().vec(), ","), "]"));
    }
    void* data = const_cast<char*>(shard_.data[it->second].data());
    return torch::from_blob(data, t.shape, torch::TensorOptions().dtype(t.dtype));
  }

 private:
  const ShardView& shard_;
  std::unordered_map<std::string, size_t> index_;
};

absl::Status RestoreShard(const ShardView& shard, const CheckpointShape& expected,
                          torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                          TrainingState* state) {
  const ShardHeader& h = shard.header;
  if (h.shape.model != expected.model) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint is for model ", h.shape.model,
                                                      ", config says ", expected.model));
  }
  if (h.shape.global_batch != expected.global_batch) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint was written with global_batch ", h.shape.global_batch,
                     ", config says ", expected.global_batch,
                     "; data batch indices would not line up"));
  }
  const ShardTensors tensors(shard);
  torch::NoGradGuard no_grad;

  // Weights (in place, so the optimizer's references stay valid).
  size_t in_checkpoint = 0, restored = 0;
  for (const ShardTensor& t : h.tensors) in_checkpoint += absl::StartsWith(t.name, "model/");
  std::unordered_map<const void*, std::string> names;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    torch::Tensor p = item.value();
    ASSIGN_OR_RETURN(torch::Tensor saved, tensors.View("model/" + item.key(), p));
    p.copy_(saved);
    names[p.unsafeGetTensorImpl()] = item.key();
    ++restored;
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    torch::Tensor b = item.value();
    ASSIGN_OR_RETURN(torch::Tensor saved, tensors.View("model/" + item.key(), b));
    b.copy_(saved);
    ++restored;
  }
  if (restored != in_checkpoint) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint holds ", in_checkpoint, " model tensors, the model ", restored));
  }

  // AdamW state, matched by parameter name within each group.
  std::vector<torch::optim::OptimizerParamGroup>& groups = optimizer.param_groups();
  if (groups.size() != h.optimizer_groups.size()) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint has ", h.optimizer_groups.size(),
                                                      " optimizer groups, the optimizer ",
                                                      groups.size()));
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    const ShardOptimizerGroup& saved = h.optimizer_groups[g];
    auto* options = dynamic_cast<torch::optim::AdamWOptions*>(&groups[g].options());
    if (options == nullptr) {
      return absl::FailedPreconditionError("checkpoints hold AdamW state; the optimizer is not AdamW");
    }
    const std::vector<torch::Tensor>& params = groups[g].params();
    if (params.size() != saved.params.size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "optimizer group ", g, " has ", params.size(), " parameters, the checkpoint's ",
          saved.params.size()));
    }
    options->lr(saved.lr).betas(std::make_tuple(saved.beta1, saved.beta2)).eps(saved.eps);
    options->weight_decay(saved.weight_decay).amsgrad(saved.amsgrad);
    for (size_t i = 0; i < params.size(); ++i) {
      auto name = names.find(params[i].unsafeGetTensorImpl());
      if (name == names.end() || name->second != saved.params[i]) {
        return absl::FailedPreconditionError(absl::StrCat(
            "optimizer group ", g, " parameter ", i, " is ",
            name == names.end() ? std::string("not a model parameter") : name->second,
            ", the checkpoint's ", saved.params[i]));
      }
      const OptimizerStateKey key = StateKeyOf(params[i]);
      if (saved.steps[i] < 0) {
        optimizer.state().erase(key);
        continue;
      }
      const std::string prefix = absl::StrCat("optimizer/", saved.params[i], "/");
      auto adam = std::make_unique<torch::optim::AdamWParamState>();
      adam->step(saved.steps[i]);
      ASSIGN_OR_RETURN(torch::Tensor exp_avg, tensors.View(prefix + "exp_avg", params[i]));
      ASSIGN_OR_RETURN(torch::Tensor exp_avg_sq, tensors.View(prefix + "exp_avg_sq", params[i]));
      adam->exp_avg(exp_avg.clone());
      adam->exp_avg_sq(exp_avg_sq.clone());
      if (tensors.Has(prefix + "max_exp_avg_sq")) {
        ASSIGN_OR_RETURN(torch::Tensor max_sq, tensors.View(prefix + "max_exp_avg_sq", params[i]));
        adam->max_exp_avg_sq(max_sq.clone());
      }
      optimizer.state()[key] = std::move(adam);
    }
  }

  // torch's default CPU generator.
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    const torch::Tensor current = generator.get_state();
    ASSIGN_OR_RETURN(torch::Tensor saved, tensors.View("rng/cpu", current));
    generator.set_state(saved.clone());
  }
  *state = h.state;
  return absl::OkStatus();
}


}  // namespace

absl::Status RestoreCheckpoint(absl::string_view bytes, const CheckpointShape& expected,
                               torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                               TrainingState* state) {
  try {
    if (!IsShard(bytes)) {
      return RestoreLegacy(bytes, expected, module, optimizer, state);
    }
    ASSIGN_OR_RETURN(ShardView shard, ParseShard(bytes));
    return RestoreShard(shard, expected, module, optimizer, state);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("restoring the checkpoint: ", e.what()));
  }
}


}  // namespace loom::engine
