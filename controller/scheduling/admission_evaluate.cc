// What each pending job gets in a cycle: admitted, a claim on its
// victims' room, a reservation, or a wait with its reason
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

}  // namespace loom::scheduling::internal
