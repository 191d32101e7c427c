#include "controller/scheduling/cluster_sim.h"

#include <chrono>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace loom::scheduling {
namespace {

absl::Status Broken(absl::string_view what) {
  return absl::InternalError(absl::StrCat("inconsistent decision: ", what));
}

}  // namespace

ClusterSim::ClusterSim(QueueConfig config, std::vector<WorkerFree> workers, absl::Time start)
    : policy_(config), fair_share_(config.fair_share_half_life), now_(start) {
  for (WorkerFree& w : workers) {
    worker_order_.push_back(w.id);
    free_[w.id] = w.free;
  }
}

void ClusterSim::Submit(PendingJob job, absl::Duration work) {
  job.submit_time = now_;
  Job j;
  j.first_submit = now_;
  j.work = work;
  j.spec = std::move(job);
  const std::string id = j.spec.id;
  pending_.emplace(id, std::move(j));
}

absl::Duration ClusterSim::DoneBy(const Job& job) const {
  const absl::Time until = job.saving ? std::min(now_, job.stop_at) : now_;
  return job.done + (until - job.start);
}

ClusterSnapshot ClusterSim::Snapshot() const {
  ClusterSnapshot s;
  for (const std::string& id : worker_order_) s.workers.push_back({id, free_.at(id)});
  for (const auto& [id, job] : pending_) s.pending.push_back(job.spec);
  for (const auto& [id, job] : running_) {
    RunningJob r;
    r.id = id;
    r.queue = job.spec.queue;
    r.priority = job.spec.priority;
    r.placement = job.placement;
    r.start_time = job.start;
    if (job.spec.expected_runtime != absl::InfiniteDuration()) {
      r.expected_end = job.start + job.spec.expected_runtime;
    }
    r.last_preempted = job.last_preempted;
    r.steps_since_checkpoint = static_cast<int64_t>(absl::ToDoubleSeconds(now_ - job.start)) %
                               options_.checkpoint_every_steps;
    r.preemptible = job.spec.preemptible;
    r.opportunistic = job.opportunistic;
    r.saving = job.saving;
    r.preempted_for = job.preempted_for;
    s.running.push_back(std::move(r));
  }
  return s;
}

Resources ClusterSim::QueueUsage(const std::string& queue) const {
  Resources sum;
  for (const auto& [id, job] : running_) {
    if (job.spec.queue != queue) continue;
    for (const WorkerShare& s : job.placement) sum += s.amount;
  }
  return sum;
}

absl::StatusOr<Decisions> ClusterSim::RunCycle() {
  // Ends and stops since the last cycle.
  for (auto it = running_.begin(); it != running_.end();) {
    Job& job = it->second;
    const bool done = DoneBy(job) >= job.work;
    const bool stopped = job.saving && now_ >= job.stop_at;
    if (!done && !stopped) {
      ++it;
      continue;
    }
    for (const WorkerShare& s : job.placement) free_[s.worker_id] += s.amount;
    if (done) {
      finished_.emplace(it->first, std::move(job));
    } else {
      // Saved at the step boundary: resumes from there, nothing lost.
      job.done = DoneBy(job);
      if (job.spec.expected_runtime != absl::InfiniteDuration()) {
        job.spec.expected_runtime -= (job.stop_at - job.start);
      }
      job.spec.submit_time = job.first_submit;
      job.last_preempted = now_;
      job.placement.clear();
      job.saving = false;
      job.opportunistic = false;
      job.preempted_for.clear();
      pending_.emplace(it->first, std::move(job));
    }
    it = running_.erase(it);
  }

  const ClusterSnapshot snapshot = Snapshot();
  fair_share_.Observe(now_, scheduling::QueueUsage(snapshot));
  const auto decide_start = std::chrono::steady_clock::now();
  Decisions d = policy_.Decide(snapshot, fair_share_, now_);
  decide_wall_time_ += absl::FromChrono(std::chrono::steady_clock::now() - decide_start);

  std::set<std::string> seen;
  for (const Waiting& w : d.waiting) {
    if (!pending_.count(w.job_id))
      return Broken(absl::StrCat(w.job_id, " waits but is not pending"));
    if (!seen.insert(w.job_id).second) return Broken(absl::StrCat(w.job_id, " listed twice"));
  }
  for (const Preemption& p : d.preemptions) {
    auto it = running_.find(p.victim_id);
    if (it == running_.end())
      return Broken(absl::StrCat(p.victim_id, " preempted but not running"));
    if (it->second.saving) return Broken(absl::StrCat(p.victim_id, " preempted twice"));
    if (!it->second.spec.preemptible) {
      return Broken(absl::StrCat(p.victim_id, " preempted but not preemptible"));
    }
    it->second.saving = true;
    it->second.stop_at = now_ + options_.save_time;
    it->second.preempted_for = p.for_job_id;
    ++preemptions_;
  }
  for (const Admission& a : d.admissions) {
    auto it = pending_.find(a.job_id);
    if (it == pending_.end()) return Broken(absl::StrCat(a.job_id, " admitted but not pending"));
    if (!seen.insert(a.job_id).second) return Broken(absl::StrCat(a.job_id, " listed twice"));
    Job job = std::move(it->second);
    pending_.erase(it);
    const auto& demand = job.spec.gang.per_worker;
    if (a.placement.size() != demand.size()) {
      return Broken(absl::StrCat(a.job_id, ": a partial gang (", a.placement.size(), " of ",
                                 demand.size(), " workers)"));
    }
    std::set<std::string> workers;
    for (size_t i = 0; i < demand.size(); ++i) {
      const WorkerShare& s = a.placement[i];
      if (!workers.insert(s.worker_id).second) {
        return Broken(absl::StrCat(a.job_id, ": worker ", s.worker_id, " used twice"));
      }
      if (s.amount != demand[i]) return Broken(absl::StrCat(a.job_id, ": wrong amount"));
      auto f = free_.find(s.worker_id);
      if (f == free_.end() || !s.amount.FitsIn(f->second)) {
        return Broken(absl::StrCat(a.job_id, ": worker ", s.worker_id, " over-committed"));
      }
      f->second -= s.amount;
    }
    job.placement = a.placement;
    job.start = now_;
    job.opportunistic = a.opportunistic;
    running_.emplace(a.job_id, std::move(job));
  }
  if (seen.size() != snapshot.pending.size()) {
    return Broken(absl::StrCat(snapshot.pending.size() - seen.size(),
                               " pending job(s) neither admitted nor waiting"));
  }
  return d;
}

}  // namespace loom::scheduling
