// Failure handling: what a rank's exit does to its attempt, and what a
// failure settles into. A failed rank stops its peers at once; the failure
// is decided once it has settled (failure_settle_time, or until every rank
// is re-adopted after a controller restart), naming a silent worker as the
// cause when there is one, as RecoveryPolicy::DecideFailure says: placed
// again without a restart (a rendezvous that failed before any step),
// failed without spending a restart (nothing a restart could cure),
// re-planned (an elastic job that lost a worker), or restarted from the
// newest checkpoint while restarts are left, else FAILED.
//
// Thread-compatible: called with the controller's lock held.
#ifndef LOOM_CONTROLLER_RECOVERY_FAILURE_HANDLER_H_
#define LOOM_CONTROLLER_RECOVERY_FAILURE_HANDLER_H_

#include <string>

#include "absl/time/time.h"
#include "common/clock.h"
#include "controller/checkpoints/checkpoint_catalog.h"
#include "controller/elastic/replanner.h"
#include "controller/jobs/job_table.h"
#include "controller/jobs/rank_commands.h"
#include "controller/recovery/recovery_metrics.h"
#include "controller/recovery/recovery_policy.h"
#include "controller/workers/worker_registry.h"
#include "loom/v1/service.pb.h"

namespace loom::controller {

class FailureHandler {
 public:
  struct Options {
    // See JobManagerOptions: how long a failure settles before it is decided.
    absl::Duration failure_settle_time = absl::Seconds(1);
    int max_rendezvous_retries = 3;
  };
  // All must outlive the handler; `metrics` may be null, and so may
  // `replanner` (then no job is re-planned: elastic jobs restart too).
  FailureHandler(JobTable* jobs, RankCommands* ranks, WorkerRegistry* workers,
                 CheckpointCatalog* catalog, const Clock* clock, RecoveryMetrics* metrics,
                 Replanner* replanner, Options options);

  // A rank of rec's current attempt exited on `node` (not part of a move):
  // the job succeeds once every rank finished training; a failure stops the
  // other ranks and waits to settle (ResolveSettled).
  void OnRankExit(JobRecord& rec, const loom::v1::ReportRankExitRequest& req,
                  const std::string& node);
  // Each tick: decides every failure that has settled.
  void ResolveSettled();
  // A failure ends the attempt: restart from the newest checkpoint while
  // restarts are left, else FAILED. `cause_kind` is a kCause* value of
  // recovery_metrics.h.
  void FailOrRestart(JobRecord& rec, const std::string& cause, const std::string& cause_kind);
  // A job whose attempt a restart would not help (`because`): FAILED with
  // `cause` and a GAVE_UP event saying both, no restart spent.
  void FailWithoutRestart(JobRecord& rec, const std::string& cause, const std::string& because);

 private:
  JobTable* const jobs_;
  RankCommands* const ranks_;
  WorkerRegistry* const workers_;
  CheckpointCatalog* const catalog_;
  const Clock* const clock_;
  RecoveryMetrics* const metrics_;
  Replanner* const replanner_;
  const Options options_;
  const RecoveryPolicy recovery_;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_RECOVERY_FAILURE_HANDLER_H_
