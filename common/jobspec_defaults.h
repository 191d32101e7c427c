// The defaults of a job spec, applied after parsing and before validation.
#ifndef LOOM_COMMON_JOBSPEC_DEFAULTS_H_
#define LOOM_COMMON_JOBSPEC_DEFAULTS_H_

#include "loom/v1/job.pb.h"

namespace loom {

// Fills in defaults. proto3 scalars have no presence, so "unset" and "zero"
// are the same thing; for each field below 0 (or UNSPECIFIED) means "use the
// default", which means a literal 0 cannot be asked for where a default
// exists:
//   optimizer.adamw.beta1         0.9     (only if optimizer.adamw is set;
//   optimizer.adamw.beta2         0.95     the oneof member is never created)
//   optimizer.adamw.eps           1e-8
//   optimizer.adamw.weight_decay  0.1     (so weight decay cannot be disabled;
//                                          use a tiny value such as 1e-12)
//   schedule.min_lr_ratio         0.1     (likewise; decay to ~0 with 1e-12)
//   schedule.eval_batches         8
//   schedule.log_interval         1
//   resources.workers             1
//   resources.ranks               resources.workers
//   resources.threads_per_rank    1
//   batch.micro_batch             max(1, global_batch / replicas) when
//                                 global_batch > 0, replicas being
//                                 parallelism.data or else ranks
//                                 (ValidateJobSpec() reports a global_batch
//                                 that does not split evenly); left 0 under
//                                 parallelism.auto: the planner picks it
//   parallelism.tensor, .pipeline 1, unless parallelism.auto
//   parallelism.data              ranks / (tensor x pipeline) when that
//                                 divides evenly, unless parallelism.auto
//   precision                     FP32
//   checkpoint.keep               3, or retention.local.newest when set
//   checkpoint.retention.local    newest: checkpoint.keep
//   checkpoint.retention.remote   with checkpoint.remote: all (unset), or
//                                 newest 3 when other rules are given
//   seed                          1337    (so seed 0 cannot be asked for)
// Deliberately NOT defaulted:
//   optimizer.adamw.lr            required; 0 is an error, not "unset".
//   optimizer.adamw.grad_clip     0 disables clipping (the proto's contract),
//                                 so a default of 1.0 cannot be expressed.
//   schedule.eval_interval        0 = evaluate only at the end.
//   checkpoint.interval_steps     0 = only the final checkpoint.
//   checkpoint.dir                the controller picks
//                                 <data-dir>/checkpoints/<job>; it knows
//                                 the data dir, this library does not.
// Never creates the model or optimizer oneof members, so ValidateJobSpec()
// can still report them missing. Idempotent. `spec` must be non-null.
void ApplyJobSpecDefaults(loom::v1::JobSpec* spec);

}  // namespace loom

#endif  // LOOM_COMMON_JOBSPEC_DEFAULTS_H_
