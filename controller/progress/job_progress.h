// What one step report of a job's current attempt changes in its record:
// the job's summary (first and last step, loss, throughput, MFU, energy,
// validation loss), the bottleneck verdict over its recent steps
// (diagnosis.h), and the attempt's progress (its last step, and the data
// batch each recent step trained on, which keeps rollback skip ranges
// replayable). progress/step_reports.h calls it for every step it
// accepts; the spike detector, the catalog and the store stay there.
//
// Plain functions over a JobRecord: no clock, no store, no gRPC.
// Thread-compatible (the caller holds the record's lock).
#ifndef LOOM_CONTROLLER_PROGRESS_JOB_PROGRESS_H_
#define LOOM_CONTROLLER_PROGRESS_JOB_PROGRESS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/time/time.h"
#include "controller/jobs/job_record.h"
#include "loom/v1/job.pb.h"

namespace loom::controller {

// Step data-batch entries kept per attempt (JobRecord::step_batches).
inline constexpr size_t kMaxStepBatchesKept = 4096;

// Applies `m` (a step report of rec's current attempt, its time_unix_ms
// set) to `rec`. Step 0 (the untrained model's validation pass) sets only
// the validation loss. A step at or before the last one of the recent
// window starts the diagnosis window afresh (a new attempt). The verdict is
// stamped with `now_unix_ms`.
void ApplyStepReport(const loom::v1::StepMetrics& m, int64_t now_unix_ms, JobRecord* rec);

// How long the job still needs to run, for backfill past a reservation
// when its spec gives no scheduling.max_runtime_seconds: the steps left
// (total_steps less the last reported) at its measured step time (from the
// last step's tokens/s) with a 1.2x margin, or, before any step, at the
// planner's predicted step time with a 2x margin (plan accuracy varies by
// machine). InfiniteDuration when neither is known.
absl::Duration EstimatedRemainingRuntime(const loom::v1::Job& job);

// When the job last entered `state` (its history); nullopt if never.
std::optional<absl::Time> LastTransitionTo(const loom::v1::Job& job, loom::v1::JobState state);

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_PROGRESS_JOB_PROGRESS_H_
