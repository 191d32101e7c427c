#include "controller/workers/worker_liveness.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "controller/jobs/job_state_machine.h"
#include "controller/recovery/recovery_metrics.h"

namespace loom::controller {

using Worker = WorkerRegistry::Worker;
using RankSlot = WorkerRegistry::RankSlot;
using loom::v1::JobState;

WorkerLiveness::WorkerLiveness(JobTable* jobs, WorkerRegistry* workers, const Clock* clock,
                               FailureHandler* failures, Replanner* replanner,
                               ScheduleSignal* schedule, Options options)
    : jobs_(jobs),
      workers_(workers),
      clock_(clock),
      failures_(failures),
      replanner_(replanner),
      schedule_(schedule),
      options_(options) {}
absl::StatusOr<loom::v1::RegisterWorkerResponse> WorkerLiveness::Register(
    const loom::v1::RegisterWorkerRequest& req, Store::WorkerRow* row) {
  RETURN_IF_ERROR(WorkerRegistry::ValidateRegistration(req));
  // A node registering again means its previous daemon is gone: whatever
  // ran there is lost.
  if (auto old = workers_->RemoveNode(req.node())) {
    std::set<std::string> job_ids;
    for (const auto& r : old->ranks) job_ids.insert(r.job_id);  // none if it was dead
    for (const auto& jid : job_ids) {
      // (A rank of a job this controller does not know, as a worker may
      // report at registration, has no record to update: none is made.)
      JobRecord* found = jobs_->Find(jid);
      if (found == nullptr) continue;
      JobRecord& rec = *found;
      if (!IsAttemptRunningState(rec.job.state())) continue;
      std::string why = absl::StrCat("worker ", old->info.id(), " on node ", req.node(),
                                     " restarted; the ranks it ran are lost");
      ForgetWorkerRanks(old->info.id());
      failures_->FailOrRestart(rec, why, kCauseWorkerLost);
    }
    ForgetWorkerRanks(old->info.id());
  }
  Worker& w = workers_->Add(req);
  const std::string& id = w.info.id();
  *row = {id,         req.node(), req.address(),
          req.zone(), req.rack(), absl::ToUnixMillis(w.last_heartbeat)};
  AdoptRanks(w, req);
  schedule_->Request();  // capacity came
  loom::v1::RegisterWorkerResponse resp;
  resp.set_worker_id(id);
  resp.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  resp.set_lease_grace_ms(absl::ToInt64Milliseconds(options_.worker_timeout));
  return resp;
}

void WorkerLiveness::AdoptRanks(Worker& w, const loom::v1::RegisterWorkerRequest& req) {
  for (const loom::v1::RunningRank& r : req.running()) {
    JobRecord* jit = jobs_->Find(r.job_id());
    // Anything else is stopped by the next heartbeat (Heartbeat()).
    if (jit == nullptr || r.generation() != jit->job.generation()) continue;
    if (Adopt(*jit, w, r.rank())) {
      jit->live.insert({w.info.id(), r.rank()});
      jit->running_seen.insert(r.rank());
      const int gpu =
          jit->job.spec().resources().gpus_per_rank() > 0
              ? [&] {
                  for (const auto& a : jit->job.ranks()) {
                    if (a.rank() == r.rank()) return a.gpu();
                  }
                  return -1;
                }()
              : -1;
      workers_->HoldSlot(w, {r.job_id(), r.rank(), gpu});
    }
  }
}

bool WorkerLiveness::Adopt(JobRecord& rec, Worker& w, int rank) {
  if (!IsAttemptRunningState(rec.job.state()) || rec.adopt_deadline == absl::InfinitePast() ||
      rec.adopted.count(rank)) {
    return false;
  }
  loom::v1::RankAssignment* placed = nullptr;
  for (auto& a : *rec.job.mutable_ranks()) {
    if (a.rank() == rank) placed = &a;
  }
  if (placed == nullptr || placed->node() != w.info.node()) return false;
  placed->set_worker_id(w.info.id());
  rec.adopted.insert(rank);
  if (static_cast<int>(rec.adopted.size()) < rec.job.ranks_size()) return true;
  rec.adopt_deadline = absl::InfinitePast();
  // A rank failed meanwhile: the failure decides (FailureHandler::ResolveSettled).
  if (rec.pending_failure) return true;
  rec.across_controller_restart = false;  // later failures are the attempt's own
  loom::v1::RecoveryEvent ev;
  ev.set_kind(loom::v1::RecoveryEvent::READOPTED);
  ev.set_cause(kCauseControllerRestart);
  ev.set_generation(rec.job.generation());
  ev.set_step(rec.attempt_last_step);
  ev.set_message(absl::StrCat("re-adopted all ", rec.job.ranks_size(), " rank(s) of attempt ",
                              rec.job.generation(), " after ", recovered_because_,
                              "; no restart, nothing lost"));
  jobs_->AddEvent(rec, ev);
  jobs_->Persist(rec, 0);
  return true;
}

void WorkerLiveness::CheckAdoptions() {
  const absl::Time now = clock_->Now();
  // (A copy: a restart below may move the job between the sets.)
  const std::vector<std::string> unfinished(jobs_->unfinished().begin(), jobs_->unfinished().end());
  for (const std::string& jid : unfinished) {
    JobRecord& rec = *jobs_->Find(jid);
    if (rec.adopt_deadline == absl::InfinitePast() || now < rec.adopt_deadline) continue;
    rec.adopt_deadline = absl::InfinitePast();
    if (!IsAttemptRunningState(rec.job.state())) continue;
    // Every worker whose lease outlived the restart has re-registered by
    // now, and the others have killed their ranks; those re-adopted are
    // stopped with the attempt. The next attempt waits out the margin.
    rec.not_before = now + options_.lease_margin;
    const std::string why = absl::StrFormat(
        "the controller restarted and only %d of %d rank(s) were re-adopted within %.1fs",
        static_cast<int>(rec.adopted.size()), rec.job.ranks_size(),
        absl::ToDoubleSeconds(options_.worker_timeout + options_.lease_margin));
    rec.adopted.clear();
    failures_->FailOrRestart(rec, why, kCauseControllerRestart);
  }
}

absl::StatusOr<WorkerLiveness::Beat> WorkerLiveness::Heartbeat(
    const loom::v1::HeartbeatRequest& req, loom::v1::HeartbeatResponse* resp) {
  auto beat = workers_->RecordHeartbeat(req.worker_id(), req.rendezvous_port());
  if (!beat.ok()) return beat.status();
  Worker& w = *beat->worker;
  // A worker whose fresh rendezvous port was used gives the next one here:
  // that may let a job waiting for it be placed.
  const bool port_came = beat->rendezvous_port_came;
  // What the worker runs against the records (rank_reconciler.h).
  Beat out{&w, ReconcileRunningRanks(req, w, *jobs_)};
  for (loom::v1::StopRank& stop : out.seen.stops) {
    *resp->add_commands()->mutable_stop() = std::move(stop);
  }
  out.seen.stops.clear();
  for (const auto& [job_id, rank] : out.seen.confirmed) {
    JobRecord& rec = *jobs_->Find(job_id);
    rec.running_seen.insert(rank);
    if (rec.job.state() == loom::v1::SCHEDULED) {
      jobs_->Transition(rec, loom::v1::RUNNING,
                        absl::StrCat("rank ", rank, " started on ", w.info.node()));
    }
  }
  const std::set<std::pair<std::string, int>>& running = out.seen.running;
  // Slots held by ranks of ended jobs that are no longer running here are free.
  const bool freed = workers_->ReleaseSlotsIf(w, [&](const RankSlot& s) {
    JobRecord* jit = jobs_->Find(s.job_id);
    bool ended = jit == nullptr || !IsAttemptRunningState(jit->job.state());
    bool gone = ended && !running.count({s.job_id, s.rank});
    if (gone && jit != nullptr) jit->live.erase({w.info.id(), s.rank});
    return gone;
  });
  if (freed || port_came) schedule_->Request();
  return out;
}

void WorkerLiveness::SendCommands(Beat& beat, loom::v1::HeartbeatResponse* resp) {
  Worker& w = *beat.worker;
  // Confirmed starts; starts of attempts that ended are forgotten; the
  // rest are sent again after three heartbeat periods without a sign.
  const absl::Time now = clock_->Now();
  for (loom::v1::StartRank& start :
       DueStarts(beat.seen.running_attempts, *jobs_, now, 3 * options_.heartbeat_interval, &w)) {
    *resp->add_commands()->mutable_start() = std::move(start);
  }
  for (auto& c : w.pending_commands) {
    if (c.has_start()) w.unacked[{c.start().job_id(), c.start().rank()}] = {c.start(), now};
    *resp->add_commands() = std::move(c);
  }
  w.pending_commands.clear();
}

void WorkerLiveness::CheckLeases() {
  for (const WorkerRegistry::DepartedWorker& w : workers_->ExpireLeases()) {
    const std::string& id = w.info.id();
    std::map<std::string, std::vector<int>> lost;
    for (const auto& r : w.ranks) lost[r.job_id].push_back(r.rank);
    for (auto& [jid, ranks] : lost) {
      JobRecord* found = jobs_->Find(jid);
      if (found == nullptr) continue;  // a job this controller never knew
      JobRecord& rec = *found;
      // Its ranks may run until the worker's lease runs out.
      rec.not_before = std::max(rec.not_before,
                                w.last_heartbeat + options_.worker_timeout + options_.lease_margin);
      // Only the current attempt can fail; a requeued job merely stops
      // waiting for ranks that died with the worker.
      if (!IsAttemptRunningState(rec.job.state())) continue;
      std::string why = absl::StrFormat(
          "worker %s on node %s stopped heartbeating (silent for %.1fs, timeout %.1fs%s); "
          "lost rank(s) %s",
          id, w.info.node(), absl::ToDoubleSeconds(w.silent),
          absl::ToDoubleSeconds(options_.worker_timeout),
          w.paused > absl::ZeroDuration()
              ? absl::StrFormat(", %.1fs of it while the controller itself was paused",
                                absl::ToDoubleSeconds(w.paused))
              : "",
          absl::StrJoin(ranks, ","));
      ForgetWorkerRanks(id);
      // An elastic job goes on with what the cluster has left.
      if (replanner_ != nullptr && replanner_->Replan(rec, why, kCauseWorkerLost)) continue;
      failures_->FailOrRestart(rec, why, kCauseWorkerLost);
    }
    ForgetWorkerRanks(id);
  }
}

void WorkerLiveness::AwaitReadoption(const std::string& why) {
  recovered_because_ = why;
  for (const std::string& id : jobs_->unfinished()) {
    JobRecord& rec = *jobs_->Find(id);
    const loom::v1::JobState s = rec.job.state();
    if (s != loom::v1::SCHEDULED && s != loom::v1::RUNNING) continue;
    rec.attempt_last_step = rec.job.summary().last_step();
    // Its ranks keep training while their workers' leases run; the workers
    // re-register with them and they are re-adopted (AdoptRanks), or the
    // deadline passes (CheckAdoptions). Every worker whose lease outlived
    // the controller has re-registered well within G + M.
    rec.adopt_deadline = clock_->Now() + options_.worker_timeout + options_.lease_margin;
    // Ranks that finished training before the takeover are accounted for:
    // their exits were stored before they were acknowledged.
    rec.adopted = rec.exited_ok;
    rec.across_controller_restart = true;
  }
}

void WorkerLiveness::ForgetWorkerRanks(const std::string& worker_id) {
  for (auto& [jid, rec] : jobs_->records()) {
    for (auto it = rec.live.begin(); it != rec.live.end();) {
      it = it->first == worker_id ? rec.live.erase(it) : std::next(it);
    }
  }
}

}  // namespace loom::controller
