// Elastic re-planning: an elastic job (spec.elastic) that lost a worker is
// re-planned for the slots the live cluster can give it now (elastic.h's
// candidates, the planner's best executable layout for the largest gang
// that plans) instead of waiting for its whole gang; one waiting for room
// that does not fit shrinks; one below elastic.max_ranks grows back when
// room returns (a save-and-stop through the preemptor, then a re-plan).
// Every re-plan is a REPLANNED event and resumes from the newest checkpoint
// without counting a restart.
//
// Thread-compatible: called with the controller's lock held.
#ifndef LOOM_CONTROLLER_ELASTIC_REPLANNER_H_
#define LOOM_CONTROLLER_ELASTIC_REPLANNER_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "controller/checkpoints/checkpoint_catalog.h"
#include "controller/jobs/job_table.h"
#include "controller/preemption/preemptor.h"
#include "controller/recovery/recovery_metrics.h"
#include "controller/scheduling/queue_config.h"
#include "controller/scheduling/snapshot.h"
#include "controller/workers/worker_registry.h"

namespace loom::controller {

class Replanner : public MoveHandler {
 public:
  struct Options {
    // A worker silent for longer is taken as the one being lost.
    absl::Duration failure_settle_time = absl::Seconds(1);
  };
  Replanner(JobTable* jobs, WorkerRegistry* workers, CheckpointCatalog* catalog,
            Preemptor* preemptor, const Clock* clock, RecoveryMetrics* metrics,
            const scheduling::QueueConfig* queues, Options options);

  // Re-plans `rec` for the slots the live cluster can give it now, records
  // REPLANNED and requeues it under the new layout. False (nothing changed)
  // when the job is not elastic or no gang of at least elastic.min_ranks
  // plans. `max_ranks` > 0 caps the gang below elastic.max_ranks.
  bool Replan(JobRecord& rec, const std::string& cause, const std::string& cause_kind,
              int max_ranks = 0);
  // Records a REPLANNED event (the layouts, the predicted step; resuming
  // from the newest checkpoint, or the newest in-memory snapshot a live node
  // holds, and the steps after it lost; `describe(resume_from, lost)` is its
  // message, resume_from "the checkpoint at step N" or "the in-memory
  // snapshot at step N"), counts it, bumps the layout generation and
  // resumes from the newest. Returns the message.
  std::string RecordReplan(
      JobRecord& rec, const std::string& cause_kind, const std::string& from_layout,
      const std::string& to_layout, double predicted_step_seconds,
      const std::function<std::string(const std::string& resume_from, int64_t lost)>& describe);
  // After a scheduling cycle: when the only job waiting for capacity is an
  // elastic gang that does not fit and no slots are about to come back, it
  // is re-planned for a smaller gang that fits. True when one was.
  bool ShrinkWaiting(const scheduling::ClusterSnapshot& snapshot,
                     const scheduling::Decisions& decisions);
  // Whether an elastic gang of at least elastic.min_ranks plans on what the
  // live cluster could give `rec` now.
  bool GangPlans(const JobRecord& rec);
  // Each tick: a running elastic job below elastic.max_ranks, running for at
  // least the queues' min_run_time, while no job waits, with room for a
  // larger gang that plans, is asked to save and stop to grow.
  void Grow();
  // kGrow: re-planned for what the cluster has now (else resumes as it
  // was); kAwayFromNode: re-planned without the node (else placed again).
  void FinishMove(JobRecord& rec, const PreemptionInProgress& move) override;

 private:
  // What each alive, heartbeating, uncordoned worker could give `rec` (its
  // slots, or GPUs for a GPU job, less what other jobs hold), and those
  // workers.
  std::vector<int> FreeSlots(const JobRecord& rec, std::vector<loom::v1::WorkerInfo>* alive);

  JobTable* const jobs_;
  WorkerRegistry* const workers_;
  CheckpointCatalog* const catalog_;
  Preemptor* const preemptor_;
  const Clock* const clock_;
  RecoveryMetrics* const metrics_;
  const scheduling::QueueConfig* const queues_;
  const Options options_;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_ELASTIC_REPLANNER_H_
