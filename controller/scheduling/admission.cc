#include "controller/scheduling/admission.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "controller/scheduling/gang_fit.h"
#include "controller/scheduling/preemption.h"

namespace loom::scheduling {

const char* PreemptionReasonName(PreemptionReason reason) {
  switch (reason) {
    case PreemptionReason::kPriority:
      return "priority";
    case PreemptionReason::kReclaim:
      return "reclaim";
    case PreemptionReason::kFairShare:
      return "fair share";
    case PreemptionReason::kReservation:
      return "reservation";
  }
  return "?";
}

const char* WaitReasonName(WaitReason reason) {
  switch (reason) {
    case WaitReason::kOverQuota:
      return "over quota";
    case WaitReason::kGangDoesNotFit:
      return "gang does not fit";
    case WaitReason::kCapacityReserved:
      return "capacity reserved";
    case WaitReason::kPreempting:
      return "preempting";
    case WaitReason::kUnknownQueue:
      return "unknown queue";
  }
  return "?";
}

std::map<std::string, Resources> QueueUsage(const ClusterSnapshot& snapshot) {
  std::map<std::string, Resources> usage;
  for (const RunningJob& r : snapshot.running) usage[r.queue] += r.Total();
  return usage;
}

namespace {

std::string In(absl::Time now, absl::Time at) {
  if (at == absl::InfiniteFuture()) return "when running jobs end (their end is not known)";
  return absl::StrFormat("in about %.0fs", absl::ToDoubleSeconds(at - now));
}

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

bool Cycle::Key::operator<(const Key& o) const {
  // As std::tuple's operator<: each element by `<` both ways.
  if (borrows < o.borrows) return true;
  if (o.borrows < borrows) return false;
  if (share < o.share) return true;
  if (o.share < share) return false;
  if (neg_priority < o.neg_priority) return true;
  if (o.neg_priority < neg_priority) return false;
  if (submit < o.submit) return true;
  if (o.submit < submit) return false;
  return *id < *o.id;
}

bool Cycle::GangLess::operator()(const std::vector<Resources>& a,
                                 const std::vector<Resources>& b) const {
  return std::lexicographical_compare(
      a.begin(), a.end(), b.begin(), b.end(), [](const Resources& x, const Resources& y) {
        return std::tie(x.slots, x.gpus) < std::tie(y.slots, y.gpus);
      });
}

const Cycle::Avail& Cycle::AvailNow(bool respect_holds) const {
  Avail& a = avail_[respect_holds ? 1 : 0];
  if (!a.stale) return a;
  a.room = free_;
  a.total = Resources{};
  for (size_t w = 0; w < a.room.size(); ++w) {
    a.room[w] -= claimed_[w];
    if (respect_holds) a.room[w] -= held_[w];
    a.total += Max(a.room[w], Resources{});
  }
  a.workers_with_room.clear();
  a.stale = false;
  return a;
}

int Cycle::WorkersWithRoom(const Avail& a, const Resources& entry) const {
  auto [it, added] = a.workers_with_room.emplace(std::make_pair(entry.slots, entry.gpus), 0);
  if (added) {
    for (const Resources& room : a.room) it->second += entry.FitsIn(room) ? 1 : 0;
  }
  return it->second;
}

// FitGang puts each entry on a distinct worker with room for it, and each
// of those has room for the componentwise smallest entry.
bool Cycle::MayFit(const GangDemand& gang, const Avail& a) const {
  const int n = static_cast<int>(gang.per_worker.size());
  if (n == 0 || n > static_cast<int>(a.room.size())) return false;
  if (!gang.Total().FitsIn(a.total)) return false;
  Resources smallest = gang.per_worker.front();
  for (const Resources& r : gang.per_worker) smallest = Min(smallest, r);
  return WorkersWithRoom(a, smallest) >= n;
}

void Cycle::RoomChanged() {
  avail_[0].stale = avail_[1].stale = true;
  shortage_.clear();
}

Cycle::Cycle(const QueueConfig& config, const ClusterSnapshot& snapshot,
             const FairShare& fair_share, absl::Time now)
    : config_(config), now_(now) {
  std::unordered_map<std::string, int> queue_index, cohort_index, worker_index;
  for (const QueueSpec& spec : config.queues) {
    Queue q;
    q.spec = &spec;
    q.decayed = fair_share.Usage(spec.name);
    if (spec.cohort.empty()) {
      q.cohort = static_cast<int>(cohorts_.size());
      cohorts_.push_back({"", spec.nominal_quota, {}});
    } else {
      auto [it, added] = cohort_index.emplace(spec.cohort, static_cast<int>(cohorts_.size()));
      if (added) cohorts_.push_back({spec.cohort, config.CohortCapacity(spec.cohort), {}});
      q.cohort = it->second;
    }
    queue_index.emplace(spec.name, static_cast<int>(queues_.size()));
    queues_.push_back(std::move(q));
  }
  for (const WorkerFree& w : snapshot.workers) {
    if (!worker_index.emplace(w.id, static_cast<int>(worker_ids_.size())).second) continue;
    worker_ids_.push_back(w.id);
    free_.push_back(w.free);
    capacity_.push_back(Max(w.free, Resources{}));
  }
  held_.assign(free_.size(), Resources{});
  claimed_.assign(free_.size(), Resources{});
  for (const RunningJob& r : snapshot.running) {
    Run run;
    run.job = &r;
    run.id = r.id;
    auto q = queue_index.find(r.queue);
    run.queue = q == queue_index.end() ? -1 : q->second;
    run.priority = r.priority;
    for (const WorkerShare& s : r.placement) {
      auto w = worker_index.find(s.worker_id);
      if (w == worker_index.end()) continue;  // a lost worker: its room is gone anyway
      run.at.push_back({w->second, s.amount});
      capacity_[w->second] += s.amount;
    }
    run.total = r.Total();
    run.start = r.start_time;
    // A saving job frees its room within the grace at most.
    run.end = r.saving ? std::min(r.expected_end, now + config.preemption_grace) : r.expected_end;
    if (run.queue >= 0) {
      queues_[run.queue].usage += run.total;
      cohorts_[queues_[run.queue].cohort].usage += run.total;
    }
    runs_.push_back(std::move(run));
  }
  for (const Resources& c : capacity_) cluster_ += c;
  for (const PendingJob& j : snapshot.pending) {
    auto q = queue_index.find(j.queue);
    if (q == queue_index.end()) {
      out_.waiting.push_back({j.id, j.queue, 0, WaitReason::kUnknownQueue, "",
                              absl::StrCat("queue \"", j.queue, "\" is not configured"),
                              absl::InfiniteFuture()});
      continue;
    }
    queues_[q->second].jobs.push_back(&j);
  }
  for (Queue& q : queues_) {
    std::sort(q.jobs.begin(), q.jobs.end(), [](const PendingJob* a, const PendingJob* b) {
      return std::tie(b->priority, a->submit_time, a->id) <
             std::tie(a->priority, b->submit_time, b->id);
    });
  }
  for (int r = 0; r < static_cast<int>(runs_.size()); ++r) {
    const RunningJob& job = *runs_[r].job;
    if (job.saving) saving_for_[job.preempted_for].push_back(r);
    if (!runs_[r].at.empty() && Preemptible(job, config.min_run_time, now)) {
      victim_order_.push_back(r);
    }
  }
  std::stable_sort(victim_order_.begin(), victim_order_.end(),
                   [&](int a, int b) { return CheaperVictim(*runs_[a].job, *runs_[b].job); });
}

// Dominant share of the cluster, divided by weight.
Cycle::Key Cycle::OrderKey(int q) const {
  const Queue& queue = queues_[q];
  const PendingJob& head = *queue.jobs[queue.next];
  const bool borrows = !(queue.usage + head.gang.Total()).FitsIn(queue.spec->nominal_quota);
  double share = 0;
  if (cluster_.slots > 0) {
    share = std::max(share, (queue.decayed.slots + queue.admitted.slots) / cluster_.slots);
  }
  if (cluster_.gpus > 0) {
    share = std::max(share, (queue.decayed.gpus + queue.admitted.gpus) / cluster_.gpus);
  }
  return {borrows ? 1 : 0, share / queue.spec->weight, -head.priority, head.submit_time, &head.id};
}

Decisions Cycle::Decide() {
  while (true) {
    int best = -1;
    Key best_key;
    for (int q = 0; q < static_cast<int>(queues_.size()); ++q) {
      if (queues_[q].next >= queues_[q].jobs.size()) continue;
      auto key = OrderKey(q);
      if (best < 0 || key < best_key) best = q, best_key = key;
    }
    if (best < 0) break;
    const PendingJob& j = *queues_[best].jobs[queues_[best].next++];
    Evaluate(j, best);
  }
  return std::move(out_);
}

bool Cycle::FitsQuota(const PendingJob& j, int q, const std::vector<int>& victims,
                      bool respect_reserved, std::string* why) const {
  const Queue& queue = queues_[q];
  const Cohort& cohort = cohorts_[queue.cohort];
  const Resources need = j.gang.Total();
  Resources from_queue, from_cohort;
  for (int v : victims) {
    if (runs_[v].queue == q) from_queue += runs_[v].total;
    if (CohortOf(runs_[v].queue) == queue.cohort) from_cohort += runs_[v].total;
  }
  const Resources usage =
      queue.usage - from_queue + need + (respect_reserved ? queue.reserved : Resources{});
  const Resources limit = j.preemptible ? queue.spec->Limit() : queue.spec->nominal_quota;
  if (!usage.FitsIn(limit)) {
    if (why != nullptr) {
      *why = absl::StrCat("queue \"", queue.spec->name, "\" uses ", ToString(queue.usage),
                          " of its ", ToString(limit),
                          !j.preemptible ? " (a job that is not preemptible may not borrow)"
                          : cohort.name.empty()
                              ? " (nominal quota)"
                              : absl::StrCat(" (nominal ", ToString(queue.spec->nominal_quota),
                                             " + borrowing limit)"),
                          "; the job needs ", ToString(need));
    }
    return false;
  }
  if (!cohort.name.empty() && !(cohort.usage - from_cohort + need).FitsIn(cohort.capacity)) {
    if (why != nullptr) {
      *why = absl::StrCat("cohort \"", cohort.name, "\" uses ", ToString(cohort.usage), " of its ",
                          ToString(cohort.capacity), "; the job needs ", ToString(need));
    }
    return false;
  }
  return true;
}

std::optional<std::vector<int>> Cycle::Place(const PendingJob& j, const std::vector<int>& victims,
                                             bool respect_holds) const {
  const Avail& a = AvailNow(respect_holds);
  if (victims.empty()) {
    if (!MayFit(j.gang, a)) return std::nullopt;
    return FitGang(j.gang, a.room);
  }
  if (!MayFitWith(j.gang, a, victims)) return std::nullopt;
  std::vector<Resources> avail = a.room;
  for (int v : victims) {
    for (const auto& [w, amount] : runs_[v].at) avail[w] += amount;
  }
  return FitGang(j.gang, avail);
}

// MayFit's test on the room plus the victims' shares, updated on the
// workers the victims touch only (FitGang, which copies the room, runs only
// when it passes).
bool Cycle::MayFitWith(const GangDemand& gang, const Avail& a,
                       const std::vector<int>& victims) const {
  if (added_.size() != a.room.size()) added_.assign(a.room.size(), Resources{});
  touched_.clear();
  for (int v : victims) {
    for (const auto& [w, amount] : runs_[v].at) {
      if (added_[w].IsZero()) touched_.push_back(w);
      added_[w] += amount;
    }
  }
  const int n = static_cast<int>(gang.per_worker.size());
  Resources smallest = n > 0 ? gang.per_worker.front() : Resources{};
  for (const Resources& r : gang.per_worker) smallest = Min(smallest, r);
  Resources total = a.total;
  int with_room = n > 0 ? WorkersWithRoom(a, smallest) : 0;
  std::sort(touched_.begin(), touched_.end());
  touched_.erase(std::unique(touched_.begin(), touched_.end()), touched_.end());
  for (int w : touched_) {
    const Resources after = a.room[w] + added_[w];
    total += Max(after, Resources{}) - Max(a.room[w], Resources{});
    with_room += (smallest.FitsIn(after) ? 1 : 0) - (smallest.FitsIn(a.room[w]) ? 1 : 0);
  }
  const bool may_fit =
      n > 0 && n <= static_cast<int>(a.room.size()) && gang.Total().FitsIn(total) && with_room >= n;
  for (int w : touched_) added_[w] = Resources{};
  return may_fit;
}

// max over resources of max(0, usage - nominal) / cohort capacity, / weight.
double Cycle::BorrowedShare(int q, const Resources& usage) const {
  const Queue& queue = queues_[q];
  const Resources& capacity = cohorts_[queue.cohort].capacity;
  const Resources borrowed = Max(usage - queue.spec->nominal_quota, Resources{});
  double share = 0;
  if (capacity.slots > 0 && capacity.slots < kUnlimited) {
    share = std::max(share, static_cast<double>(borrowed.slots) / capacity.slots);
  }
  if (capacity.gpus > 0 && capacity.gpus < kUnlimited) {
    share = std::max(share, static_cast<double>(borrowed.gpus) / capacity.gpus);
  }
  return share / queue.spec->weight;
}

std::optional<std::vector<Cycle::Candidate>> Cycle::FindVictims(const PendingJob& j, int q) const {
  const Queue& queue = queues_[q];
  const Resources need = j.gang.Total();
  std::vector<Candidate> candidates;
  for (int r : victim_order_) {  // already in CheaperVictim order
    const Run& run = runs_[r];
    if (run.gone) continue;
    if (run.queue == q && queue.spec->preemption && run.priority < j.priority) {
      candidates.push_back({r, PreemptionReason::kPriority});
    } else if (run.job->opportunistic && run.priority <= j.priority) {
      candidates.push_back({r, PreemptionReason::kReservation});
    } else if (run.queue >= 0 && run.queue != q && Shared(q) &&
               CohortOf(run.queue) == queue.cohort) {
      candidates.push_back({r, (queue.usage + need).FitsIn(queue.spec->nominal_quota)
                                   ? PreemptionReason::kReclaim
                                   : PreemptionReason::kFairShare});
    }
  }
  if (candidates.empty()) return std::nullopt;
  if (!SomeVictimsMayDo(j, q, candidates)) return std::nullopt;
  auto runs_of = [&](const std::vector<int>& chosen) {
    std::vector<int> out;
    for (int c : chosen) out.push_back(candidates[c].run);
    return out;
  };
  // What the queues of the chosen victims give up.
  auto given_up = [&](const std::vector<int>& chosen, int from_queue) {
    Resources sum;
    for (int c : chosen) {
      if (runs_[candidates[c].run].queue == from_queue) sum += runs_[candidates[c].run].total;
    }
    return sum;
  };
  auto fits = [&](const std::vector<int>& chosen) {
    const std::vector<int> victims = runs_of(chosen);
    return FitsQuota(j, q, victims, /*respect_reserved=*/true, nullptr) &&
           Place(j, victims, /*respect_holds=*/true).has_value();
  };
  auto allowed = [&](int c, const std::vector<int>& chosen) {
    const Run& run = runs_[candidates[c].run];
    const int p = run.queue;
    switch (candidates[c].reason) {
      case PreemptionReason::kPriority:
      case PreemptionReason::kReservation:
        return true;
      case PreemptionReason::kReclaim:
        // Only from a queue that still borrows, for a job that keeps its
        // queue within its nominal quota.
        return !(queues_[p].usage - given_up(chosen, p)).FitsIn(queues_[p].spec->nominal_quota) &&
               (queue.usage - given_up(chosen, q) + need).FitsIn(queue.spec->nominal_quota);
      case PreemptionReason::kFairShare:
        return BorrowedShare(p, queues_[p].usage - given_up(chosen, p) - run.total) >=
               BorrowedShare(q, queue.usage - given_up(chosen, q) + need);
    }
    return false;
  };
  auto chosen = ChooseVictims(static_cast<int>(candidates.size()), fits, allowed);
  if (!chosen) return std::nullopt;
  std::vector<Candidate> victims;
  for (int c : *chosen) victims.push_back(candidates[c]);
  return victims;
}

// False only when ChooseVictims over `candidates` (with FindVictims' fits and
// allowed) certainly finds no set. Every set it can choose holds only
// candidates that were allowed when taken, so lies within the candidates
// that could ever be allowed (giving up more never makes a victim's queue
// borrow, nor the job's queue borrow less): priority and reservation ones;
// reclaim ones from a queue that borrows now; fair-share ones whose queue's
// share without them alone is >= the job queue's share with the job, less
// everything the job's own queue could give up. Both halves of `fits` only
// get harder with fewer victims (quota: usage only drops; room: FitGang
// refuses when the positive room in all is short, and needs as many workers
// with room as the gang has entries), so when all of those together do not
// fit, no subset does. Amounts are >= 0 in any real
// snapshot; with a negative one the check gives up (true).
bool Cycle::SomeVictimsMayDo(const PendingJob& j, int q,
                             const std::vector<Candidate>& candidates) const {
  const Queue& queue = queues_[q];
  const Resources need = j.gang.Total();
  Resources own_queue;  // the most the job's queue can give up
  for (const Candidate& c : candidates) {
    const Run& run = runs_[c.run];
    if (run.total.AnyNegative()) return true;
    for (const auto& [w, amount] : run.at) {
      if (amount.AnyNegative()) return true;
    }
    if (run.queue == q) own_queue += run.total;
  }
  const double least_share = BorrowedShare(q, queue.usage - own_queue + need);
  std::vector<int> possible;
  for (const Candidate& c : candidates) {
    const Run& run = runs_[c.run];
    const int p = run.queue;
    bool may = true;
    if (c.reason == PreemptionReason::kReclaim) {
      may = !queues_[p].usage.FitsIn(queues_[p].spec->nominal_quota);
    } else if (c.reason == PreemptionReason::kFairShare) {
      may = BorrowedShare(p, queues_[p].usage - run.total) >= least_share;
    }
    if (!may) continue;
    possible.push_back(c.run);
  }
  if (possible.empty()) return false;
  return FitsQuota(j, q, possible, /*respect_reserved=*/true, nullptr) &&
         MayFitWith(j.gang, AvailNow(/*respect_holds=*/true), possible);
}

void Cycle::Admit(const PendingJob& j, int q, const std::vector<int>& at, bool opportunistic) {
  Queue& queue = queues_[q];
  const Resources need = j.gang.Total();
  Admission a;
  a.job_id = j.id;
  a.queue = queue.spec->name;
  a.borrowing = !(queue.usage + need).FitsIn(queue.spec->nominal_quota);
  a.opportunistic = opportunistic;
  Run run;
  run.id = j.id;
  run.queue = q;
  run.priority = j.priority;
  run.total = need;
  run.start = now_;
  run.end = j.expected_runtime == absl::InfiniteDuration() ? absl::InfiniteFuture()
                                                           : now_ + j.expected_runtime;
  for (size_t i = 0; i < at.size(); ++i) {
    const Resources& amount = j.gang.per_worker[i];
    free_[at[i]] -= amount;
    RoomChanged();
    a.placement.push_back({worker_ids_[at[i]], amount});
    run.at.push_back({at[i], amount});
  }
  queue.usage += need;
  queue.admitted += need;
  cohorts_[queue.cohort].usage += need;
  runs_.push_back(std::move(run));
  out_.admissions.push_back(std::move(a));
}

// The job takes the victims' quota now and their room when they have left;
// its place (the victims' room plus free room) is held for it meanwhile.
void Cycle::Claim(const PendingJob& j, int q, const std::vector<int>& victims) {
  Queue& queue = queues_[q];
  const Resources need = j.gang.Total();
  const auto at = Place(j, victims, /*respect_holds=*/true);
  for (int v : victims) {
    Run& run = runs_[v];
    run.gone = true;
    if (run.queue >= 0) {
      queues_[run.queue].usage -= run.total;
      cohorts_[queues_[run.queue].cohort].usage -= run.total;
    }
  }
  queue.usage += need;
  queue.admitted += need;
  cohorts_[queue.cohort].usage += need;
  if (!queue.has_holder) queue.holder = j.id;
  queue.has_holder = true;
  if (!at) return;
  std::vector<Resources> from_victims(free_.size());
  for (int v : victims) {
    for (const auto& [w, amount] : runs_[v].at) from_victims[w] += amount;
  }
  for (size_t i = 0; i < at->size(); ++i) {
    const int w = (*at)[i];
    const Resources from_free = Max(j.gang.per_worker[i] - from_victims[w], Resources{});
    claimed_[w] += Max(Min(free_[w] - held_[w] - claimed_[w], from_free), Resources{});
  }
  RoomChanged();
}

// Where and when `j` starts if running jobs end at their expected ends; holds
// its queue's quota and the free room on those workers. nullopt (nothing
// held) when it cannot start even on an empty cluster.
std::optional<absl::Time> Cycle::Reserve(const PendingJob& j, int q) {
  Queue& queue = queues_[q];
  const Resources need = j.gang.Total();
  const Resources limit = j.preemptible ? queue.spec->Limit() : queue.spec->nominal_quota;
  if (!need.FitsIn(limit) || !need.FitsIn(cohorts_[queue.cohort].capacity)) return std::nullopt;
  std::vector<Resources> avail = free_;
  for (size_t w = 0; w < avail.size(); ++w) avail[w] -= held_[w] + claimed_[w];
  Resources queue_usage = queue.usage, cohort_usage = cohorts_[queue.cohort].usage;
  std::vector<int> ending;
  for (int r = 0; r < static_cast<int>(runs_.size()); ++r) {
    if (!runs_[r].gone) ending.push_back(r);
  }
  std::sort(ending.begin(), ending.end(), [&](int a, int b) {
    return std::tie(runs_[a].end, runs_[a].start, runs_[a].id) <
           std::tie(runs_[b].end, runs_[b].start, runs_[b].id);
  });
  const bool shared = Shared(q);
  absl::Time start = now_;
  std::optional<std::vector<int>> at;
  for (size_t next = 0;; ++next) {
    if ((queue_usage + need).FitsIn(limit) &&
        (!shared || (cohort_usage + need).FitsIn(cohorts_[queue.cohort].capacity))) {
      at = FitGang(j.gang, avail);
      if (at) break;
    }
    if (next == ending.size()) return std::nullopt;
    const Run& run = runs_[ending[next]];
    start = std::max(start, run.end);
    for (const auto& [w, amount] : run.at) avail[w] += amount;
    if (run.queue == q) queue_usage -= run.total;
    if (CohortOf(run.queue) == queue.cohort) cohort_usage -= run.total;
  }
  for (size_t i = 0; i < at->size(); ++i) {
    const int w = (*at)[i];
    held_[w] += Max(Min(free_[w] - held_[w] - claimed_[w], j.gang.per_worker[i]), Resources{});
  }
  RoomChanged();
  queue.reserved += need;
  queue.has_holder = true;
  queue.holder = j.id;
  reservations_.push_back({j.id, start});
  earliest_reservation_ = std::min(earliest_reservation_, start);
  return start;
}

void Cycle::Wait(const PendingJob& j, int q, WaitReason reason, std::string message,
                 std::string blocking, absl::Time start) {
  Waiting w;
  w.job_id = j.id;
  w.queue = queues_[q].spec->name;
  w.position = ++queues_[q].waiting;
  w.reason = reason;
  w.blocking_job_id = std::move(blocking);
  w.message = std::move(message);
  w.expected_start = start;
  out_.waiting.push_back(std::move(w));
}

void Cycle::Evaluate(const PendingJob& j, int q) {
  Queue& queue = queues_[q];
  // Never fits the live workers, however empty: wait, reserving nothing.
  auto idle = fits_idle_.find(j.gang.per_worker);
  if (idle == fits_idle_.end()) {
    idle = fits_idle_.emplace(j.gang.per_worker, FitGang(j.gang, capacity_).has_value()).first;
  }
  if (!idle->second) {
    Wait(j, q, WaitReason::kGangDoesNotFit,
         absl::StrCat("gang does not fit the live workers even when idle: ",
                      DescribeShortage(j.gang, capacity_)));
    return;
  }

  // Victims still saving for this job: it evicts nobody else meanwhile.
  std::vector<int> saving;
  if (auto it = saving_for_.find(j.id); it != saving_for_.end()) {
    for (int r : it->second) {
      if (!runs_[r].gone) saving.push_back(r);
    }
  }
  if (!saving.empty()) {
    std::vector<std::string> ids;
    for (int r : saving) ids.push_back(runs_[r].id);
    Claim(j, q, saving);
    Wait(j, q, WaitReason::kPreempting,
         absl::StrCat("waiting for ", ids.size(),
                      " preempted job(s) to save and stop: ", absl::StrJoin(ids, ", ")));
    return;
  }

  // Fits as things are.
  if (FitsQuota(j, q, {}, /*respect_reserved=*/true, nullptr)) {
    if (auto at = Place(j, {}, /*respect_holds=*/true)) {
      Admit(j, q, *at, /*opportunistic=*/false);
      return;
    }
  }

  // Fits after preempting.
  if (auto victims = FindVictims(j, q)) {
    std::vector<int> runs;
    std::vector<std::string> ids;
    for (const Candidate& c : *victims) {
      const Run& run = runs_[c.run];
      runs.push_back(c.run);
      ids.push_back(run.id);
      Preemption p;
      p.victim_id = run.id;
      p.for_job_id = j.id;
      p.reason = c.reason;
      const std::string& victim_queue = run.queue >= 0 ? queues_[run.queue].spec->name : "?";
      switch (c.reason) {
        case PreemptionReason::kPriority:
          p.message = absl::StrFormat("preempted for job %s of queue \"%s\" (priority %d > %d)",
                                      j.id, queue.spec->name, j.priority, run.priority);
          break;
        case PreemptionReason::kReclaim:
          p.message = absl::StrFormat(
              "preempted for job %s: queue \"%s\" reclaims its nominal quota from queue \"%s\", "
              "which borrows",
              j.id, queue.spec->name, victim_queue);
          break;
        case PreemptionReason::kFairShare:
          p.message = absl::StrFormat(
              "preempted for job %s: queue \"%s\" borrows more than its weighted share of "
              "cohort \"%s\"",
              j.id, victim_queue, queue.spec->cohort);
          break;
        case PreemptionReason::kReservation:
          p.message = absl::StrFormat(
              "preempted for job %s: it ran opportunistically in capacity reserved for others",
              j.id);
          break;
      }
      out_.preemptions.push_back(std::move(p));
    }
    Claim(j, q, runs);
    Wait(j, q, WaitReason::kPreempting,
         absl::StrCat("preempting ", ids.size(), " job(s) (", absl::StrJoin(ids, ", "),
                      "); they save at their next step boundary, then this job starts"));
    return;
  }

  // Backfill past the reservations: if it ends before the earliest, or may
  // be preempted when a holder is ready.
  const bool ends_in_time = j.expected_runtime != absl::InfiniteDuration() &&
                            now_ + j.expected_runtime <= earliest_reservation_;
  if (!reservations_.empty() && (ends_in_time || j.preemptible) &&
      FitsQuota(j, q, {}, /*respect_reserved=*/false, nullptr)) {
    if (auto at = Place(j, {}, /*respect_holds=*/false)) {
      Admit(j, q, *at, /*opportunistic=*/!ends_in_time);
      return;
    }
  }

  // Waits. The first waiting job of its queue reserves.
  std::string why;
  WaitReason reason;
  std::string blocking;
  if (!FitsQuota(j, q, {}, /*respect_reserved=*/false, &why)) {
    reason = WaitReason::kOverQuota;
    why = absl::StrCat("over quota: ", why);
  } else if (!Place(j, {}, /*respect_holds=*/false)) {
    reason = WaitReason::kGangDoesNotFit;
    // free_ - claimed_: the room without holds.
    auto shortage = shortage_.find(j.gang.per_worker);
    if (shortage == shortage_.end()) {
      shortage = shortage_
                     .emplace(j.gang.per_worker,
                              DescribeShortage(j.gang, AvailNow(/*respect_holds=*/false).room))
                     .first;
    }
    why = absl::StrCat("gang does not fit: ", shortage->second);
  } else if (queue.has_holder && !FitsQuota(j, q, {}, /*respect_reserved=*/true, nullptr)) {
    reason = WaitReason::kCapacityReserved;
    blocking = queue.holder;
    why = absl::StrCat("capacity reserved for job ", queue.holder, ": queue \"", queue.spec->name,
                       "\" holds its quota for the job at its head");
  } else {
    reason = WaitReason::kCapacityReserved;
    const Reservation& r = reservations_.empty() ? Reservation{queue.holder, absl::InfiniteFuture()}
                                                 : reservations_.front();
    blocking = r.job_id;
    why = absl::StrCat("capacity reserved for job ", r.job_id, ", expected to start ",
                       In(now_, r.start),
                       "; a job may run ahead of it only if it ends before then "
                       "(scheduling.max_runtime) or is preemptible");
  }
  absl::Time start = absl::InfiniteFuture();
  if (!queue.has_holder) {
    if (auto reserved = Reserve(j, q)) {
      start = *reserved;
      absl::StrAppend(&why, "; holds its place at the head of queue \"", queue.spec->name,
                      "\", expected to start ", In(now_, start));
    }
  }
  Wait(j, q, reason, std::move(why), std::move(blocking), start);
}

}  // namespace

AdmissionPolicy::AdmissionPolicy(QueueConfig config) : config_(std::move(config)) {}

Decisions AdmissionPolicy::Decide(const ClusterSnapshot& snapshot, const FairShare& fair_share,
                                  absl::Time now) const {
  return Cycle(config_, snapshot, fair_share, now).Decide();
}

}  // namespace loom::scheduling
