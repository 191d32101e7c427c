// The cluster as the scheduling policy sees it in one cycle: plain values
// the controller copies out of its job and worker records (under its lock),
// and the decisions it gets back. No gRPC, no store, no clock: `now` is
// passed alongside.
#ifndef LOOM_CONTROLLER_SCHEDULING_SNAPSHOT_H_
#define LOOM_CONTROLLER_SCHEDULING_SNAPSHOT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "controller/scheduling/resources.h"

namespace loom::scheduling {

// What a gang needs: one entry per distinct worker it spreads over (the
// ranks and GPUs that worker must host). Entries may differ when the ranks
// do not split evenly (controller/admission/scheduler.h: some workers take one tensor
// group more).
struct GangDemand {
  std::vector<Resources> per_worker;

  static GangDemand Even(int workers, Resources each) {
    return GangDemand{std::vector<Resources>(workers, each)};
  }
  Resources Total() const {
    Resources sum;
    for (const Resources& r : per_worker) sum += r;
    return sum;
  }
};

// A live worker and what no running job holds on it now.
struct WorkerFree {
  std::string id;
  Resources free;
};

// Part of a gang on one worker.
struct WorkerShare {
  std::string worker_id;
  Resources amount;
};

struct PendingJob {
  std::string id;
  std::string queue;  // resolved: a queue the configuration defines
  int priority = 0;   // higher first
  GangDemand gang;
  // Orders the queue (with priority). A preempted job keeps its first
  // submit time, so it goes back near the head of its queue.
  absl::Time submit_time;
  // scheduling.max_runtime, else the planner's estimate; infinite when
  // neither is known. Backfill past a reservation needs it.
  absl::Duration expected_runtime = absl::InfiniteDuration();
  // Whether the job may be preempted. A job that may not is admitted only
  // within its queue's nominal quota and never past a reservation.
  bool preemptible = true;
};

struct RunningJob {
  std::string id;
  std::string queue;
  int priority = 0;
  std::vector<WorkerShare> placement;  // what it holds, worker by worker
  absl::Time start_time;               // start of the current run (after any resume)
  absl::Time expected_end = absl::InfiniteFuture();
  // When it was last preempted; InfinitePast when never. With start_time it
  // decides the no-thrash protection (QueueConfig::min_run_time).
  absl::Time last_preempted = absl::InfinitePast();
  int64_t steps_since_checkpoint = 0;  // the work a preemption now would redo
  bool preemptible = true;
  // Admitted past another job's reservation because it is preemptible
  // (Admission::opportunistic); the first victims of any blocked gang.
  bool opportunistic = false;
  // Asked to save and stop (a Preemption was issued and is in progress): it
  // still holds its placement, and is never chosen as a victim again.
  bool saving = false;
  std::string preempted_for;  // the preemptor's job id while saving

  Resources Total() const {
    Resources sum;
    for (const WorkerShare& s : placement) sum += s.amount;
    return sum;
  }
};

struct ClusterSnapshot {
  std::vector<WorkerFree> workers;
  std::vector<PendingJob> pending;  // any order
  std::vector<RunningJob> running;  // scheduled or running, saving ones included
};

// ---- Decisions ----

// Start the gang now on exactly this placement (one entry per distinct
// worker, in the order of GangDemand::per_worker).
struct Admission {
  std::string job_id;
  std::string queue;
  std::vector<WorkerShare> placement;
  bool borrowing = false;      // its queue goes beyond its nominal quota
  bool opportunistic = false;  // runs in capacity reserved for another job
};

enum class PreemptionReason {
  kPriority,     // a higher-priority job of the same queue
  kReclaim,      // the preemptor's queue reclaims its nominal quota
  kFairShare,    // the victim's queue borrows more than its weighted share
  kReservation,  // the victim was admitted opportunistically
};
const char* PreemptionReasonName(PreemptionReason reason);

// Save at the next step boundary, then stop (within the grace), then
// requeue: the whole gang.
struct Preemption {
  std::string victim_id;
  std::string for_job_id;
  PreemptionReason reason = PreemptionReason::kPriority;
  std::string message;  // for the victim's PREEMPTED event
};

enum class WaitReason {
  kOverQuota,         // its queue (or cohort) has no quota left for it
  kGangDoesNotFit,    // not enough workers with room for the whole gang
  kCapacityReserved,  // the room is held for an earlier gang
  kPreempting,        // victims are saving for it
  kUnknownQueue,      // its queue is not configured (removed on reload)
};
const char* WaitReasonName(WaitReason reason);

struct Waiting {
  std::string job_id;
  std::string queue;
  int position = 0;  // 1-based among its queue's waiting jobs, in admission order
  WaitReason reason = WaitReason::kGangDoesNotFit;
  std::string blocking_job_id;  // kCapacityReserved: the holder
  std::string message;          // the job's reason, for loomctl
  // Holders of a reservation: when the running jobs' expected ends let the
  // gang start; InfiniteFuture when not known.
  absl::Time expected_start = absl::InfiniteFuture();
};

struct Decisions {
  std::vector<Admission> admissions;  // in admission order
  std::vector<Preemption> preemptions;
  std::vector<Waiting> waiting;  // every pending job not admitted
};

}  // namespace loom::scheduling

#endif  // LOOM_CONTROLLER_SCHEDULING_SNAPSHOT_H_
