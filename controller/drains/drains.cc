#include "controller/drains/drains.h"

#include <algorithm>
#include <iostream>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "controller/jobs/job_state_machine.h"
#include "controller/recovery/recovery_metrics.h"

namespace loom::controller {
namespace {

absl::Status CheckReason(const std::string& reason) {
  if (reason.size() > Drains::kMaxReasonBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("reason: ", reason.size(), " bytes, more than ", Drains::kMaxReasonBytes));
  }
  return absl::OkStatus();
}

// "by user 'ada'", then ": <reason>" when one was given.
std::string Attributed(const std::string& by, const std::string& reason) {
  return absl::StrCat("by ", by.empty() ? std::string("the controller") : by,
                      reason.empty() ? "" : ": ", reason);
}

}  // namespace

Drains::Drains(JobTable* jobs, WorkerRegistry* workers, Preemptor* preemptor, Replanner* replanner,
               CheckpointCatalog* catalog, Store* store, ScheduleSignal* schedule,
               const Clock* clock)
    : jobs_(jobs),
      workers_(workers),
      preemptor_(preemptor),
      replanner_(replanner),
      catalog_(catalog),
      store_(store),
      schedule_(schedule),
      clock_(clock) {}

absl::Status Drains::CheckNode(const std::string& node) const {
  if (node.empty()) return absl::InvalidArgumentError("node: must not be empty");
  if (node.size() > 256) return absl::InvalidArgumentError("node: longer than 256 bytes");
  if (!workers_->HasNode(node)) {
    return absl::NotFoundError(absl::StrCat("no worker has registered from node \"", node,
                                            "\" (`loomctl workers` lists the nodes)"));
  }
  return absl::OkStatus();
}

absl::Status Drains::Put(const std::string& node, absl::Time until, const std::string& reason) {
  // The store first: a cordon the store did not take would vanish at the
  // next failover, so the caller hears of it and nothing changes.
  if (absl::Status s =
          store_->PutCordon({node, WorkerRegistry::CordonEndToUnixMillis(until), reason});
      !s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("the cordon of node ", node, " could not be stored: ", s.message()));
  }
  workers_->Uncordon(node);  // an operator's cordon replaces whatever was there
  notice_cordons_.erase(node);
  workers_->Cordon(node, until, reason);
  return absl::OkStatus();
}

google::protobuf::RepeatedPtrField<loom::v1::WorkerInfo> Drains::WorkersOf(
    const std::string& node) const {
  google::protobuf::RepeatedPtrField<loom::v1::WorkerInfo> out;
  for (loom::v1::WorkerInfo& w : workers_->List()) {
    if (w.node() == node) *out.Add() = std::move(w);
  }
  return out;
}

absl::StatusOr<loom::v1::CordonNodeResponse> Drains::Cordon(
    const loom::v1::CordonNodeRequest& request, const std::string& by) {
  if (absl::Status s = CheckNode(request.node()); !s.ok()) return s;
  if (absl::Status s = CheckReason(request.reason()); !s.ok()) return s;
  if (request.seconds() < 0 || request.seconds() > kMaxCordonSeconds) {
    return absl::InvalidArgumentError(absl::StrCat("seconds: ", request.seconds(),
                                                   " is outside [0, ", kMaxCordonSeconds,
                                                   "] (0: until uncordoned)"));
  }
  const absl::Time until = request.seconds() == 0
                               ? absl::InfiniteFuture()
                               : clock_->Now() + absl::Seconds(request.seconds());
  if (absl::Status s =
          Put(request.node(), until, absl::StrCat("cordoned ", Attributed(by, request.reason())));
      !s.ok()) {
    return s;
  }
  if (until != absl::InfiniteFuture()) schedule_->RequestBy(until);  // placement resumes then
  loom::v1::CordonNodeResponse out;
  *out.mutable_workers() = WorkersOf(request.node());
  return out;
}

