// The two validations of a job spec, over shared field rules
// (jobspec_rules.h):
//   ValidateJobSpec()   what a run needs: every field a submitted job uses,
//                       and whether Loom executes it (jobspec_validate_run.cc);
//   ValidatePlanSpec()  what a plan needs: the model, the batch, the devices
//                       and any layout pinned (jobspec_validate_plan.cc).
// Both take a spec after ApplyJobSpecDefaults() and answer INVALID_ARGUMENT
// with the field path first. Thread-safe.
#ifndef LOOM_COMMON_JOBSPEC_VALIDATE_H_
#define LOOM_COMMON_JOBSPEC_VALIDATE_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "loom/v1/job.pb.h"

namespace loom {

// What a run needs: checks a spec after ApplyJobSpecDefaults() for submit
// (and `loomctl validate`). Returns OK, or the first problem found, checked
// in this order: non-finite floating-point values anywhere, name, model,
// data, optimizer, schedule, resources (ranks up to 4,096), batch,
// parallelism, precision and activation_checkpointing, checkpoint, recovery,
// skip_batches, init_from (all INVALID_ARGUMENT), then the features that a
// valid spec may ask for but Loom cannot run yet (UNIMPLEMENTED): ZeRO-3,
// sequence parallelism, interleaved pipelines (virtual_stages > 1), dropout
// under tensor parallelism, tensor/pipeline/ZeRO layouts on GPU ranks,
// key/value heads a tensor degree cannot split or copy, vocabularies over
// the token shards' 65,536 ids, and FP16 precision (it needs GPU workers).
// Tensor and pipeline parallelism and ZeRO 0-2 execute; a degree the model
// cannot be split into (tensor not dividing the heads or the MLP width,
// pipeline above the layers) is INVALID_ARGUMENT. Under parallelism.auto the
// micro-batch may be 0 (the planner picks it) and no divisibility involving
// the data-parallel degree is checked here: the planner checks it per
// layout. Ranges (docs/jobspec.md): model.gpt.n_layer and n_head in
// [1, 1024], d_model and seq_len in [1, 65536], vocab_size in [1, 2^22],
// n_kv_head in [0, n_head], mlp.hidden in [1, 2^20]; schedule.total_steps in
// [1, 1e9], eval_interval and log_interval up to 1e9, eval_batches in
// [1, 1e6]; batch.global_batch in [1, 2^24], micro_batch in [1, global_batch];
// resources.ranks in [workers, 4096]; activation_checkpointing in
// [-1, n_layer]; checkpoint.interval_steps in [0, 1e9], keep in [1, 1e5];
// recovery.max_restarts and max_rollbacks in [0, 1e4], and (0 = the default)
// window in [8, 1e5], min_history and confirm_steps in [1, window], threshold
// in [1, 1e6], rollback_distance, skip_before and skip_after in [1, 1e9];
// skip_batches as ValidateSkipBatches. So no arithmetic on a valid spec
// overflows. The message starts with the field path, e.g.
//   model.gpt.n_head: 5 does not divide model.gpt.d_model 768
// Does not touch the filesystem: whether data paths exist is checked when the
// job is planned.
absl::Status ValidateJobSpec(const loom::v1::JobSpec& spec);

// Data batch ranges [begin, end) to skip, as in JobSpec.skip_batches and
// RollbackJob: each non-empty, 0 <= begin < end <= 2^50, at most 10000.
// INVALID_ARGUMENT naming `path`[i] otherwise.
absl::Status ValidateSkipBatches(
    const google::protobuf::RepeatedPtrField<loom::v1::SkipRange>& ranges,
    absl::string_view path);

// What a plan needs (`loomctl plan`, the Plan RPC): checks a spec after
// ApplyJobSpecDefaults() for the parallelism planner. Checks the same field
// rules as ValidateJobSpec() for what a plan reads -- non-finite values, the
// name when given, the model, the batch, resources (ranks up to 131,072, the
// planner's device sweep), the parallelism (a pinned layout's degrees,
// interleaving and sequence parallelism), precision and
// activation_checkpointing -- and nothing else: no data, optimizer or
// schedule is needed (a spec without schedule.total_steps plans, and the
// plan then gives no time to train), and what Loom cannot execute yet
// (ZeRO-3, interleaving, sequence parallelism, FP16, large vocabularies)
// is what planning is for. schedule.total_steps, when given,
// is in [0, 1e9]. INVALID_ARGUMENT with the field path otherwise.
absl::Status ValidatePlanSpec(const loom::v1::JobSpec& spec);

}  // namespace loom

#endif  // LOOM_COMMON_JOBSPEC_VALIDATE_H_
