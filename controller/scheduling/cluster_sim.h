// A fake cluster on a fake clock that applies an AdmissionPolicy's
// decisions the way the controller must, and checks them:
// admissions take exactly their gang's demand on distinct workers with room
// (never part of a gang, never an over-committed worker); preemptions name
// running jobs that are not already saving; every pending job is either
// admitted or waiting, once.
//
// The model: a job does one step per second of running and checkpoints
// every `checkpoint_every_steps`. A preempted job saves at its next step
// boundary (`save_time` later) and stops; it goes back to its queue with
// its first submit time, its remaining work and no steps lost
// (checkpoint-then-preempt). A job ends when its work is done.
//
// The unit tests and the scheduler benchmark drive the real policy through
// it. Not thread-safe.
#ifndef LOOM_CONTROLLER_SCHEDULING_CLUSTER_SIM_H_
#define LOOM_CONTROLLER_SCHEDULING_CLUSTER_SIM_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "controller/scheduling/admission.h"
#include "controller/scheduling/fair_share.h"
#include "controller/scheduling/snapshot.h"

namespace loom::scheduling {

class ClusterSim {
 public:
  // `workers`: each worker's whole capacity (all free at the start).
  ClusterSim(QueueConfig config, std::vector<WorkerFree> workers, absl::Time start);

  struct Options {
    absl::Duration save_time = absl::ZeroDuration();  // from the request to the stop
    int64_t checkpoint_every_steps = 100;
  };
  void set_options(Options options) { options_ = options; }

  // Queues `job` (its submit_time is overwritten with now). `work` is how
  // long it must run in all; InfiniteDuration: until the test ends.
  void Submit(PendingJob job, absl::Duration work);

  // One scheduling cycle at now(): jobs whose work is done end, victims
  // whose save is done stop and requeue, the fair share observes the
  // usage, the policy decides, and the decisions are applied. INTERNAL
  // naming the broken rule when a decision is inconsistent.
  absl::StatusOr<Decisions> RunCycle();

  void Advance(absl::Duration d) { now_ += d; }
  absl::Time now() const { return now_; }

  ClusterSnapshot Snapshot() const;
  Resources QueueUsage(const std::string& queue) const;  // running jobs, saving included
  bool Running(const std::string& id) const { return running_.count(id) > 0; }
  bool Pending(const std::string& id) const { return pending_.count(id) > 0; }
  bool Finished(const std::string& id) const { return finished_.count(id) > 0; }
  int preemptions() const { return preemptions_; }
  int64_t steps_lost() const { return 0; }  // checkpoint-then-preempt: the model loses none
  const FairShare& fair_share() const { return fair_share_; }
  // Real (wall-clock) time spent inside AdmissionPolicy::Decide over all
  // cycles so far: what the scheduler benchmark divides its decisions by.
  // A measurement only; no decision depends on it.
  absl::Duration decide_wall_time() const { return decide_wall_time_; }

 private:
  struct Job {
    PendingJob spec;
    absl::Duration work, done;  // needed in all, done before the current run
    absl::Time first_submit;
    absl::Time last_preempted = absl::InfinitePast();
    // While running:
    std::vector<WorkerShare> placement;
    absl::Time start;
    bool opportunistic = false;
    bool saving = false;
    absl::Time stop_at;
    std::string preempted_for;
  };
  absl::Duration DoneBy(const Job& job) const;

  AdmissionPolicy policy_;
  FairShare fair_share_;
  Options options_;
  absl::Time now_;
  std::vector<std::string> worker_order_;
  std::map<std::string, Resources> free_;
  std::map<std::string, Job> pending_, running_, finished_;
  int preemptions_ = 0;
  absl::Duration decide_wall_time_;
};

}  // namespace loom::scheduling

#endif  // LOOM_CONTROLLER_SCHEDULING_CLUSTER_SIM_H_