absl::StatusOr<loom::v1::CordonNodeResponse> Drains::Uncordon(
    const loom::v1::UncordonNodeRequest& request, const std::string& by) {
  if (absl::Status s = CheckNode(request.node()); !s.ok()) return s;
  // Stored as a cordon that has ended: a restarted controller loads none.
  if (absl::Status s = store_->PutCordon({request.node(), clock_->NowUnixMillis(),
                                          absl::StrCat("uncordoned ", Attributed(by, ""))});
      !s.ok()) {
    return absl::UnavailableError(absl::StrCat("the end of node ", request.node(),
                                               "'s cordon could not be stored: ", s.message()));
  }
  workers_->Uncordon(request.node());
  notice_cordons_.erase(request.node());
  schedule_->Request();  // its slots can take ranks again
  loom::v1::CordonNodeResponse out;
  *out.mutable_workers() = WorkersOf(request.node());
  return out;
}

absl::StatusOr<loom::v1::DrainNodeResponse> Drains::Drain(const loom::v1::DrainNodeRequest& request,
                                                          const std::string& by) {
  const std::string& node = request.node();
  if (absl::Status s = CheckNode(node); !s.ok()) return s;
  if (absl::Status s = CheckReason(request.reason()); !s.ok()) return s;
  if (request.deadline_seconds() < 0 || request.deadline_seconds() > kMaxDeadlineSeconds) {
    return absl::InvalidArgumentError(absl::StrCat("deadline_seconds: ", request.deadline_seconds(),
                                                   " is outside [0, ", kMaxDeadlineSeconds,
                                                   "] (0: the queues' preemption grace)"));
  }
  return DrainFor(node, absl::Seconds(request.deadline_seconds()), absl::InfiniteFuture(),
                  Attributed(by, request.reason()));
}

void Drains::Notice(const loom::v1::WorkerInfo& worker, const loom::v1::NodeNotice& notice) {
  const std::string& node = worker.node();
  const absl::Time now = clock_->Now();
  const absl::Time deadline = absl::FromUnixMillis(notice.deadline_unix_ms());
  // By worker: a node's daemon that registers again (a new id) is a new
  // worker, whose notice is its own.
  for (auto it = noticed_.begin(); it != noticed_.end();) {
    it = it->second + absl::Minutes(1) <= now ? noticed_.erase(it) : std::next(it);
  }
  auto it = noticed_.find(worker.id());
  if (it != noticed_.end() && deadline >= it->second) return;  // already acted on
  if (deadline + absl::Minutes(1) <= now) return;              // stale: the node outlived it
  noticed_[worker.id()] = deadline;
  const absl::Duration left =
      std::max(absl::Seconds(1), absl::Ceil(deadline - now, absl::Seconds(1)));
  std::string source = notice.source().substr(0, 64);
  std::string detail = notice.detail().substr(0, kMaxReasonBytes);
  const std::string who =
      absl::StrFormat("by worker %s: %s notice, %.0fs before the node goes%s%s", worker.id(),
                      source.empty() ? "a" : source, absl::ToDoubleSeconds(left),
                      detail.empty() ? "" : "; ", detail);
  absl::StatusOr<loom::v1::DrainNodeResponse> drained = DrainFor(
      node, std::min(left, absl::Seconds(kMaxDeadlineSeconds)), deadline + absl::Minutes(1), who);
  if (!drained.ok()) {
    noticed_.erase(worker.id());  // the next heartbeat tries again
    std::cerr << "loom-controller: node " << node << "'s notice: " << drained.status() << std::endl;
    return;
  }
  notice_cordons_[node] = worker.id();
  std::cerr << "loom-controller: node " << node << " drains (" << who
            << "): " << drained->moving_job_ids_size() << " job(s) moving" << std::endl;
}

