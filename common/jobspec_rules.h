// The field rules that both kinds of job-spec validation share
// (jobspec_validate.h): ranges, the model's shape, the batch sizes and the
// layout's degrees. Each rule checks one part of a spec and returns
// INVALID_ARGUMENT whose message starts with the field path, e.g.
//   model.gpt.n_head: 5 does not divide model.gpt.d_model 768
// Internal to common/: callers use ValidateJobSpec() or ValidatePlanSpec().
//
// Pure functions; thread-safe.
#ifndef LOOM_COMMON_JOBSPEC_RULES_H_
#define LOOM_COMMON_JOBSPEC_RULES_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "loom/v1/job.pb.h"

namespace loom::jobspec_rules {

// Upper bounds of the spec's sizes (docs/jobspec.md, "Ranges"): far beyond
// any model trained today, and small enough that every product the planner,
// the engine and the recovery arithmetic form of them stays inside int64.
inline constexpr int32_t kMaxLayers = 1024;
inline constexpr int32_t kMaxHeads = 1024;
inline constexpr int32_t kMaxWidth = 65536;
inline constexpr int32_t kMaxVocab = 1 << 22;
inline constexpr int32_t kMaxBatch = 1 << 24;
inline constexpr int64_t kMaxSteps = 1000000000;            // schedule, intervals, distances
inline constexpr int64_t kMaxDataBatch = int64_t{1} << 50;  // a data batch index
// Ranks a submitted job may ask for: the gangs Loom's scheduler places.
inline constexpr int32_t kMaxRunRanks = 4096;
// Devices a plan may be asked for: the top of the planner's own device
// sweep (controller/planner/device_sweep.h), 2^17.
inline constexpr int32_t kMaxPlanRanks = 131072;
// scheduling.priority's integers, and the configuration's priority classes.
inline constexpr int64_t kMaxPriority = 1000000;
// scheduling.max_runtime_seconds: a year.
inline constexpr int64_t kMaxRuntimeSeconds = int64_t{366} * 24 * 3600;

// "<path>: <detail>"; "job spec: <detail>" when `path` is empty.
absl::Status FieldError(absl::string_view path, absl::string_view detail);

// "<path>: must be in [lo, hi], got v".
template <typename T>
absl::Status CheckInRange(absl::string_view path, T value, T lo, T hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return FieldError(path, absl::StrCat("must be in [", lo, ", ", hi, "], got ", value));
}

template <typename T>
absl::Status CheckAtLeast(absl::string_view path, T value, T lo) {
  if (value >= lo) return absl::OkStatus();
  return FieldError(path, absl::StrCat("must be >= ", lo, ", got ", value));
}

// 0 means "the default"; anything else must be in [lo, hi].
template <typename T>
absl::Status CheckDefaultOrInRange(absl::string_view path, T value, T lo, T hi) {
  if (value == 0 || (value >= lo && value <= hi)) return absl::OkStatus();
  return FieldError(
      path, absl::StrCat("must be 0 (the default) or in [", lo, ", ", hi, "], got ", value));
}

// [0, 1), for dropout and Adam's betas.
absl::Status CheckUnitOpen(absl::string_view path, double value);

// Every float/double field of `message`, however deep, is finite.
absl::Status CheckFinite(const google::protobuf::Message& message, const std::string& path);

// [a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?, so names work as DNS labels and paths.
bool IsValidJobName(absl::string_view name);
// "name": required when `required`, and when given a valid job name.
absl::Status CheckName(const loom::v1::JobSpec& spec, bool required);

// model.gpt / model.llama: present, sizes in range, heads dividing the width,
// key/value heads dividing the heads, rotary needing an even head width.
absl::Status CheckModel(const loom::v1::ModelSpec& model);

// batch.global_batch in [1, 2^24]; batch.micro_batch in [1, global_batch],
// or 0 under parallelism.auto (the planner picks it). With a pinned layout,
// the layout's dp (parallelism.data, else resources.ranks) x micro_batch
// divides the global batch. Under parallelism.auto nothing involving the
// data-parallel degree is checked here: each layout the planner evaluates
// has its own dp (CostModel::CheckLayout), and it says which do not divide.
absl::Status CheckBatch(const loom::v1::JobSpec& spec);

// resources.workers >= 1, ranks in [workers, max_ranks], threads_per_rank in
// [1, 256], collective_timeout_seconds 0 (300) or in [1, 86400],
// gpus_per_rank 0 or 1.
absl::Status CheckResources(const loom::v1::ResourceSpec& resources, int32_t max_ranks);

// parallelism.*: degrees >= 0; with a pinned layout sequence parallelism
// needs tensor > 1, the interleaving must be allowed (CheckInterleaving) and
// data x tensor x pipeline = resources.ranks; zero_stage in 0..3; a pinned
// tensor degree divides the heads and the MLP width and is at most the
// vocabulary; a pinned pipeline degree is at most the layers. Does not ask
// whether the engine runs the layout (jobspec_validate_run.cc does).
absl::Status CheckParallelism(const loom::v1::JobSpec& spec);

// precision is a defined value; activation_checkpointing in [-1, n_layer].
absl::Status CheckPrecisionAndRecompute(const loom::v1::JobSpec& spec);

}  // namespace loom::jobspec_rules

#endif  // LOOM_COMMON_JOBSPEC_RULES_H_
