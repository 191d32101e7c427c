#include "common/jobspec_rules.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "common/jobspec_model.h"
#include "common/model_shape.h"
#include "common/parallel_layout.h"
#include "common/status_macros.h"
#include "google/protobuf/descriptor.h"

namespace loom::jobspec_rules {

using ::google::protobuf::FieldDescriptor;

absl::Status FieldError(absl::string_view path, absl::string_view detail) {
  return absl::InvalidArgumentError(absl::StrCat(path.empty() ? "job spec" : path, ": ", detail));
}

absl::Status CheckUnitOpen(absl::string_view path, double value) {
  if (value >= 0 && value < 1) return absl::OkStatus();
  return FieldError(path, absl::StrCat("must be in [0, 1), got ", value));
}

absl::Status CheckFinite(const google::protobuf::Message& message, const std::string& path) {
  const google::protobuf::Reflection* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const FieldDescriptor* field : fields) {
    const std::string field_path =
        path.empty() ? field->name() : absl::StrCat(path, ".", field->name());
    const int count = field->is_repeated() ? reflection->FieldSize(message, field) : 1;
    for (int i = 0; i < count; ++i) {
      const std::string element_path =
          field->is_repeated() ? absl::StrCat(field_path, "[", i, "]") : field_path;
      double value = 0;
      switch (field->cpp_type()) {
        case FieldDescriptor::CPPTYPE_DOUBLE:
          value = field->is_repeated() ? reflection->GetRepeatedDouble(message, field, i)
                                       : reflection->GetDouble(message, field);
          break;
        case FieldDescriptor::CPPTYPE_FLOAT:
          value = field->is_repeated() ? reflection->GetRepeatedFloat(message, field, i)
                                       : reflection->GetFloat(message, field);
          break;
        case FieldDescriptor::CPPTYPE_MESSAGE:
          RETURN_IF_ERROR(CheckFinite(field->is_repeated()
                                          ? reflection->GetRepeatedMessage(message, field, i)
                                          : reflection->GetMessage(message, field),
                                      element_path));
          continue;
        default:
          continue;
      }
      if (!std::isfinite(value)) {
        return FieldError(element_path, absl::StrCat("must be finite, got ", value));
      }
    }
  }
  return absl::OkStatus();
}

bool IsValidJobName(absl::string_view name) {
  if (name.empty() || name.size() > 63) return false;
  for (const char c : name) {
    if (!absl::ascii_islower(c) && !absl::ascii_isdigit(c) && c != '-') return false;
  }
  return name.front() != '-' && name.back() != '-';
}

absl::Status CheckName(const loom::v1::JobSpec& spec, bool required) {
  if (spec.name().empty()) {
    return required ? FieldError("name", "required") : absl::OkStatus();
  }
  if (!IsValidJobName(spec.name())) {
    return FieldError("name", absl::StrCat("\"", absl::Utf8SafeCHexEscape(spec.name()),
                                           "\" must be 1-63 characters of [a-z0-9-], "
                                           "starting and ending with a letter or digit"));
  }
  return absl::OkStatus();
}