absl::StatusOr<loom::v1::DrainNodeResponse> Drains::DrainFor(const std::string& node,
                                                             absl::Duration deadline,
                                                             absl::Time cordon_until,
                                                             const std::string& who) {
  if (absl::Status s = Put(node, cordon_until, absl::StrCat("drained ", who)); !s.ok()) {
    return s;
  }
  const absl::Time now = clock_->Now();
  last_drain_ = now;
  drained_lately_.insert(node);
  for (const auto& [id, generation] : replans_) {  // they wait for this one too
    if (JobRecord* waiting = jobs_->Find(id)) waiting->not_before = now + kSettle;
  }
  loom::v1::DrainNodeResponse out;
  for (const std::string& id : jobs_->unfinished()) {
    JobRecord& rec = *jobs_->Find(id);
    if (!IsAttemptRunningState(rec.job.state()) || rec.pending_failure) continue;
    const bool there =
        std::any_of(rec.job.ranks().begin(), rec.job.ranks().end(),
                    [&](const loom::v1::RankAssignment& a) { return a.node() == node; });
    if (!there) continue;
    out.add_moving_job_ids(id);
    if (rec.preempting) {
      // Already saving to move (a preemption, a re-plan): it leaves the
      // node with that move, by the drain's deadline at the latest.
      if (deadline > absl::ZeroDuration()) {
        rec.preempting->deadline = std::min(rec.preempting->deadline, now + deadline);
      }
      continue;
    }
    const bool elastic = replanner_ != nullptr && rec.job.spec().has_elastic();
    const std::string then = elastic ? "then it is re-planned without the node"
                                     : "then it is placed again on other workers";
    loom::v1::RecoveryEvent ev;
    ev.set_kind(loom::v1::RecoveryEvent::DRAINING);
    ev.set_cause(kCauseDrain);
    ev.set_step(std::max<int64_t>(0, rec.attempt_last_step));
    ev.set_generation(rec.job.generation());
    if (rec.job.state() == loom::v1::SCHEDULED) {
      // No step of this attempt has run: a plain stop loses nothing.
      ev.set_message(absl::StrFormat(
          "node %s is draining (%s); the job's ranks had not started training, so they stop "
          "without a save; %s",
          node, who, then));
      jobs_->AddEvent(rec, ev);
      PreemptionInProgress p;
      p.intent = MoveIntent::kDrain;
      p.since = now;
      p.deadline = now;
      p.forced = true;
      p.reason = kCauseDrain;
      p.message = who;
      p.away_from_node = node;
      rec.preempting = std::move(p);
      preemptor_->Finish(rec);
      continue;
    }
    PreemptionInProgress& p = preemptor_->SaveAndStopToMove(
        rec, MoveIntent::kDrain, kCauseDrain, absl::StrCat("moving off draining node ", node),
        absl::StrCat("node ", node, " is draining: save a checkpoint, then stop"));
    p.away_from_node = node;
    p.message = who;
    if (deadline > absl::ZeroDuration()) p.deadline = now + deadline;
    ev.set_message(absl::StrFormat(
        "node %s is draining (%s); asked the ranks to save a checkpoint at the next step "
        "boundary and stop within %.0fs, %s",
        node, who, absl::ToDoubleSeconds(p.deadline - now), then));
    jobs_->AddEvent(rec, ev);
    jobs_->Persist(rec, 0);
  }
  schedule_->Request();
  *out.mutable_workers() = WorkersOf(node);
  return out;
}

