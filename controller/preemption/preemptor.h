// Checkpoint-then-preempt, and every other save-and-stop that moves a
// running job: its ranks are asked to save a checkpoint at their next step
// boundary and stop (StopRank.checkpoint_first); once every rank has
// exited, what follows depends on why (MoveIntent): a preempted job is
// requeued PREEMPTED with the steps it lost (0 when its save committed) and
// no restart counted; any other move goes to the MoveHandler registered for
// it (elastic/replanner.h: grow, move off a node; slow_ranks/: re-split a
// pipeline). A job whose ranks do not save within the queues' grace gets a
// plain stop. Depends on no other subsystem.
//
// Thread-compatible: called with the controller's lock held.
#ifndef LOOM_CONTROLLER_PREEMPTION_PREEMPTOR_H_
#define LOOM_CONTROLLER_PREEMPTION_PREEMPTOR_H_

#include <map>
#include <string>

#include "common/clock.h"
#include "controller/checkpoints/checkpoint_catalog.h"
#include "controller/jobs/job_table.h"
#include "controller/jobs/rank_commands.h"
#include "controller/recovery/recovery_metrics.h"
#include "controller/scheduling/queue_config.h"
#include "controller/scheduling/snapshot.h"
#include "loom/v1/service.pb.h"

namespace loom::controller {

// What a move other than a preemption does once its ranks are gone.
class MoveHandler {
 public:
  virtual ~MoveHandler() = default;
  // `rec.preempting` is already reset; `move` is what it was.
  virtual void FinishMove(JobRecord& rec, const PreemptionInProgress& move) = 0;
};

class Preemptor {
 public:
  // All must outlive the preemptor; `metrics` may be null. `queues` is read
  // at each call (its preemption_grace).
  Preemptor(JobTable* jobs, RankCommands* ranks, CheckpointCatalog* catalog, const Clock* clock,
            RecoveryMetrics* metrics, const scheduling::QueueConfig* queues);

  // Moves of `intent` finish through `handler` (must outlive this).
  void SetMoveHandler(MoveIntent intent, MoveHandler* handler) { handlers_[intent] = handler; }

  // Carries out one of the policy's preemptions: a victim training is asked
  // to save and stop (PREEMPTING event, written before the ranks act); one
  // not yet training is requeued at once. Nothing for a victim not running,
  // already moving, or failing.
  void Preempt(JobRecord& rec, const scheduling::Preemption& preemption);
  // A save-and-stop that is no preemption: records it in rec.preempting
  // (the queues' grace applies), sets the job's reason ("<doing>: saving a
  // checkpoint ...") and asks the ranks with `stop_reason`. The caller may
  // fill in the returned move's details.
  PreemptionInProgress& SaveAndStopToMove(JobRecord& rec, MoveIntent intent,
                                          const std::string& cause_kind, const std::string& doing,
                                          const std::string& stop_reason);
  // Each tick: a plain stop to moving jobs whose grace ran out; a move of
  // a job that ended or was requeued meanwhile is forgotten.
  void CheckGraces();
  // A rank of the current attempt exited (its worker and placement checked
  // by the caller). When the attempt is moving, or the rank saved and
  // stopped while no move was known (across a controller restart), the
  // exit is the move's: the job succeeds if every rank finished training,
  // else the move finishes once no rank is left. Returns whether the exit
  // was the move's (false: a plain exit, the caller's to handle).
  bool OnRankExit(JobRecord& rec, const loom::v1::ReportRankExitRequest& req);
  // Every rank of a moving attempt is gone: a preemption is recorded and
  // requeued as PREEMPTED; another move goes to its handler.
  void Finish(JobRecord& rec);

 private:
  JobTable* const jobs_;
  RankCommands* const ranks_;
  CheckpointCatalog* const catalog_;
  const Clock* const clock_;
  RecoveryMetrics* const metrics_;
  const scheduling::QueueConfig* const queues_;
  std::map<MoveIntent, MoveHandler*> handlers_;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_PREEMPTION_PREEMPTOR_H_