absl::Status CheckModel(const v1::ModelSpec& model) {
  if (!model.has_gpt() && !model.has_llama()) {
    return FieldError("model", "required: model.gpt (GPT-2 family) or model.llama (Llama family)");
  }
  const std::string at = ModelPath(model);
  const v1::GptModel& gpt = model.has_gpt() ? model.gpt() : model.llama();
  RETURN_IF_ERROR(CheckInRange(at + ".n_layer", gpt.n_layer(), 1, kMaxLayers));
  RETURN_IF_ERROR(CheckInRange(at + ".n_head", gpt.n_head(), 1, kMaxHeads));
  RETURN_IF_ERROR(CheckInRange(at + ".d_model", gpt.d_model(), 1, kMaxWidth));
  if (gpt.d_model() % gpt.n_head() != 0) {
    return FieldError(at + ".n_head", absl::StrCat(gpt.n_head(), " does not divide ", at,
                                                   ".d_model ", gpt.d_model()));
  }
  RETURN_IF_ERROR(CheckInRange(at + ".seq_len", gpt.seq_len(), 1, 65536));
  // Larger than the token shards hold is UNIMPLEMENTED for a run
  // (jobspec_validate_run.cc), so that a plan can take a 128K-token vocabulary.
  RETURN_IF_ERROR(CheckInRange(at + ".vocab_size", gpt.vocab_size(), 1, kMaxVocab));
  RETURN_IF_ERROR(CheckUnitOpen(at + ".dropout", gpt.dropout()));
  // Model family: shape rules here; which shapes the engine runs
  // under which layouts is the run validation's business.
  RETURN_IF_ERROR(CheckInRange(at + ".n_kv_head", gpt.n_kv_head(), 0, gpt.n_head()));
  if (gpt.n_kv_head() > 0 && gpt.n_head() % gpt.n_kv_head() != 0) {
    return FieldError(
        at + ".n_kv_head",
        absl::StrCat(gpt.n_kv_head(), " does not divide ", at, ".n_head ", gpt.n_head(),
                     ": each key/value head serves a whole group of query heads"));
  }
  if (gpt.mlp().has_hidden()) {
    RETURN_IF_ERROR(CheckInRange(at + ".mlp.hidden", gpt.mlp().hidden(), 1, 16 * kMaxWidth));
  }
  if (!v1::GptModel::Norm_IsValid(gpt.norm())) {
    return FieldError(at + ".norm", absl::StrCat("unknown value ", gpt.norm()));
  }
  if (!v1::GptModel::Positions_IsValid(gpt.positions())) {
    return FieldError(at + ".positions", absl::StrCat("unknown value ", gpt.positions()));
  }
  const v1::GptModel effective = EffectiveDecoder(model);
  if (effective.positions() == v1::GptModel::ROTARY && (gpt.d_model() / gpt.n_head()) % 2 != 0) {
    return FieldError(
        at + ".positions",
        absl::StrCat("rotary embeddings rotate pairs of a head's dimensions, and ", at,
                     ".d_model / n_head = ", gpt.d_model() / gpt.n_head(), " is odd"));
  }
  RETURN_IF_ERROR(CheckDefaultOrInRange(at + ".rope_theta", gpt.rope_theta(), 1.0, 1e9));
  RETURN_IF_ERROR(CheckDefaultOrInRange(at + ".norm_eps", gpt.norm_eps(), 1e-12, 0.1));
  return absl::OkStatus();
}

absl::Status CheckBatch(const v1::JobSpec& spec) {
  const v1::BatchSpec& batch = spec.batch();
  const v1::ParallelismSpec& parallelism = spec.parallelism();
  RETURN_IF_ERROR(CheckInRange("batch.global_batch", batch.global_batch(), 1, kMaxBatch));
  if (parallelism.auto_()) {
    // The planner picks the micro-batch when none is given; one that is
    // given must at least fit in the batch. Divisibility by dp x micro_batch
    // is a property of each layout the planner evaluates.
    if (batch.micro_batch() == 0) return absl::OkStatus();
    return CheckInRange("batch.micro_batch", batch.micro_batch(), 1, batch.global_batch());
  }
  RETURN_IF_ERROR(CheckInRange("batch.micro_batch", batch.micro_batch(), 1, batch.global_batch()));
  // Every rank of a replica reads the replica's rows (tensor and pipeline
  // ranks share them): the layout's dp is parallelism.data, or every rank
  // when the layout is pure data parallelism.
  const bool layout =
      parallelism.data() > 0 && (parallelism.tensor() > 1 || parallelism.pipeline() > 1);
  const int64_t replicas = layout ? parallelism.data() : spec.resources().ranks();
  // Each step every replica runs global / (replicas x micro) micro-batches.
  const int64_t per_step = replicas * batch.micro_batch();
  if (per_step > 0 && batch.global_batch() % per_step == 0) return absl::OkStatus();
  return FieldError(
      "batch.global_batch",
      layout ? absl::StrCat(batch.global_batch(), " is not divisible by parallelism.data (",
                            replicas, ") x batch.micro_batch (", batch.micro_batch(), ")")
             : absl::StrCat(batch.global_batch(), " is not divisible by resources.ranks (",
                            replicas, ") x batch.micro_batch (", batch.micro_batch(), ")"));
}

