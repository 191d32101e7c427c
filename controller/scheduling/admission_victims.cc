// The cycle's quotas, placement with victims, and choice of victims
// (admission_cycle.h).
#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "controller/scheduling/admission_cycle.h"
#include "controller/scheduling/gang_fit.h"
#include "controller/scheduling/preemption.h"

namespace loom::scheduling::internal {

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

}  // namespace loom::scheduling::internal