void Drains::FinishMove(JobRecord& rec, const PreemptionInProgress& move) {
  const absl::Time now = clock_->Now();
  // Without a save in time: the newest checkpoint, or the newest in-memory
  // snapshot a node that stays holds (the drained node's goes with it).
  const int64_t newest_checkpoint = catalog_->NewestGoodStep(rec.job.id(), -1);
  const int64_t checkpoint =
      ResumePointAfterLoss(rec, newest_checkpoint, [&](const std::string& node) {
        return node != move.away_from_node && workers_->NodeAlive(node);
      });
  const int64_t lost =
      std::max<int64_t>(0, rec.attempt_last_step - std::max<int64_t>(0, checkpoint));
  const std::string from = checkpoint > newest_checkpoint
                               ? absl::StrCat("the in-memory snapshot at step ", checkpoint)
                           : checkpoint > 0 ? absl::StrCat("the checkpoint at step ", checkpoint)
                                            : "the start";
  std::string what;
  if (move.step_at_ask < 0 && rec.attempt_last_step < 0) {
    what = absl::StrCat("before its ranks trained a step: nothing lost; it resumes from ", from);
  } else if (lost == 0) {
    what = absl::StrFormat(
        "every rank stopped %.1fs after the request, with the checkpoint at step %d: 0 steps lost",
        absl::ToDoubleSeconds(now - move.since), checkpoint);
  } else {
    what = absl::StrFormat(
        "no checkpoint committed in time (%s); it resumes from %s: %d step(s) lost",
        move.forced ? "stopped at the deadline" : "the ranks stopped without one", from, lost);
  }
  loom::v1::RecoveryEvent ev;
  ev.set_kind(loom::v1::RecoveryEvent::DRAINED);
  ev.set_cause(kCauseDrain);
  ev.set_step(std::max<int64_t>(0, rec.attempt_last_step));
  ev.set_checkpoint_step(checkpoint);
  ev.set_steps_lost(lost);
  ev.set_resume_step(-1);
  ev.set_generation(rec.job.generation() + 1);
  ev.set_message(
      absl::StrCat("drained off node ", move.away_from_node, " (", move.message, "): ", what));
  jobs_->AddEvent(rec, ev);
  const std::string why = absl::StrCat("node ", move.away_from_node, " was drained");
  const bool elastic = replanner_ != nullptr && rec.job.spec().has_elastic();
  if (elastic && now < last_drain_ + kSettle) {
    // Other nodes of its pool may be drained next: re-planned once they
    // have settled (Tick), without them all.
    rec.job.set_resume_step(-1);
    jobs_->Requeue(rec, absl::StrFormat("%s; re-planned once no node has drained for %.0fs", why,
                                        absl::ToDoubleSeconds(kSettle)));
    rec.not_before = last_drain_ + kSettle;
    replans_[rec.job.id()] = rec.job.layout_generation();
    schedule_->RequestBy(rec.not_before);
    return;
  }
  if (!elastic || !replanner_->Replan(rec, why, kCauseDrain)) {
    rec.job.set_resume_step(-1);
    jobs_->Requeue(rec, absl::StrCat(why, "; placed again without it (no restart counted)"));
  }
  schedule_->Request();
}

void Drains::Tick() {
  if (replans_.empty()) {
    if (clock_->Now() >= last_drain_ + kSettle) drained_lately_.clear();
    return;
  }
  if (clock_->Now() < last_drain_ + kSettle) return;
  std::string nodes;
  for (const std::string& n : drained_lately_)
    absl::StrAppend(&nodes, nodes.empty() ? "" : ", ", n);
  const std::string why =
      absl::StrCat(drained_lately_.size() == 1 ? "node " : "nodes ", nodes,
                   drained_lately_.size() == 1 ? " was drained" : " were drained");
  for (const auto& [id, generation] : replans_) {
    JobRecord* rec = jobs_->Find(id);
    // Placed, ended or re-planned meanwhile: nothing to do.
    if (rec == nullptr || rec->job.state() != loom::v1::PENDING ||
        rec->job.layout_generation() != generation) {
      continue;
    }
    rec->not_before = absl::InfinitePast();
    // When no gang plans without them, it waits for its own, as it is.
    replanner_->Replan(*rec, why, kCauseDrain);
  }
  replans_.clear();
  drained_lately_.clear();
  schedule_->Request();
}

void Drains::Registered(const std::string& node, const std::string& worker_id) {
  auto it = notice_cordons_.find(node);
  if (it == notice_cordons_.end() || it->second == worker_id) return;
  notice_cordons_.erase(it);
  if (absl::Status s = store_->PutCordon(
          {node, clock_->NowUnixMillis(),
           absl::StrCat("uncordoned: a new worker (", worker_id, ") registered from the node")});
      !s.ok()) {
    std::cerr << "loom-controller: could not record the end of node " << node << "'s cordon: " << s
              << std::endl;
  }
  workers_->Uncordon(node);
  schedule_->Request();
}

}  // namespace loom::controller