absl::Status CheckResources(const v1::ResourceSpec& resources, int32_t max_ranks) {
  RETURN_IF_ERROR(CheckAtLeast("resources.workers", resources.workers(), 1));
  if (resources.ranks() < resources.workers()) {
    return FieldError("resources.ranks",
                      absl::StrCat(resources.ranks(), " is less than resources.workers (",
                                   resources.workers(), "); every worker needs at least one rank"));
  }
  if (resources.ranks() > max_ranks) {
    return FieldError("resources.ranks",
                      absl::StrCat("must be in [1, ", max_ranks, "], got ", resources.ranks(),
                                   max_ranks == kMaxRunRanks
                                       ? absl::StrCat(": a job's gang is at most ", kMaxRunRanks,
                                                      " ranks (`loomctl plan` plans up to ",
                                                      kMaxPlanRanks, " devices)")
                                       : ": the planner's device sweep stops there"));
  }
  RETURN_IF_ERROR(CheckInRange("resources.ranks", resources.ranks(), 1, max_ranks));
  RETURN_IF_ERROR(CheckInRange("resources.threads_per_rank", resources.threads_per_rank(), 1, 256));
  RETURN_IF_ERROR(CheckDefaultOrInRange("resources.collective_timeout_seconds",
                                        resources.collective_timeout_seconds(), 1.0, 86400.0));
  if (resources.gpus_per_rank() < 0 || resources.gpus_per_rank() > 1) {
    return FieldError("resources.gpus_per_rank",
                      absl::StrCat(resources.gpus_per_rank(),
                                   " is not 0 (CPU) or 1 (one GPU per rank); more GPUs per "
                                   "rank need tensor parallelism, which Loom does not execute "
                                   "yet: use more ranks"));
  }
  return absl::OkStatus();
}

