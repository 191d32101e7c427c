// One scheduling cycle: given a snapshot of the cluster, the
// queues' decayed usage and `now`, which gangs start where, which running
// gangs are preempted for whom, and why every other job waits.
//
// The rules, in the order a cycle applies them:
//
//  * Order. Each queue orders its jobs by priority (higher first), then
//    submit time, then id. Across queues the next job considered is the
//    head of the queue that (1) would not borrow for it, (2) has the lowest
//    weighted share, (decayed usage + this cycle's admissions) / weight, as
//    a dominant share of the cluster (slots or GPUs, whichever is larger),
//    (3) has the higher priority, (4) the earlier submit time.
//  * Quota. A job fits its queue when the queue's usage plus the job stays
//    within nominal_quota + borrowing_limit (nominal_quota alone without a
//    cohort, and for a job that is not preemptible), and its cohort's usage
//    plus the job within the sum of the cohort's nominal quotas.
//  * Atomic gangs. A job is admitted only when its whole gang has a place
//    now (gang_fit.h), never in part.
//  * Preemption, when quota or room is short (preemption.h picks a minimal,
//    cheapest set among the candidates; nobody is preempted when the set
//    would not let the job start):
//      - priority: jobs of the same queue with a strictly lower priority,
//        when the queue's `preemption` is on (the default);
//      - reclaim: when the job keeps its queue within its nominal quota,
//        jobs of other queues of the cohort that borrow (only while their
//        queue still borrows);
//      - fair share: when the job's queue would borrow, jobs of other
//        queues of the cohort whose weighted borrowed share after losing
//        the victim stays >= the job queue's after admitting the job (so
//        two queues never preempt each other back and forth);
//      - reservation: opportunistic jobs (admitted past a reservation) of
//        priority <= the job's.
//    Never a job that is not preemptible, already saving, or inside its
//    no-thrash window (QueueConfig::min_run_time). The preemptor then waits
//    (kPreempting) and its victims' quota and room are held for it; while
//    any of its victims is still saving it evicts nobody else.
//  * Reservation. The first job of each queue that cannot start reserves:
//    its queue's quota for it, and the free room on the workers where it
//    will start once running jobs end at their expected ends. Later jobs
//    (of any queue) may use reserved room only if they end before the
//    earliest reservation's expected start, or if they are preemptible
//    (then they run opportunistically and are the first victims).
//
// The cycle is a pure function of its arguments: deterministic, no clock,
// no I/O. Thread-safe (const).
#ifndef LOOM_CONTROLLER_SCHEDULING_ADMISSION_H_
#define LOOM_CONTROLLER_SCHEDULING_ADMISSION_H_

#include <map>
#include <string>

#include "absl/time/time.h"
#include "controller/scheduling/fair_share.h"
#include "controller/scheduling/queue_config.h"
#include "controller/scheduling/snapshot.h"

namespace loom::scheduling {

class AdmissionPolicy {
 public:
  explicit AdmissionPolicy(QueueConfig config);

  // One cycle. Jobs of queues the configuration does not define wait with
  // kUnknownQueue; running jobs of such queues count only for room.
  Decisions Decide(const ClusterSnapshot& snapshot, const FairShare& fair_share,
                   absl::Time now) const;

  const QueueConfig& config() const { return config_; }

 private:
  QueueConfig config_;
};

// What each queue holds in `snapshot` (running jobs, saving ones included):
// what FairShare::Observe wants each cycle.
std::map<std::string, Resources> QueueUsage(const ClusterSnapshot& snapshot);

}  // namespace loom::scheduling

#endif  // LOOM_CONTROLLER_SCHEDULING_ADMISSION_H_
