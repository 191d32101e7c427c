// Slow ranks: each step report's per-rank compute times feed the attempt's
// SlowRankDetector (recovery/slow_rank_detector.h); a rank it names gets a
// SLOW_RANK event and recovery.slow_rank.action: "report" stops there;
// "cordon" cordons the rank's node (kept in the store across restarts)
// and, when the job can run without it, moves the job off it (a
// save-and-stop, then a re-plan or a new placement); "replan" re-splits
// the pipeline's blocks for the node's measured speed. Nothing is lost and
// no restart is counted.
//
// Thread-compatible: called with the controller's lock held.
#ifndef LOOM_CONTROLLER_SLOW_RANKS_SLOW_RANK_HANDLER_H_
#define LOOM_CONTROLLER_SLOW_RANKS_SLOW_RANK_HANDLER_H_

#include "common/clock.h"
#include "controller/admission/schedule_signal.h"
#include "controller/elastic/replanner.h"
#include "controller/jobs/job_table.h"
#include "controller/preemption/preemptor.h"
#include "controller/recovery/recovery_metrics.h"
#include "controller/recovery/recovery_policy.h"
#include "controller/store/store.h"
#include "controller/workers/worker_registry.h"

namespace loom::controller {

class SlowRankHandler : public MoveHandler {
 public:
  // All must outlive this; `metrics` may be null, and so may `replanner`
  // when no job is elastic and no pipeline is re-split (FinishMove needs it).
  SlowRankHandler(JobTable* jobs, WorkerRegistry* workers, Store* store, Preemptor* preemptor,
                  Replanner* replanner, const Clock* clock, RecoveryMetrics* metrics,
                  ScheduleSignal* schedule);

  // A step of rec's current attempt with per-rank compute times.
  void Observe(JobRecord& rec, const loom::v1::StepMetrics& m, const RecoveryOptions& recovery);
  // kReplanAround: placed again, its stages split for its nodes' speeds.
  void FinishMove(JobRecord& rec, const PreemptionInProgress& move) override;

 private:
  void Handle(JobRecord& rec, const recovery::SlowRankFinding& finding,
              const RecoveryOptions& recovery);
  // Whether rec's gang, as it is, could be placed with its own slots free
  // (the cordoned nodes left out).
  bool GangFitsElsewhere(const JobRecord& rec);

  JobTable* const jobs_;
  WorkerRegistry* const workers_;
  Store* const store_;
  Preemptor* const preemptor_;
  Replanner* const replanner_;
  const Clock* const clock_;
  RecoveryMetrics* const metrics_;
  ScheduleSignal* const schedule_;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_SLOW_RANKS_SLOW_RANK_HANDLER_H_
