#include "controller/workers/rank_reconciler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "controller/jobs/job_state_machine.h"

namespace loom::controller {
namespace {

// Whether `worker` already has a stop queued for the job (and, when
// `generation` > 0, for that attempt).
bool StopQueued(const WorkerRegistry::Worker& worker, const std::string& job_id,
                int64_t generation) {
  return std::any_of(worker.pending_commands.begin(), worker.pending_commands.end(),
                     [&](const loom::v1::WorkerCommand& c) {
                       return c.has_stop() && c.stop().job_id() == job_id &&
                              (generation == 0 || c.stop().generation() == generation);
                     });
}

loom::v1::StopRank Stop(const std::string& job_id, int64_t generation, std::string reason) {
  loom::v1::StopRank stop;
  stop.set_job_id(job_id);
  stop.set_generation(generation);
  stop.set_reason(std::move(reason));
  return stop;
}

}  // namespace

RankReconciliation ReconcileRunningRanks(const loom::v1::HeartbeatRequest& req,
                                         const WorkerRegistry::Worker& worker,
                                         const JobTable& jobs) {
  RankReconciliation out;
  const std::string& worker_id = worker.info.id();
  for (const loom::v1::RunningRank& r : req.running()) {
    out.running.insert({r.job_id(), r.rank()});
    out.running_attempts.insert({r.job_id(), r.rank(), r.generation()});
    const JobRecord* rec = jobs.Find(r.job_id());
    if (rec == nullptr || !IsAttemptRunningState(rec->job.state())) {
      // A rank of a finished (or requeued) attempt is still alive here: ask
      // again to stop it.
      if (!StopQueued(worker, r.job_id(), 0)) {
        out.stops.push_back(
            Stop(r.job_id(), 0, rec == nullptr ? "unknown job" : "job already ended"));
      }
      continue;
    }
    const bool placed_here = std::any_of(
        rec->job.ranks().begin(), rec->job.ranks().end(), [&](const loom::v1::RankAssignment& a) {
          return a.rank() == r.rank() && a.worker_id() == worker_id;
        });
    if (r.generation() == rec->job.generation() && placed_here) {
      out.confirmed.push_back({r.job_id(), r.rank()});
      continue;
    }
    // An older attempt's rank (or one this worker was never given, or not
    // re-adopted): fenced off. Stop that attempt's ranks here, once.
    if (StopQueued(worker, r.job_id(), r.generation())) continue;
    if (r.generation() < rec->job.generation()) {
      out.stops.push_back(
          Stop(r.job_id(), r.generation(),
               absl::StrCat("attempt ", r.generation(), " is stale (the job runs attempt ",
                            rec->job.generation(), ")")));
    } else if (!placed_here && rec->adopt_deadline == absl::InfinitePast()) {
      out.stops.push_back(Stop(r.job_id(), r.generation(),
                               absl::StrCat("rank ", r.rank(), " of attempt ", r.generation(),
                                            " is not placed on worker ", worker_id)));
    }
  }
  return out;
}

std::vector<loom::v1::StartRank> DueStarts(
    const std::set<std::tuple<std::string, int, int64_t>>& running_attempts, const JobTable& jobs,
    absl::Time now, absl::Duration resend_after, WorkerRegistry::Worker* worker) {
  std::vector<loom::v1::StartRank> due;
  for (auto it = worker->unacked.begin(); it != worker->unacked.end();) {
    const loom::v1::StartRank& start = it->second.first;
    const JobRecord* rec = jobs.Find(start.job_id());
    const bool stale = rec == nullptr || !IsAttemptRunningState(rec->job.state()) ||
                       rec->job.generation() != start.generation();
    const bool seen =
        running_attempts.count({start.job_id(), start.rank(), start.generation()}) > 0;
    if (stale || seen) {
      it = worker->unacked.erase(it);
      continue;
    }
    if (now - it->second.second > resend_after) {
      due.push_back(start);
      it->second.second = now;
    }
    ++it;
  }
  return due;
}

}  // namespace loom::controller
