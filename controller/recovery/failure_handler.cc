#include "controller/recovery/failure_handler.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "controller/jobs/job_state_machine.h"

namespace loom::controller {

using Worker = WorkerRegistry::Worker;
using RankSlot = WorkerRegistry::RankSlot;
using loom::v1::JobState;

FailureHandler::FailureHandler(JobTable* jobs, RankCommands* ranks, WorkerRegistry* workers,
                               CheckpointCatalog* catalog, const Clock* clock,
                               RecoveryMetrics* metrics, Replanner* replanner, Options options)
    : jobs_(jobs),
      ranks_(ranks),
      workers_(workers),
      catalog_(catalog),
      clock_(clock),
      metrics_(metrics),
      replanner_(replanner),
      options_(options),
      recovery_(RecoveryPolicyOptions{options.max_rendezvous_retries}) {}

void FailureHandler::OnRankExit(JobRecord& rec, const loom::v1::ReportRankExitRequest& req,
                                const std::string& node) {
  if (req.exit_code() == 0 && req.signal() == 0) {
    jobs_->RankFinished(rec, req.rank());
    if (static_cast<int>(rec.exited_ok.size()) == rec.job.ranks_size()) {
      jobs_->Transition(rec, loom::v1::SUCCEEDED,
                        absl::StrCat("all ", rec.job.ranks_size(), " ranks finished training"));
    }
    return;
  }
  std::string how = req.signal() != 0 ? absl::StrCat("was killed by signal ", req.signal())
                                      : absl::StrCat("exited with code ", req.exit_code());
  std::string why = absl::StrCat("rank ", req.rank(), " on ", node, " ", how,
                                 req.reason().empty() ? "" : ": ", req.reason());
  if (!rec.pending_failure) {
    // The other ranks cannot go on without this one: stop them now, and
    // decide the job's reason once the failure has settled.
    // A rank that could not join its groups before any step: nothing
    // was computed (see Options::max_rendezvous_retries).
    const bool rendezvous =
        RecoveryPolicy::IsRendezvousFailure(req.exit_code(), req.signal(), rec.attempt_last_step);
    rec.pending_failure = PendingFailure{clock_->Now(), why, rendezvous, "", ""};
    ranks_->Stop(rec, why, "");
  }
  // Any rank that could not join before a step was reported makes the
  // attempt one that never trained, whichever exit came first: a peer that
  // joined and then lost this one in its first collective exits with
  // another code, and often first.
  if (RecoveryPolicy::IsRendezvousFailure(req.exit_code(), req.signal(), rec.attempt_last_step)) {
    rec.pending_failure->rendezvous = true;
  }
  // Rank 0's reason says which checkpoints failed which check, or which
  // save found the volume full; the other ranks' (often first) only that
  // rank 0 failed.
  if (std::string because = RecoveryPolicy::NoRestartBecause(req.exit_code(), req.signal());
      !because.empty()) {
    rec.pending_failure->no_restart_because = std::move(because);
    rec.pending_failure->reason = why;
  }
  if (req.lease_expired() && rec.pending_failure->cause_kind.empty()) {
    // Its worker lost the controller (a peer that failed first lost this
    // rank): during a re-adoption after a controller restart that is the
    // restart's doing.
    rec.pending_failure->cause_kind =
        RecoveryPolicy::LeaseExpiredCauseKind(rec.across_controller_restart);
    if (!absl::StrContains(rec.pending_failure->reason, "lease")) {
      absl::StrAppend(&rec.pending_failure->reason, "; rank ", req.rank(), " on ", node,
                      " was killed when its worker's lease ran out");
    }
  }
}
void FailureHandler::ResolveSettled() {
  absl::Time now = clock_->Now();
  const std::vector<std::string> unfinished(jobs_->unfinished().begin(), jobs_->unfinished().end());
  for (const std::string& jid : unfinished) {
    JobRecord& rec = *jobs_->Find(jid);
    if (!rec.pending_failure || IsTerminalJobState(rec.job.state())) continue;
    if (now - rec.pending_failure->at < options_.failure_settle_time) continue;
    // Re-adopting after a controller restart: the other workers' backlogs
    // (the checkpoints their ranks committed while the controller was
    // away, their exits) are still coming; decide once every rank is
    // accounted for, or at the deadline (WorkerLiveness::CheckAdoptions).
    if (rec.adopt_deadline != absl::InfinitePast() &&
        static_cast<int>(rec.adopted.size()) < rec.job.ranks_size()) {
      continue;
    }
    // A worker of this job that went silent is the likelier root cause than
    // a rank that lost its peer.
    std::string cause;
    std::set<std::string> seen;
    for (const auto& r : rec.job.ranks()) {
      if (!seen.insert(r.worker_id()).second) continue;
      const Worker* w = workers_->Find(r.worker_id());
      if (w == nullptr) continue;
      // Counted as its lease counts it (the controller's own pauses left out).
      absl::Duration silent = now - w->lease_from;
      if (!w->info.alive() || silent > options_.failure_settle_time) {
        cause = absl::StrFormat("worker %s on node %s stopped heartbeating (silent for %.1fs); ",
                                r.worker_id(), r.node(), absl::ToDoubleSeconds(silent));
        break;
      }
    }
    PendingFailure& failure = *rec.pending_failure;
    SettledFailure settled;
    settled.worker_went_silent = !cause.empty();
    settled.across_controller_restart = rec.across_controller_restart;
    settled.cause_kind = failure.cause_kind;
    settled.rendezvous = failure.rendezvous;
    settled.rendezvous_retries = rec.rendezvous_retries;
    settled.no_restart_because = failure.no_restart_because;
    const FailureDecision decision = recovery_.DecideFailure(settled);
    // Still awaiting re-adoption after a controller restart: the restart
    // is named as the root cause (RecoveryPolicy::DecideFailure).
    if (decision.blame_controller_restart) {
      cause = "the controller restarted while the attempt ran; ";
      failure.cause_kind = decision.cause_kind;
    }
    std::string why = cause.empty() ? failure.reason : absl::StrCat(cause, "then ", failure.reason);
    if (decision.action == FailureDecision::kPlaceAgain) {
      rec.rendezvous_retries += 1;
      jobs_->Requeue(rec, absl::StrCat(why,
                                       "; no step had run, so the attempt is placed again "
                                       "(rendezvous retry ",
                                       rec.rendezvous_retries, "/", options_.max_rendezvous_retries,
                                       ", no restart counted)"));
      continue;
    }
    if (decision.action == FailureDecision::kFailWithoutRestart) {
      FailWithoutRestart(rec, why, failure.no_restart_because);
      continue;
    }
    // A worker of an elastic job went silent: it goes on without it.
    if (settled.worker_went_silent && replanner_ != nullptr &&
        replanner_->Replan(rec, why, kCauseWorkerLost)) {
      continue;
    }
    FailOrRestart(rec, why, decision.cause_kind);
  }
}

void FailureHandler::FailWithoutRestart(JobRecord& rec, const std::string& cause,
                                        const std::string& because) {
  loom::v1::RecoveryEvent gave_up;
  gave_up.set_kind(loom::v1::RecoveryEvent::GAVE_UP);
  gave_up.set_message(
      absl::StrCat(because, ", so a restart cannot help (no restart spent): ", cause));
  jobs_->AddEvent(rec, gave_up);
  ranks_->Stop(rec, cause, "");
  jobs_->Transition(rec, loom::v1::FAILED, cause);
}

void FailureHandler::FailOrRestart(JobRecord& rec, const std::string& cause,
                                   const std::string& cause_kind) {
  if (IsTerminalJobState(rec.job.state())) return;
  RecoveryOptions o = RecoveryPolicy::EffectiveRecovery(rec.job.spec().recovery());
  if (!RecoveryPolicy::RestartsLeft(rec.job.restarts(), o)) {
    if (o.max_restarts > 0) {
      loom::v1::RecoveryEvent gave_up;
      gave_up.set_kind(loom::v1::RecoveryEvent::GAVE_UP);
      gave_up.set_message(
          absl::StrCat("no restarts left (max_restarts ", o.max_restarts, "): ", cause));
      jobs_->AddEvent(rec, gave_up);
    }
    ranks_->Stop(rec, cause, "");
    std::string why = o.max_restarts > 0
                          ? absl::StrCat(cause, " (after ", rec.job.restarts(), " restart(s))")
                          : cause;
    jobs_->Transition(rec, loom::v1::FAILED, why);
    return;
  }
  rec.job.set_restarts(rec.job.restarts() + 1);
  rec.job.set_resume_step(-1);
  // The newest state a live node still holds in memory, if newer than the
  // newest checkpoint (the ranks take it: worker/engine/resume.h).
  const int64_t newest_checkpoint = catalog_->NewestGoodStep(rec.job.id(), -1);
  // (A node whose worker went silent, as ResolveSettled judges it, counts
  // as lost: its lease may not have run out yet.)
  const absl::Time now = clock_->Now();
  const int64_t checkpoint =
      ResumePointAfterLoss(rec, newest_checkpoint, [&](const std::string& node) {
        const Worker* w = workers_->FindByNode(node);
        return w != nullptr && w->info.alive() &&
               now - w->lease_from <= options_.failure_settle_time;
      });
  int64_t lost = std::max<int64_t>(0, rec.attempt_last_step - checkpoint);
  loom::v1::RecoveryEvent ev;
  ev.set_kind(loom::v1::RecoveryEvent::RESTART);
  ev.set_message(cause);
  ev.set_cause(cause_kind);
  ev.set_resume_step(-1);
  ev.set_checkpoint_step(checkpoint);
  ev.set_steps_lost(lost);
  ev.set_generation(rec.job.generation() + 1);
  jobs_->AddEvent(rec, ev);
  if (metrics_ != nullptr) metrics_->RecordRecovery(rec.job.id(), "restart", cause_kind, lost, 0);
  jobs_->Requeue(rec, absl::StrCat("restart ", rec.job.restarts(), "/", o.max_restarts,
                                   checkpoint > newest_checkpoint
                                       ? absl::StrCat(" from the in-memory snapshot at step ",
                                                      checkpoint, " after: ")
                                       : std::string(" from the newest checkpoint after: "),
                                   cause));
}

}  // namespace loom::controller
