// Rollbacks, PaLM-style: a confirmed loss spike rolls the job back to a
// checkpoint before it and skips the data batches around it, as
// RecoveryPolicy::DecideSpikeRollback says (or fails the job once
// max_rollbacks are spent); an operator's rollback resumes from the newest
// good checkpoint at or before a step with the skip ranges given. Both
// record a ROLLBACK event with the resume point and the steps lost, and
// requeue the job; no restart is counted.
//
// Thread-compatible: called with the controller's lock held.
#ifndef LOOM_CONTROLLER_RECOVERY_ROLLBACKS_H_
#define LOOM_CONTROLLER_RECOVERY_ROLLBACKS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "controller/checkpoints/checkpoint_catalog.h"
#include "controller/jobs/job_table.h"
#include "controller/recovery/recovery_metrics.h"
#include "controller/recovery/spike_detector.h"
#include "controller/store/store.h"
#include "loom/v1/service.pb.h"

namespace loom::controller {

class Rollbacks {
 public:
  // All must outlive this; `metrics` may be null.
  Rollbacks(JobTable* jobs, CheckpointCatalog* catalog, Store* store, RecoveryMetrics* metrics);

  // INVALID_ARGUMENT for a request no job could take (to_step out of range,
  // a bad skip range), before anything is looked up.
  static absl::Status ValidateRequest(const loom::v1::RollbackJobRequest& req);
  // An operator's rollback of a RUNNING job (FAILED_PRECONDITION otherwise,
  // or before its attempt reported a step): stops its ranks and resumes
  // from the newest good checkpoint <= to_step, adding the skip ranges
  // (clipped to the batches the rollback undoes), as a spike rollback does;
  // the ROLLBACK event's cause is "operator". INVALID_ARGUMENT for to_step
  // beyond the last reported step or a skip range wholly before the resume
  // point; FAILED_PRECONDITION also when no checkpoint at or before
  // to_step > 0 is on disk (to_step 0 = from scratch).
  absl::Status Operator(JobRecord& rec, const loom::v1::RollbackJobRequest& req);
  // A confirmed loss spike of rec's current attempt at the step of `verdict`,
  // which trained on `data_batch`.
  void OnSpike(JobRecord& rec, const recovery::SpikeVerdict& verdict, int64_t data_batch);

 private:
  // The shared tail: sets the resume step, adds `skips`, records `event`
  // (kind, step, cause and message filled in by the caller) with the resume
  // point and the steps lost, and requeues.
  void RollBack(JobRecord& rec, int64_t resume_step, int64_t checkpoint_step,
                const std::vector<loom::v1::SkipRange>& skips, loom::v1::RecoveryEvent event,
                const std::string& reason);

  JobTable* const jobs_;
  CheckpointCatalog* const catalog_;
  Store* const store_;
  RecoveryMetrics* const metrics_;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_RECOVERY_ROLLBACKS_H_
