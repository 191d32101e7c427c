// Admission and placement: each scheduling cycle builds the cluster as the
// policy sees it (scheduling/snapshot.h: what each alive worker has free,
// what each placed job holds, the jobs waiting), lets the policy decide
// (scheduling/admission.h: quotas, borrowing, fair share, priorities,
// reservations, preemptions), carries out its preemptions (preemption/),
// places each admitted gang (scheduler.h's PlaceGang over the workers the
// policy chose) and sends its starts, and says why each waiting job waits.
// A job whose previous attempt's ranks may still run keeps its claim.
//
// Thread-compatible: called with the controller's lock held.
#ifndef LOOM_CONTROLLER_ADMISSION_ADMITTER_H_
#define LOOM_CONTROLLER_ADMISSION_ADMITTER_H_

#include "common/clock.h"
#include "controller/admission/schedule_signal.h"
#include "controller/checkpoints/checkpoint_catalog.h"
#include "controller/elastic/replanner.h"
#include "controller/jobs/job_table.h"
#include "controller/preemption/preemptor.h"
#include "controller/scheduling/admission.h"
#include "controller/scheduling/fair_share.h"
#include "controller/scheduling/queue_config.h"
#include "controller/workers/worker_registry.h"
#include "loom/v1/service.pb.h"

namespace loom::controller {

class Admitter : public JobTableListener {
 public:
  // At most this many attempts' placements are kept per job.
  static constexpr size_t kMaxPlacementsKept = 16;
  // All must outlive this. `queues` is read at each cycle; call
  // QueueConfigChanged after replacing it. `preemptor` and `replanner` may
  // be null: the policy's preemptions are then not carried out, and no
  // waiting elastic job shrinks.
  Admitter(JobTable* jobs, WorkerRegistry* workers, CheckpointCatalog* catalog, const Clock* clock,
           const scheduling::QueueConfig* queues, Preemptor* preemptor, Replanner* replanner,
           ScheduleSignal* schedule);

  // One scheduling cycle over the queued jobs (nothing when none waits).
  void Schedule();
  // Runs a cycle when the signal says one is due.
  void ScheduleIfDue() {
    if (schedule_->Due(clock_->Now())) Schedule();
  }
  void QueueConfigChanged() { policy_ = scheduling::AdmissionPolicy(*queues_); }
  // The queues as the ListQueues RPC answers: the configuration, and per
  // queue what its placed jobs hold and how many jobs wait or run in it.
  loom::v1::ListQueuesResponse ListQueues() const;
  // A job queued makes the scheduler run.
  void OnTransition(const JobRecord& rec, loom::v1::JobState to) override;

 private:
  JobTable* const jobs_;
  WorkerRegistry* const workers_;
  CheckpointCatalog* const catalog_;
  const Clock* const clock_;
  const scheduling::QueueConfig* const queues_;
  Preemptor* const preemptor_;
  Replanner* const replanner_;
  ScheduleSignal* const schedule_;
  // Over *queues_; rebuilt by QueueConfigChanged, not every cycle.
  scheduling::AdmissionPolicy policy_;
  // The queues' decayed usage, observed every cycle.
  scheduling::FairShare fair_share_{absl::Hours(1)};
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_ADMISSION_ADMITTER_H_
