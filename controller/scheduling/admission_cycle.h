// The admission policy's scheduling cycle (admission.h's
// AdmissionPolicy::Decide): its state and steps, split over admission.cc
// (setup, order, decisions), admission_victims.cc (quotas, placement with
// victims, choosing victims) and admission_evaluate.cc (admitting,
// claiming, reserving, waiting: what each pending job gets). Internal to
// controller/scheduling/.
#ifndef LOOM_CONTROLLER_SCHEDULING_ADMISSION_CYCLE_H_
#define LOOM_CONTROLLER_SCHEDULING_ADMISSION_CYCLE_H_

#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "controller/scheduling/admission.h"
#include "controller/scheduling/gang_fit.h"

namespace loom::scheduling::internal {

// "in about 12s", or "when running jobs end ..." for an unknown time.
std::string In(absl::Time now, absl::Time at);

// The state of one cycle: starts as the snapshot, and every admission,
// preemption and reservation of the cycle updates it, so later jobs see the
// earlier ones' effects.
class Cycle {
 public:
  Cycle(const QueueConfig& config, const ClusterSnapshot& snapshot, const FairShare& fair_share,
        absl::Time now);
  Decisions Decide();

 private:
  struct Queue {
    const QueueSpec* spec = nullptr;
    int cohort = 0;
    Resources usage;     // running + admitted or claimed this cycle - leaving victims
    Resources reserved;  // quota held for this queue's reservation holder
    Resources admitted;  // admitted or claimed this cycle (fair-share order)
    DecayedUsage decayed;
    std::vector<const PendingJob*> jobs;  // queue order
    size_t next = 0;
    bool has_holder = false;
    std::string holder;  // its reservation holder (or preemptor), when has_holder
    int waiting = 0;
  };
  struct Cohort {
    std::string name;  // empty: a queue on its own
    Resources capacity;
    Resources usage;
  };
  struct Run {
    const RunningJob* job = nullptr;  // nullptr: admitted this cycle
    std::string id;
    int queue = -1;
    int priority = 0;
    std::vector<std::pair<int, Resources>> at;  // worker index, amount
    Resources total;
    absl::Time start, end;
    bool gone = false;  // a victim of this cycle, or saving for a preemptor of it
  };
  struct Reservation {
    std::string job_id;
    absl::Time start;
  };
  struct Candidate {
    int run;
    PreemptionReason reason;
  };
  // The cross-queue order of OrderKey: (would borrow, weighted share,
  // -priority, submit time, id), compared as a tuple of them would be.
  struct Key {
    int borrows = 0;
    double share = 0;
    int neg_priority = 0;
    absl::Time submit;
    const std::string* id = nullptr;
    bool operator<(const Key& o) const;
  };
  // Orders gangs by their demands, for the per-cycle caches.
  struct GangLess {
    bool operator()(const std::vector<Resources>& a, const std::vector<Resources>& b) const;
  };
  // Room a gang may take now: free_ - claimed_ (- held_ when holds are
  // respected), the sum of its positive parts (what FitGang's quick
  // refusal compares), and how many workers have room for a given entry.
  // Rebuilt on first use after an admission, claim or reservation changed
  // free_, claimed_ or held_. Caches only: every answer is what the full
  // computation gives.
  struct Avail {
    bool stale = true;
    std::vector<Resources> room;
    Resources total;
    mutable std::map<std::pair<int64_t, int64_t>, int> workers_with_room;  // entry -> count
  };

  void Evaluate(const PendingJob& j, int q);
  bool FitsQuota(const PendingJob& j, int q, const std::vector<int>& victims, bool respect_reserved,
                 std::string* why) const;
  std::optional<std::vector<int>> Place(const PendingJob& j, const std::vector<int>& victims,
                                        bool respect_holds) const;
  std::optional<std::vector<Candidate>> FindVictims(const PendingJob& j, int q) const;
  bool SomeVictimsMayDo(const PendingJob& j, int q, const std::vector<Candidate>& candidates) const;
  double BorrowedShare(int q, const Resources& usage) const;
  void Admit(const PendingJob& j, int q, const std::vector<int>& at, bool opportunistic);
  void Claim(const PendingJob& j, int q, const std::vector<int>& victims);
  std::optional<absl::Time> Reserve(const PendingJob& j, int q);
  void Wait(const PendingJob& j, int q, WaitReason reason, std::string message,
            std::string blocking = "", absl::Time start = absl::InfiniteFuture());
  int CohortOf(int q) const { return q < 0 ? -1 : queues_[q].cohort; }
  bool Shared(int q) const { return q >= 0 && !cohorts_[queues_[q].cohort].name.empty(); }
  Key OrderKey(int q) const;
  const Avail& AvailNow(bool respect_holds) const;
  // False only when FitGang(gang, a.room) is certainly nullopt: no entry,
  // more entries than workers, too little room in all, or fewer workers
  // with room for the smallest entry than entries.
  bool MayFit(const GangDemand& gang, const Avail& a) const;
  int WorkersWithRoom(const Avail& a, const Resources& entry) const;
  bool MayFitWith(const GangDemand& gang, const Avail& a, const std::vector<int>& victims) const;
  void RoomChanged();

  const QueueConfig& config_;
  const absl::Time now_;
  std::vector<Queue> queues_;
  std::vector<Cohort> cohorts_;
  std::vector<std::string> worker_ids_;
  // free_: what no job holds; held_: free room reserved for reservation
  // holders (later jobs may backfill it); claimed_: free room held for
  // preemptors (nobody else takes it).
  std::vector<Resources> free_, held_, claimed_, capacity_;
  Resources cluster_;
  std::vector<Run> runs_;
  std::vector<Reservation> reservations_;
  absl::Time earliest_reservation_ = absl::InfiniteFuture();
  Decisions out_;

  // Per-cycle indexes and caches (the scheduler benchmark: a cycle visits every
  // pending job, so per-job work over all workers or all running jobs
  // dominates). None changes a decision.
  // Snapshot runs that may be victims at all (Preemptible) in CheaperVictim
  // order, ties by index: FindVictims' candidates come out sorted as its
  // stable_sort would leave them.
  std::vector<int> victim_order_;
  // Preemptor id -> the snapshot runs saving for it, by index.
  std::unordered_map<std::string, std::vector<int>> saving_for_;
  // Whether a gang fits the live workers when idle (capacity_ is fixed for
  // the cycle).
  mutable std::map<std::vector<Resources>, bool, GangLess> fits_idle_;
  mutable Avail avail_[2];  // [respect_holds]
  // DescribeShortage(gang, free_ - claimed_) by gang; cleared with avail_.
  mutable std::map<std::vector<Resources>, std::string, GangLess> shortage_;
  // Place's scratch: what victims add per worker (all zero between calls).
  mutable std::vector<Resources> added_;
  mutable std::vector<int> touched_;
};

}  // namespace loom::scheduling::internal

#endif  // LOOM_CONTROLLER_SCHEDULING_ADMISSION_CYCLE_H_
