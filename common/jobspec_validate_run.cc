// ValidateJobSpec(): what a submitted job needs (jobspec_validate.h).
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/jobspec_model.h"
#include "common/jobspec_rules.h"
#include "common/jobspec_validate.h"
#include "common/model_shape.h"
#include "common/object_store/s3_config.h"
#include "common/status_macros.h"

namespace loom {

using jobspec_rules::CheckAtLeast;
using jobspec_rules::CheckBatch;
using jobspec_rules::CheckDefaultOrInRange;
using jobspec_rules::CheckFinite;
using jobspec_rules::CheckInRange;
using jobspec_rules::CheckModel;
using jobspec_rules::CheckName;
using jobspec_rules::CheckParallelism;
using jobspec_rules::CheckPrecisionAndRecompute;
using jobspec_rules::CheckResources;
using jobspec_rules::CheckUnitOpen;
using jobspec_rules::FieldError;
using jobspec_rules::IsValidJobName;
using jobspec_rules::kMaxDataBatch;
using jobspec_rules::kMaxRunRanks;
using jobspec_rules::kMaxPriority;
using jobspec_rules::kMaxRuntimeSeconds;
using jobspec_rules::kMaxSteps;

namespace {

absl::Status ValidateData(const v1::DataSpec& data) {
  if (data.train_size() == 0) {
    return FieldError("data.train", "at least one shard is required");
  }
  for (int i = 0; i < data.train_size(); ++i) {
    if (data.train(i).empty()) {
      return FieldError(absl::StrCat("data.train[", i, "]"), "empty path");
    }
  }
  for (int i = 0; i < data.validation_size(); ++i) {
    if (data.validation(i).empty()) {
      return FieldError(absl::StrCat("data.validation[", i, "]"), "empty path");
    }
  }
  if (data.has_prefetch_depth()) {
    RETURN_IF_ERROR(CheckInRange("data.prefetch_depth", data.prefetch_depth(), 0, 64));
  }
  return absl::OkStatus();
}

absl::Status ValidateOptimizer(const v1::OptimizerSpec& optimizer) {
  if (!optimizer.has_adamw()) {
    return FieldError("optimizer.adamw", "required (the only optimizer so far)");
  }
  const v1::AdamW& adamw = optimizer.adamw();
  if (!(adamw.lr() > 0 && adamw.lr() <= 1)) {
    return FieldError("optimizer.adamw.lr", absl::StrCat("must be in (0, 1], got ", adamw.lr()));
  }
  RETURN_IF_ERROR(CheckUnitOpen("optimizer.adamw.beta1", adamw.beta1()));
  RETURN_IF_ERROR(CheckUnitOpen("optimizer.adamw.beta2", adamw.beta2()));
  if (!(adamw.eps() > 0)) {
    return FieldError("optimizer.adamw.eps", absl::StrCat("must be > 0, got ", adamw.eps()));
  }
  RETURN_IF_ERROR(CheckAtLeast("optimizer.adamw.weight_decay", adamw.weight_decay(), 0.0));
  return CheckAtLeast("optimizer.adamw.grad_clip", adamw.grad_clip(), 0.0);
}

absl::Status ValidateSchedule(const v1::ScheduleSpec& schedule) {
  RETURN_IF_ERROR(
      CheckInRange<int64_t>("schedule.total_steps", schedule.total_steps(), 1, kMaxSteps));
  if (schedule.warmup_steps() < 0 || schedule.warmup_steps() >= schedule.total_steps()) {
    return FieldError("schedule.warmup_steps",
                      absl::StrCat("must be in [0, schedule.total_steps ", schedule.total_steps(),
                                   "), got ", schedule.warmup_steps()));
  }
  RETURN_IF_ERROR(CheckInRange("schedule.min_lr_ratio", schedule.min_lr_ratio(), 0.0, 1.0));
  RETURN_IF_ERROR(
      CheckInRange<int64_t>("schedule.eval_interval", schedule.eval_interval(), 0, kMaxSteps));
  RETURN_IF_ERROR(
      CheckInRange<int64_t>("schedule.eval_batches", schedule.eval_batches(), 1, 1000000));
  return CheckInRange<int64_t>("schedule.log_interval", schedule.log_interval(), 1, kMaxSteps);
}

// checkpoint.retention.<tier>.
absl::Status ValidateRetention(const std::string& field, const v1::RetentionPolicy& policy,
                               const v1::JobSpec& spec) {
  if (policy.all()) {
    if (policy.newest() != 0 || policy.every() != 0 || policy.best() != 0) {
      return FieldError(field + ".all",
                        "keeps every checkpoint: give it alone, or newest/every/best without it");
    }
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(CheckInRange(field + ".newest", policy.newest(), 1, 100000));
  RETURN_IF_ERROR(CheckInRange<int64_t>(field + ".every", policy.every(), 0, kMaxSteps));
  RETURN_IF_ERROR(CheckInRange(field + ".best", policy.best(), 0, 100000));
  const int64_t interval = spec.checkpoint().interval_steps();
  if (policy.every() > 0 && interval > 0 && policy.every() % interval != 0) {
    return FieldError(
        field + ".every",
        absl::StrCat(policy.every(), " is not a multiple of checkpoint.interval_steps (", interval,
                     "), so only the checkpoints at multiples of both "
                     "would be kept: use a multiple of ",
                     interval));
  }
  if (policy.best() > 0 &&
      (spec.data().validation_size() == 0 || spec.schedule().eval_interval() <= 0)) {
    return FieldError(field + ".best",
                      "ranks checkpoints by validation loss, which needs data.validation and "
                      "schedule.eval_interval > 0 (a validation pass during training)");
  }
  return absl::OkStatus();
}

absl::Status ValidateCheckpoint(const v1::JobSpec& spec) {
  const v1::CheckpointSpec& checkpoint = spec.checkpoint();
  RETURN_IF_ERROR(CheckInRange<int64_t>("checkpoint.interval_steps", checkpoint.interval_steps(), 0,
                                        kMaxSteps));
  RETURN_IF_ERROR(CheckInRange("checkpoint.keep", checkpoint.keep(), 1, 100000));
  if (!checkpoint.remote().empty()) {
    absl::StatusOr<object_store::S3Location> remote = object_store::ParseS3Url(checkpoint.remote());
    if (!remote.ok()) return FieldError("checkpoint.remote", remote.status().message());
  }
  const v1::CheckpointRetention& retention = checkpoint.retention();
  RETURN_IF_ERROR(ValidateRetention("checkpoint.retention.local", retention.local(), spec));
  if (!retention.local().all() && checkpoint.keep() != retention.local().newest()) {
    return FieldError("checkpoint.keep",
                      absl::StrCat(checkpoint.keep(), " and checkpoint.retention.local.newest ",
                                   retention.local().newest(),
                                   " disagree: give one (keep is the older name of newest)"));
  }
  if (retention.has_remote() && checkpoint.remote().empty()) {
    return FieldError(
        "checkpoint.retention.remote",
        "the job has no object-store tier: set checkpoint.remote (s3://bucket/prefix)");
  }
  if (retention.has_remote()) {
    RETURN_IF_ERROR(ValidateRetention("checkpoint.retention.remote", retention.remote(), spec));
  }
  const v1::MemorySnapshotSpec& snapshots = checkpoint.snapshots();
  RETURN_IF_ERROR(CheckInRange<int64_t>("checkpoint.snapshots.interval_steps",
                                        snapshots.interval_steps(), 0, kMaxSteps));
  RETURN_IF_ERROR(CheckInRange<int64_t>("checkpoint.snapshots.max_bytes", snapshots.max_bytes(), 0,
                                        std::numeric_limits<int64_t>::max()));
  if (snapshots.disable() && (snapshots.interval_steps() > 0 || snapshots.max_bytes() > 0)) {
    return FieldError("checkpoint.snapshots.disable",
                      "snapshots are off: leave out interval_steps and max_bytes, or disable");
  }
  return absl::OkStatus();
}

// recovery.slow_rank.
absl::Status ValidateSlowRank(const v1::SlowRankSpec& s) {
  const std::string& action = s.action();
  if (!action.empty() && action != "report" && action != "cordon" && action != "replan") {
    return FieldError(
        "recovery.slow_rank.action",
        absl::StrCat("\"", action, "\" is not one of \"report\", \"cordon\", \"replan\""));
  }
  RETURN_IF_ERROR(
      CheckDefaultOrInRange("recovery.slow_rank.min_slowdown", s.min_slowdown(), 1.1, 1000.0));
  RETURN_IF_ERROR(CheckDefaultOrInRange("recovery.slow_rank.threshold", s.threshold(), 1.0, 1e6));
  RETURN_IF_ERROR(
      CheckDefaultOrInRange("recovery.slow_rank.confirm_reports", s.confirm_reports(), 1, 64));
  const int32_t confirm = s.confirm_reports() > 0 ? s.confirm_reports() : 4;
  RETURN_IF_ERROR(CheckDefaultOrInRange("recovery.slow_rank.window", s.window(), confirm, 4096));
  RETURN_IF_ERROR(CheckDefaultOrInRange("recovery.slow_rank.confirm_seconds", s.confirm_seconds(),
                                        0.001, 3600.0));
  return CheckDefaultOrInRange<int64_t>("recovery.slow_rank.cordon_seconds", s.cordon_seconds(), 1,
                                        7 * 24 * 3600);
}

absl::Status ValidateRecovery(const v1::RecoverySpec& r) {
  if (r.has_max_restarts()) {
    RETURN_IF_ERROR(CheckInRange("recovery.max_restarts", r.max_restarts(), 0, 10000));
  }
  if (r.has_max_rollbacks()) {
    RETURN_IF_ERROR(CheckInRange("recovery.max_rollbacks", r.max_rollbacks(), 0, 10000));
  }
  RETURN_IF_ERROR(CheckDefaultOrInRange("recovery.window", r.window(), 8, 100000));
  const int32_t window = r.window() > 0 ? r.window() : 128;
  RETURN_IF_ERROR(CheckDefaultOrInRange("recovery.min_history", r.min_history(), 1, window));
  RETURN_IF_ERROR(CheckDefaultOrInRange("recovery.confirm_steps", r.confirm_steps(), 1, window));
  RETURN_IF_ERROR(CheckDefaultOrInRange("recovery.threshold", r.threshold(), 1.0, 1e6));
  RETURN_IF_ERROR(CheckDefaultOrInRange<int64_t>("recovery.rollback_distance",
                                                 r.rollback_distance(), 1, kMaxSteps));
  RETURN_IF_ERROR(
      CheckDefaultOrInRange<int64_t>("recovery.skip_before", r.skip_before(), 1, kMaxSteps));
  RETURN_IF_ERROR(
      CheckDefaultOrInRange<int64_t>("recovery.skip_after", r.skip_after(), 1, kMaxSteps));
  return ValidateSlowRank(r.slow_rank());
}

// init_from: a job (and step) or a path; a job's own name is not a source.
absl::Status ValidateInitFrom(const v1::JobSpec& spec) {
  if (!spec.has_init_from()) return absl::OkStatus();
  const v1::InitFrom& from = spec.init_from();
  if (from.job().empty() && from.path().empty()) {
    return FieldError("init_from", "give job (and step) or path");
  }
  if (!from.job().empty()) {
    // A job id is "<name>-<n>".
    const size_t dash = from.job().rfind('-');
    int64_t n = 0;
    if (dash == std::string::npos || dash == 0 || !IsValidJobName(from.job().substr(0, dash)) ||
        !absl::SimpleAtoi(from.job().substr(dash + 1), &n) || n < 1) {
      return FieldError("init_from.job",
                        absl::StrCat("\"", absl::Utf8SafeCHexEscape(from.job()),
                                     "\" is not a job id (NAME-N, as loomctl list shows)"));
    }
  }
  RETURN_IF_ERROR(CheckInRange<int64_t>("init_from.step", from.step(), 0, kMaxSteps));
  if (from.job().empty() && from.step() != 0) {
    return FieldError("init_from.step", "goes with init_from.job; a path names its step");
  }
  if (absl::StartsWith(from.path(), "s3://")) {
    object_store::S3Location unused;
    absl::StatusOr<int64_t> step = object_store::ParseCheckpointUrl(from.path(), &unused);
    if (!step.ok()) return FieldError("init_from.path", step.status().message());
    return absl::OkStatus();
  }
  if (!from.path().empty() && from.path()[0] != '/') {
    return FieldError("init_from.path",
                      absl::StrCat("\"", absl::Utf8SafeCHexEscape(from.path()),
                                   "\" must be absolute (or relative to the spec file)"));
  }
  return absl::OkStatus();
}

// Valid specs that ask for what Loom cannot run yet (UNIMPLEMENTED; the
// engine's rules: worker/engine/parallel/layout_engine.h). The planner plans
// all of them (ValidatePlanSpec).
absl::Status ValidateSupported(const v1::JobSpec& spec) {
  const v1::ParallelismSpec& parallelism = spec.parallelism();
  const v1::GptModel gpt = EffectiveDecoder(spec.model());
  const std::string at = ModelPath(spec.model());
  // Token shards store ids as uint16 (llm.c's format).
  if (gpt.vocab_size() > 65536) {
    return absl::UnimplementedError(
        absl::StrCat(at, ".vocab_size: ", gpt.vocab_size(),
                     " tokens do not fit the token shards' 16-bit ids, so jobs "
                     "train vocabularies of at most "
                     "65536; `loomctl plan` plans larger ones"));
  }
  if (parallelism.zero_stage() == 3) {
    return absl::UnimplementedError(
        "parallelism.zero_stage: ZeRO-3 (parameters sharded too) is planned "
        "but not executable "
        "yet; stages 0, 1 (optimizer state sharded over the data-parallel "
        "group) and 2 "
        "(gradients too) run");
  }
  if (parallelism.sequence_parallel()) {
    return absl::UnimplementedError(
        "parallelism.sequence_parallel: sequence "
        "parallelism is planned but not executable "
        "yet (tensor parallelism runs without it); "
        "`loomctl plan` evaluates it");
  }
  if (parallelism.virtual_stages() > 1) {
    return absl::UnimplementedError(
        absl::StrCat("parallelism.virtual_stages: interleaved 1F1B (", parallelism.virtual_stages(),
                     " chunks per pipeline rank) is planned but not executable yet; "
                     "pipelines run plain "
                     "1F1B (virtual_stages 0 or 1); `loomctl plan` evaluates it"));
  }
  if (parallelism.tensor() > 1) {
    const int64_t kv = KvHeads(ModelShapeOf(spec.model()));
    if (kv % parallelism.tensor() != 0 && parallelism.tensor() % kv != 0) {
      return absl::UnimplementedError(absl::StrCat(
          "parallelism.tensor: ", parallelism.tensor(), " and the ", kv, " key/value heads of ", at,
          " (n_kv_head) must divide one another: the heads are "
          "split across the tensor group, or each copied to "
          "tensor / n_kv_head ranks when "
          "there are fewer heads than ranks; otherwise a rank's "
          "query heads would use parts "
          "of two key/value heads"));
    }
    if (gpt.dropout() != 0) {
      return absl::UnimplementedError(
          absl::StrCat(at, ".dropout: dropout (", gpt.dropout(),
                       ") under tensor parallelism is not executable yet; set "
                       "it to 0, or use "
                       "parallelism.tensor: 1"));
    }
  }
  const bool layout =
      parallelism.tensor() > 1 || parallelism.pipeline() > 1 || parallelism.zero_stage() > 0;
  if (layout && spec.resources().gpus_per_rank() > 0) {
    return absl::UnimplementedError(
        "resources.gpus_per_rank: tensor, pipeline "
        "and ZeRO layouts run on CPU ranks in this "
        "version; GPU ranks run data parallelism");
  }
  // BF16 runs on the CPU workers (autocast, fp32 master weights); FP16
  // needs dynamic loss scaling and GPU workers, which Loom has not yet.
  if (spec.precision() == v1::FP16) {
    return absl::UnimplementedError(
        "precision: FP16 is planned but not executable yet: it needs GPU "
        "workers (fp16 with dynamic loss scaling); use BF16 or FP32");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateSkipBatches(const google::protobuf::RepeatedPtrField<v1::SkipRange>& ranges,
                                 absl::string_view path) {
  if (ranges.size() > 10000) {
    return FieldError(path, absl::StrCat(ranges.size(), " ranges; at most 10000"));
  }
  for (int i = 0; i < ranges.size(); ++i) {
    const v1::SkipRange& r = ranges[i];
    const std::string at = absl::StrCat(path, "[", i, "]");
    RETURN_IF_ERROR(CheckInRange<int64_t>(at + ".begin", r.begin(), 0, kMaxDataBatch));
    RETURN_IF_ERROR(CheckInRange<int64_t>(at + ".end", r.end(), 0, kMaxDataBatch));
    if (r.end() <= r.begin()) {
      return FieldError(at, absl::StrCat("[", r.begin(), ", ", r.end(),
                                         ") is empty or reversed: end must be > begin"));
    }
  }
  return absl::OkStatus();
}

namespace {

// scheduling: the queue a name, the priority an integer in range or a
// class name (resolved against the controller's configuration at submit),
// max_runtime_seconds in [0, one year].
absl::Status ValidateScheduling(const v1::SchedulingSpec& scheduling) {
  if (!scheduling.queue().empty() && !IsValidJobName(scheduling.queue())) {
    return FieldError("scheduling.queue",
                      absl::StrCat("\"", absl::Utf8SafeCHexEscape(scheduling.queue()),
                                   "\" must be 1-63 characters of [a-z0-9-], starting and "
                                   "ending with a letter or digit"));
  }
  const std::string& priority = scheduling.priority();
  int64_t value = 0;
  if (!priority.empty() && absl::SimpleAtoi(priority, &value)) {
    RETURN_IF_ERROR(CheckInRange<int64_t>("scheduling.priority", value, -kMaxPriority,
                                          kMaxPriority));
  } else if (!priority.empty() && !IsValidJobName(priority)) {
    return FieldError("scheduling.priority",
                      absl::StrCat("\"", absl::Utf8SafeCHexEscape(priority),
                                   "\" is neither an integer nor a priority class name "
                                   "(1-63 characters of [a-z0-9-])"));
  }
  return CheckInRange<int64_t>("scheduling.max_runtime_seconds",
                               scheduling.max_runtime_seconds(), 0, kMaxRuntimeSeconds);
}

// elastic: min_ranks <= resources.ranks <= max_ranks <= kMaxRunRanks.
absl::Status ValidateElastic(const v1::JobSpec& spec) {
  if (!spec.has_elastic()) return absl::OkStatus();
  const v1::ElasticSpec& e = spec.elastic();
  const int32_t ranks = spec.resources().ranks();
  if (e.min_ranks() < 1 || e.min_ranks() > ranks) {
    return FieldError("elastic.min_ranks", absl::StrCat("must be in [1, resources.ranks = ", ranks,
                                                        "], got ", e.min_ranks()));
  }
  if (e.max_ranks() < ranks || e.max_ranks() > kMaxRunRanks) {
    return FieldError("elastic.max_ranks",
                      absl::StrCat("must be in [resources.ranks = ", ranks, ", ", kMaxRunRanks,
                                   "], got ", e.max_ranks()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  RETURN_IF_ERROR(CheckFinite(spec, ""));
  RETURN_IF_ERROR(CheckName(spec, /*required=*/true));
  RETURN_IF_ERROR(CheckModel(spec.model()));
  RETURN_IF_ERROR(ValidateData(spec.data()));
  RETURN_IF_ERROR(ValidateOptimizer(spec.optimizer()));
  RETURN_IF_ERROR(ValidateSchedule(spec.schedule()));
  RETURN_IF_ERROR(CheckResources(spec.resources(), kMaxRunRanks));
  RETURN_IF_ERROR(CheckBatch(spec));
  RETURN_IF_ERROR(CheckParallelism(spec));
  RETURN_IF_ERROR(CheckPrecisionAndRecompute(spec));
  RETURN_IF_ERROR(ValidateCheckpoint(spec));
  RETURN_IF_ERROR(ValidateRecovery(spec.recovery()));
  RETURN_IF_ERROR(ValidateSkipBatches(spec.skip_batches(), "skip_batches"));
  RETURN_IF_ERROR(ValidateInitFrom(spec));
  RETURN_IF_ERROR(ValidateScheduling(spec.scheduling()));
  RETURN_IF_ERROR(ValidateElastic(spec));
  return ValidateSupported(spec);
}

}  // namespace loom
