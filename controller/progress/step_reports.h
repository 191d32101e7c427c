// Step reports: what ranks report of their attempt (steps with their
// metrics, committed and failed saves, checkpoints found corrupt) applied
// to the job: the step cursor and summary (job_progress.h), the spike
// detector (a confirmed spike goes to recovery/rollbacks.h), the slow-rank
// detector (slow_ranks/), the checkpoint catalog and event log, and live
// step events for watchers. The durable write is queued, not waited for,
// so that many ranks' reports share one transaction.
//
// Thread-compatible: called with the controller's lock held.
#ifndef LOOM_CONTROLLER_PROGRESS_STEP_REPORTS_H_
#define LOOM_CONTROLLER_PROGRESS_STEP_REPORTS_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "controller/checkpoints/checkpoint_catalog.h"
#include "controller/events/event_hub.h"
#include "controller/jobs/job_table.h"
#include "controller/recovery/recovery_metrics.h"
#include "controller/recovery/rollbacks.h"
#include "controller/slow_ranks/slow_rank_handler.h"
#include "controller/store/store.h"
#include "controller/workers/worker_registry.h"
#include "loom/v1/service.pb.h"

namespace loom::controller {

class StepReports {
 public:
  // All must outlive this; `metrics` may be null, and so may `rollbacks`
  // (then loss spikes are not looked for) and `slow_ranks` (then per-rank
  // compute times are not looked at).
  StepReports(JobTable* jobs, WorkerRegistry* workers, CheckpointCatalog* catalog, Store* store,
              EventHub* hub, const Clock* clock, RecoveryMetrics* metrics, Rollbacks* rollbacks,
              SlowRankHandler* slow_ranks);

  // A report applied, its durable write (if any) queued and not yet waited
  // for, and the job's step cursor before and after it.
  struct Applied {
    absl::StatusOr<loom::v1::ReportStepMetricsResponse> response;
    Store::Ticket write;
    int64_t last_step_before = -1;
    int64_t last_step_after = -1;
    int64_t events_through = 0;  // the newest event log entry the write carries
  };
  // NOT_FOUND for an unknown worker (it retries after registering again) or
  // job; INVALID_ARGUMENT, before anything is recorded, for a checkpoint
  // event with a status other than committed / failed / corrupt, or a
  // corrupt one without path, step or failed_check; FAILED_PRECONDITION for
  // a report of an attempt older than the job's current one (its ranks then
  // stop); PERMISSION_DENIED for a worker holding no rank of the attempt.
  // Idempotent: a step the current attempt already reported (a retry) is
  // not applied again. The answer says stop once the attempt has ended.
  Applied Apply(const loom::v1::ReportStepMetricsRequest& req);
  // The answer once the write is durable or failed (`durable`); a failed
  // write lets the worker's retry apply the steps again.
  absl::StatusOr<loom::v1::ReportStepMetricsResponse> Finish(const std::string& job_id,
                                                             int64_t generation, Applied applied,
                                                             const absl::Status& durable);
  // INVALID_ARGUMENT naming the field for a checkpoint event whose status a
  // rank cannot send, or a corrupt one without path, step or failed_check.
  static absl::Status ValidateCheckpointEvents(const loom::v1::ReportStepMetricsRequest& req);

 private:
  absl::StatusOr<loom::v1::ReportStepMetricsResponse> ApplyEvents(
      const loom::v1::ReportStepMetricsRequest& req, Store::Ticket* write, int64_t* events_through);
  // A report of an older attempt: records the checkpoints it committed
  // while it was current, and answers FAILED_PRECONDITION (its ranks stop).
  absl::Status RefuseStale(JobRecord& rec, const loom::v1::ReportStepMetricsRequest& req);
  // A checkpoint event of the current attempt: a failed save becomes a
  // CHECKPOINT_FAILED event, a corrupt one is marked in the catalog (both
  // nullopt); a committed one enters the catalog and the job's summary and
  // is returned as recorded. UNAVAILABLE if the catalog cannot record it.
  absl::StatusOr<std::optional<loom::v1::CheckpointInfo>> ApplyCheckpointEvent(
      JobRecord& rec, const loom::v1::CheckpointInfo& reported, int64_t now_unix_ms);
  // Marks a checkpoint a rank found corrupt at load and records a
  // CHECKPOINT_CORRUPT event. UNAVAILABLE if the store failed.
  absl::Status RecordCorruptCheckpoint(JobRecord& rec, const loom::v1::CheckpointInfo& report);
  // The rank-0 worker's upload outcomes (statuses "uploaded" and
  // "upload_failed"), recorded whatever the attempt and the job's state: an
  // upload may end after its attempt, or the job, did. Sets *only_uploads
  // when the request holds nothing else.
  absl::Status ApplyUploadEvents(JobRecord& rec, const loom::v1::ReportStepMetricsRequest& req,
                                 bool* only_uploads);

  JobTable* const jobs_;
  WorkerRegistry* const workers_;
  CheckpointCatalog* const catalog_;
  Store* const store_;
  EventHub* const hub_;
  const Clock* const clock_;
  RecoveryMetrics* const metrics_;
  Rollbacks* const rollbacks_;
  SlowRankHandler* const slow_ranks_;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_PROGRESS_STEP_REPORTS_H_
