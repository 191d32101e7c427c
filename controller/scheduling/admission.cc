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
#include "controller/scheduling/admission_cycle.h"
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

namespace internal {

std::string In(absl::Time now, absl::Time at) {
  if (at == absl::InfiniteFuture()) return "when running jobs end (their end is not known)";
  return absl::StrFormat("in about %.0fs", absl::ToDoubleSeconds(at - now));
}


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

}  // namespace internal

AdmissionPolicy::AdmissionPolicy(QueueConfig config) : config_(std::move(config)) {}

Decisions AdmissionPolicy::Decide(const ClusterSnapshot& snapshot, const FairShare& fair_share,
                                  absl::Time now) const {
  return internal::Cycle(config_, snapshot, fair_share, now).Decide();
}

}  // namespace loom::scheduling
