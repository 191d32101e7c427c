#include "controller/preemption/preemptor.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rank_exit.h"
#include "controller/jobs/job_state_machine.h"

namespace loom::controller {

using loom::v1::JobState;

Preemptor::Preemptor(JobTable* jobs, RankCommands* ranks, CheckpointCatalog* catalog,
                     const Clock* clock, RecoveryMetrics* metrics,
                     const scheduling::QueueConfig* queues)
    : jobs_(jobs),
      ranks_(ranks),
      catalog_(catalog),
      clock_(clock),
      metrics_(metrics),
      queues_(queues) {}

void Preemptor::Preempt(JobRecord& rec, const scheduling::Preemption& preemption) {
  if (!IsAttemptRunningState(rec.job.state()) || rec.preempting || rec.pending_failure) return;
  const absl::Time now = clock_->Now();
  PreemptionInProgress p;
  p.since = now;
  p.deadline = now + queues_->preemption_grace;
  p.for_job_id = preemption.for_job_id;
  p.reason = scheduling::PreemptionReasonName(preemption.reason);
  p.message = preemption.message;
  p.step_at_ask = rec.attempt_last_step;
  loom::v1::RecoveryEvent ev;
  ev.set_kind(loom::v1::RecoveryEvent::PREEMPTING);
  ev.set_cause(p.reason);
  ev.set_step(std::max<int64_t>(0, rec.attempt_last_step));
  ev.set_generation(rec.job.generation());
  if (rec.job.state() == loom::v1::SCHEDULED) {
    // No step of this attempt has run: its newest checkpoint is where it
    // started, so a plain stop loses nothing.
    ev.set_message(absl::StrCat(preemption.message,
                                "; its ranks had not started training, so "
                                "they stop without a save"));
    p.forced = true;
    rec.preempting = std::move(p);
    jobs_->AddEvent(rec, ev);
    Finish(rec);
    return;
  }
  ev.set_message(absl::StrFormat(
      "%s; asked its ranks to save a checkpoint at the next step boundary and stop (grace %.0fs)",
      preemption.message, absl::ToDoubleSeconds(queues_->preemption_grace)));
  rec.preempting = std::move(p);
  jobs_->AddEvent(rec, ev);
  rec.job.set_reason(absl::StrCat("preempting for job ", preemption.for_job_id,
                                  ": saving a checkpoint at the next step boundary"));
  ranks_->SaveAndStop(rec, absl::StrCat("preempted for job ", preemption.for_job_id,
                                        ": save a checkpoint, then stop"));
  // The ask is in the job's events (and the event log) before the ranks act.
  jobs_->Persist(rec, 0);
}

PreemptionInProgress& Preemptor::SaveAndStopToMove(JobRecord& rec, MoveIntent intent,
                                                   const std::string& cause_kind,
                                                   const std::string& doing,
                                                   const std::string& stop_reason) {
  const absl::Time now = clock_->Now();
  PreemptionInProgress p;
  p.since = now;
  p.deadline = now + queues_->preemption_grace;
  p.intent = intent;
  p.reason = cause_kind;
  p.step_at_ask = rec.attempt_last_step;
  rec.preempting = std::move(p);
  rec.job.set_reason(absl::StrCat(doing, ": saving a checkpoint at the next step boundary"));
  ranks_->SaveAndStop(rec, stop_reason);
  return *rec.preempting;
}

void Preemptor::CheckGraces() {
  const absl::Time now = clock_->Now();
  for (const std::string& jid : jobs_->unfinished()) {
    JobRecord& rec = *jobs_->Find(jid);
    if (!rec.preempting) continue;
    if (!IsAttemptRunningState(rec.job.state())) {
      rec.preempting.reset();  // cancelled, failed or requeued meanwhile
      continue;
    }
    PreemptionInProgress& p = *rec.preempting;
    if (p.forced || now < p.deadline) continue;
    p.forced = true;
    std::string doing;
    switch (p.intent) {
      case MoveIntent::kPreempt:
        doing = absl::StrCat("preempted for job ", p.for_job_id);
        break;
      case MoveIntent::kGrow:
        doing = absl::StrCat("growing to ", p.grow_to, " rank(s)");
        break;
      case MoveIntent::kAwayFromNode:
        doing = absl::StrCat("moving off slow node ", p.away_from_node);
        break;
      case MoveIntent::kReplanAround:
        doing = "re-splitting its pipeline around a slow node";
        break;
      case MoveIntent::kDrain:
        doing = absl::StrCat("moving off draining node ", p.away_from_node);
        break;
    }
    const std::string why = absl::StrFormat(
        "%s: no checkpoint committed within the grace of %.0fs; stopping without one", doing,
        absl::ToDoubleSeconds(p.deadline - p.since));
    rec.job.set_reason(why);
    ranks_->Stop(rec, why, "");
  }
}

bool Preemptor::OnRankExit(JobRecord& rec, const loom::v1::ReportRankExitRequest& req) {
  if ((!rec.preempting && req.exit_code() != kRankExitSavedAndStopped) || rec.pending_failure) {
    return false;
  }
  // Every exit of a moving attempt is part of the move (a rank may end it
  // by finishing training, by saving and stopping, or by the plain stop
  // after the grace). Ranks that saved and stopped while no move was known
  // (across a controller restart) are taken as a preemption. Once every
  // rank is gone the move finishes, unless all of them finished training.
  if (!rec.preempting) {
    PreemptionInProgress p;
    p.since = clock_->Now();
    p.deadline = absl::InfiniteFuture();
    p.message = "its ranks saved and stopped while the controller was away";
    p.step_at_ask = rec.attempt_last_step;
    rec.preempting = std::move(p);
  }
  if (req.exit_code() == 0 && req.signal() == 0) jobs_->RankFinished(rec, req.rank());
  if (static_cast<int>(rec.exited_ok.size()) == rec.job.ranks_size()) {
    rec.preempting.reset();
    jobs_->Transition(rec, loom::v1::SUCCEEDED,
                      absl::StrCat("all ", rec.job.ranks_size(),
                                   " ranks finished training before the preemption took effect"));
  } else if (rec.live.empty()) {
    Finish(rec);
  }
  return true;
}

void Preemptor::Finish(JobRecord& rec) {
  const absl::Time now = clock_->Now();
  PreemptionInProgress p = rec.preempting.value_or(PreemptionInProgress{});
  rec.preempting.reset();
  if (p.intent != MoveIntent::kPreempt) {
    auto handler = handlers_.find(p.intent);
    if (handler != handlers_.end()) {
      handler->second->FinishMove(rec, p);
      return;
    }
    // No handler for the move (a controller built without that
    // subsystem): placed again as it was, from its newest checkpoint.
    rec.job.set_resume_step(-1);
    jobs_->Requeue(rec, "its ranks saved and stopped; placed again as it was");
    return;
  }
  // Without a save in time: the newest checkpoint, or the newest in-memory
  // snapshot its nodes hold (a preemption loses no node).
  const int64_t newest_checkpoint = catalog_->NewestGoodStep(rec.job.id(), -1);
  const int64_t checkpoint =
      ResumePointAfterLoss(rec, newest_checkpoint, [](const std::string&) { return true; });
  const char* const kept = checkpoint > newest_checkpoint ? "in-memory snapshot" : "checkpoint";
  const int64_t lost = std::max<int64_t>(0, rec.attempt_last_step - checkpoint);
  rec.job.set_preemptions(rec.job.preemptions() + 1);
  rec.job.set_resume_step(-1);
  loom::v1::RecoveryEvent ev;
  ev.set_kind(loom::v1::RecoveryEvent::PREEMPTED);
  ev.set_cause(p.reason);
  ev.set_step(std::max<int64_t>(0, rec.attempt_last_step));
  ev.set_checkpoint_step(checkpoint);
  ev.set_steps_lost(lost);
  ev.set_resume_step(-1);
  ev.set_generation(rec.job.generation() + 1);
  const std::string for_job =
      p.for_job_id.empty() ? std::string("another job") : absl::StrCat("job ", p.for_job_id);
  std::string message;
  if (p.step_at_ask < 0) {
    message = absl::StrFormat(
        "preempted for %s before its ranks trained a step; nothing lost. It waits in its queue "
        "and resumes from %s",
        for_job,
        checkpoint > 0 ? absl::StrCat("the ", kept, " at step ", checkpoint)
                       : std::string("the start"));
  } else if (lost == 0) {
    message = absl::StrFormat(
        "preempted for %s: every rank stopped %.1fs after the request, with the %s at step %d "
        "committed; 0 steps lost. It waits in its queue and resumes from it",
        for_job, absl::ToDoubleSeconds(now - p.since), kept, checkpoint);
  } else {
    message = absl::StrFormat(
        "preempted for %s: the ranks stopped %.1fs after the request%s; the newest %s is at step "
        "%d, so %d step(s) after it are lost. It waits in its queue and resumes from it",
        for_job, absl::ToDoubleSeconds(now - p.since),
        p.forced ? " without a save (the grace ran out)" : "", kept, checkpoint, lost);
  }
  ev.set_message(message);
  jobs_->AddEvent(rec, ev);
  if (metrics_ != nullptr) {
    const std::string queue = rec.job.spec().scheduling().queue().empty()
                                  ? std::string(scheduling::kDefaultQueue)
                                  : rec.job.spec().scheduling().queue();
    metrics_->RecordPreemption(rec.job.id(), queue, p.reason, lost);
  }
  jobs_->Requeue(rec, message, loom::v1::PREEMPTED);
}

}  // namespace loom::controller