namespace {

// A pinned layout's degrees against the model: what no engine and no plan
// can split.
absl::Status CheckDegreesAgainstModel(const v1::JobSpec& spec) {
  const v1::ParallelismSpec& parallelism = spec.parallelism();
  const v1::GptModel gpt = EffectiveDecoder(spec.model());
  const std::string at = ModelPath(spec.model());
  if (parallelism.tensor() > 1) {
    if (gpt.n_head() % parallelism.tensor() != 0) {
      return FieldError(
          "parallelism.tensor",
          absl::StrCat(parallelism.tensor(), " does not divide ", at, ".n_head (", gpt.n_head(),
                       "): attention heads are split across the tensor group"));
    }
    const ModelShape shape = ModelShapeOf(spec.model());
    if (FfnHidden(shape) % parallelism.tensor() != 0) {
      return FieldError("parallelism.tensor", absl::StrCat(parallelism.tensor(),
                                                           " does not divide the MLP's hidden "
                                                           "width (",
                                                           FfnHidden(shape),
                                                           "): its columns are split "
                                                           "across the tensor group"));
    }
    if (gpt.vocab_size() < parallelism.tensor()) {
      return FieldError("parallelism.tensor", absl::StrCat(parallelism.tensor(), " exceeds ", at,
                                                           ".vocab_size (", gpt.vocab_size(), ")"));
    }
  }
  if (parallelism.pipeline() > 1 && parallelism.pipeline() > gpt.n_layer()) {
    return FieldError("parallelism.pipeline",
                      absl::StrCat(parallelism.pipeline(), " exceeds ", at, ".n_layer (",
                                   gpt.n_layer(), "): every stage needs at least one block"));
  }
  if (parallelism.stage_layers_size() > 0) {
    const int stages = std::max(parallelism.pipeline(), 1);
    if (parallelism.stage_layers_size() != stages) {
      return FieldError("parallelism.stage_layers",
                        absl::StrCat(parallelism.stage_layers_size(), " entries for ", stages,
                                     " pipeline stage(s)"));
    }
    int64_t sum = 0;
    for (int i = 0; i < parallelism.stage_layers_size(); ++i) {
      if (parallelism.stage_layers(i) < 1) {
        return FieldError(absl::StrCat("parallelism.stage_layers[", i, "]"),
                          absl::StrCat("must be >= 1, got ", parallelism.stage_layers(i)));
      }
      sum += parallelism.stage_layers(i);
    }
    if (sum != gpt.n_layer()) {
      return FieldError("parallelism.stage_layers", absl::StrCat("sums to ", sum, ", not ", at,
                                                                 ".n_layer (", gpt.n_layer(), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckParallelism(const v1::JobSpec& spec) {
  const v1::ParallelismSpec& parallelism = spec.parallelism();
  const int32_t ranks = spec.resources().ranks();
  RETURN_IF_ERROR(CheckAtLeast("parallelism.data", parallelism.data(), 0));
  RETURN_IF_ERROR(CheckAtLeast("parallelism.tensor", parallelism.tensor(), 0));
  RETURN_IF_ERROR(CheckAtLeast("parallelism.pipeline", parallelism.pipeline(), 0));
  RETURN_IF_ERROR(CheckAtLeast("parallelism.virtual_stages", parallelism.virtual_stages(), 0));
  if (parallelism.zero_stage() < 0 || parallelism.zero_stage() > 3) {
    return FieldError("parallelism.zero_stage",
                      absl::StrCat(parallelism.zero_stage(), " is not 0, 1, 2 or 3"));
  }
  if (parallelism.auto_()) {
    if (parallelism.stage_layers_size() > 0) {
      return FieldError("parallelism.stage_layers",
                        "needs a pinned layout: the planner chooses the stages under auto");
    }
    return absl::OkStatus();
  }
  if (parallelism.sequence_parallel() && parallelism.tensor() <= 1) {
    return FieldError("parallelism.sequence_parallel",
                      absl::StrCat("needs parallelism.tensor > 1 (it splits activations "
                                   "across the tensor group), got tensor ",
                                   parallelism.tensor()));
  }
  // The planner's rule (common/parallel_layout.h), so plan and submit agree.
  const int64_t replicas_x_micro = int64_t{parallelism.data()} * spec.batch().micro_batch();
  const int64_t micro_batches =
      replicas_x_micro > 0 ? spec.batch().global_batch() / replicas_x_micro : 0;
  if (absl::Status v =
          CheckInterleaving(EffectiveDecoder(spec.model()).n_layer(), parallelism.pipeline(),
                            parallelism.virtual_stages(), micro_batches);
      !v.ok()) {
    return FieldError("parallelism.virtual_stages", v.message());
  }
  if (parallelism.data() > 0) {
    const int64_t tensor = std::max(parallelism.tensor(), 1);
    const int64_t pipeline = std::max(parallelism.pipeline(), 1);
    const int64_t product = parallelism.data() * tensor * pipeline;
    if (product != ranks) {
      if (tensor == 1 && pipeline == 1) {
        return FieldError(
            "parallelism.data",
            absl::StrCat(parallelism.data(), " does not equal resources.ranks (", ranks, ")"));
      }
      return FieldError(
          "parallelism.data",
          absl::StrCat(parallelism.data(), " x tensor (", tensor, ") x pipeline (", pipeline,
                       ") = ", product, " does not equal resources.ranks (", ranks, ")"));
    }
  }
  return CheckDegreesAgainstModel(spec);
}

absl::Status CheckPrecisionAndRecompute(const v1::JobSpec& spec) {
  if (!v1::Precision_IsValid(spec.precision())) {
    return FieldError("precision", absl::StrCat("unknown value ", spec.precision()));
  }
  if (spec.activation_checkpointing() < -1) {
    return FieldError("activation_checkpointing",
                      absl::StrCat("must be 0 (off), k >= 1 (every k-th block) or -1 "
                                   "(every ceil(sqrt(n_layer))-th block), got ",
                                   spec.activation_checkpointing()));
  }
  const int32_t n_layer = EffectiveDecoder(spec.model()).n_layer();
  if (spec.activation_checkpointing() > n_layer) {
    return FieldError("activation_checkpointing",
                      absl::StrCat("every k-th block with k = ", spec.activation_checkpointing(),
                                   " > ", ModelPath(spec.model()), ".n_layer (", n_layer,
                                   ") checkpoints nothing; use 0 for off"));
  }
  return absl::OkStatus();
}

}  // namespace loom::jobspec_rules
