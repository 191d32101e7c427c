#include "controller/recovery/rollbacks.h"

#include <unistd.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/jobspec.h"
#include "controller/jobs/job_state_machine.h"
#include "controller/recovery/recovery_policy.h"

namespace loom::controller {

using loom::v1::JobState;

Rollbacks::Rollbacks(JobTable* jobs, CheckpointCatalog* catalog, Store* store,
                     RecoveryMetrics* metrics)
    : jobs_(jobs), catalog_(catalog), store_(store), metrics_(metrics) {}

absl::Status Rollbacks::ValidateRequest(const loom::v1::RollbackJobRequest& req) {
  if (req.to_step() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("to_step: must be >= 0 (0 = from scratch), got ", req.to_step()));
  }
  if (req.to_step() > 1000000000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "to_step: must be <= 1000000000 (the most steps a job has), got ", req.to_step()));
  }
  return ValidateSkipBatches(req.skip(), "skip");
}

absl::Status Rollbacks::Operator(JobRecord& rec, const loom::v1::RollbackJobRequest& req) {
  if (rec.job.state() != loom::v1::RUNNING) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", req.job_id(), " is ", JobState_Name(rec.job.state()),
                     "; only a RUNNING job can be rolled back",
                     IsTerminalJobState(rec.job.state()) ? "" : " (wait until it runs)"));
  }
  if (rec.attempt_last_step < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", req.job_id(),
                     " has not reported a step in this attempt yet; nothing to roll "
                     "back"));
  }
  if (req.to_step() > rec.attempt_last_step) {
    return absl::InvalidArgumentError(
        absl::StrCat("to_step: ", req.to_step(), " is beyond the job's last step ",
                     rec.attempt_last_step, "; roll back to a step it has reached"));
  }
  int64_t checkpoint = catalog_->NewestGoodStep(rec.job.id(), req.to_step());
  if (checkpoint == 0 && req.to_step() > 0) {
    // Silently starting over would throw away far more than asked for.
    int64_t oldest = -1;
    auto catalog = store_->LoadCheckpoints(rec.job.id());
    if (catalog.ok()) {
      for (const auto& c : *catalog) {
        if (access(c.path().c_str(), F_OK) == 0 && (oldest < 0 || c.step() < oldest)) {
          oldest = c.step();
        }
      }
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "to_step: no checkpoint of job ", req.job_id(), " at or before step ", req.to_step(),
        " is on disk", oldest > 0 ? absl::StrCat(" (the oldest kept is step ", oldest, ")") : "",
        "; pass --to-step 0 to start over from scratch",
        oldest > 0 ? absl::StrCat(", or a step >= ", oldest) : ""));
  }
  // Batches trained up to the checkpoint stay trained (RecoveryPolicy::
  // FirstUndoneBatch): a range is clipped to start at the first batch the
  // rollback undoes.
  auto clipped = RecoveryPolicy::ClipSkipRanges(req.skip(), checkpoint, rec.step_batches);
  if (!clipped.ok()) return clipped.status();
  const std::vector<loom::v1::SkipRange>& skips = *clipped;
  std::vector<std::string> described;
  for (const loom::v1::SkipRange& r : skips) {
    described.push_back(absl::StrCat("[", r.begin(), ", ", r.end(), ")"));
  }
  loom::v1::RecoveryEvent rb;
  rb.set_kind(loom::v1::RecoveryEvent::ROLLBACK);
  rb.set_cause(kCauseOperator);
  rb.set_step(rec.attempt_last_step);
  rec.job.set_operator_rollbacks(rec.job.operator_rollbacks() + 1);
  rb.set_message(absl::StrCat(
      "operator rollback", req.reason().empty() ? "" : absl::StrCat(" (", req.reason(), ")"),
      ": resume from the newest checkpoint at step <= ", req.to_step(), " (step ", checkpoint,
      checkpoint == 0 ? ", i.e. from scratch" : "", ")",
      skips.empty() ? ", no data skipped"
                    : absl::StrCat(", skip data batches ", absl::StrJoin(described, " "))));
  std::string reason = rb.message();
  RollBack(rec, req.to_step(), checkpoint, skips, std::move(rb), reason);
  return absl::OkStatus();
}

void Rollbacks::OnSpike(JobRecord& rec, const recovery::SpikeVerdict& v, int64_t data_batch) {
  RecoveryOptions o = RecoveryPolicy::EffectiveRecovery(rec.job.spec().recovery());
  loom::v1::RecoveryEvent spike;
  spike.set_kind(loom::v1::RecoveryEvent::SPIKE);
  spike.set_step(v.step);
  spike.set_signal(v.signal);
  spike.set_value(v.value);
  spike.set_baseline(v.baseline);
  spike.set_score(v.score);
  spike.set_message(v.Describe());
  jobs_->AddEvent(rec, spike);
  SpikeFacts facts;
  facts.step = v.step;
  facts.data_batch = data_batch;
  facts.rollbacks = rec.job.rollbacks();
  facts.last_spike_step = rec.last_spike_step;
  facts.skip_widened = rec.skip_widened;
  facts.step_batches = &rec.step_batches;
  const SpikeRollback decision = RecoveryPolicy::DecideSpikeRollback(
      o, facts, [&](int64_t max_step) { return catalog_->NewestGoodStep(rec.job.id(), max_step); });
  if (decision.give_up) {
    std::string why =
        absl::StrCat("loss spike not cured after ", rec.job.rollbacks(),
                     " rollback(s) (max_rollbacks ", o.max_rollbacks, "): ", v.Describe());
    loom::v1::RecoveryEvent gave_up;
    gave_up.set_kind(loom::v1::RecoveryEvent::GAVE_UP);
    gave_up.set_step(v.step);
    gave_up.set_message(why);
    jobs_->AddEvent(rec, gave_up);
    jobs_->Stop(rec, loom::v1::FAILED, why);
    return;
  }
  if (decision.widen_skip) rec.skip_widened = true;
  const int64_t resume = decision.resume_step;
  const loom::v1::SkipRange& skip = decision.skip;
  rec.job.set_rollbacks(rec.job.rollbacks() + 1);
  rec.last_spike_step = v.step;
  loom::v1::RecoveryEvent rb;
  rb.set_kind(loom::v1::RecoveryEvent::ROLLBACK);
  rb.set_cause(kCauseLossSpike);
  rb.set_step(v.step);
  rb.set_message(absl::StrFormat(
      "rollback %d/%d: resume from the newest checkpoint at step <= %d, skip data batches "
      "[%d, %d)",
      rec.job.rollbacks(), o.max_rollbacks, resume, skip.begin(), skip.end()));
  std::string reason = absl::StrCat("loss spike at step ", v.step, "; ", rb.message());
  RollBack(rec, resume, resume, {skip}, std::move(rb), reason);
}

void Rollbacks::RollBack(JobRecord& rec, int64_t resume_step, int64_t checkpoint_step,
                         const std::vector<loom::v1::SkipRange>& skips,
                         loom::v1::RecoveryEvent event, const std::string& reason) {
  int64_t lost = std::max<int64_t>(0, rec.attempt_last_step - checkpoint_step);
  int64_t skipped = 0;
  rec.job.set_resume_step(resume_step);
  for (const auto& r : skips) {
    *rec.job.add_skip_batches() = r;
    skipped += r.end() - r.begin();
  }
  // Steps after the checkpoint are trained again: they leave the baseline.
  if (rec.detector) rec.detector->Truncate(checkpoint_step);
  event.set_resume_step(resume_step);
  event.set_checkpoint_step(checkpoint_step);
  event.set_steps_lost(lost);
  if (!skips.empty()) *event.mutable_skip() = skips.front();
  event.set_generation(rec.job.generation() + 1);
  std::string cause = event.cause();
  jobs_->AddEvent(rec, std::move(event));
  if (metrics_ != nullptr) metrics_->RecordRecovery(rec.job.id(), "rollback", cause, lost, skipped);
  jobs_->Requeue(rec, reason);
}

}  // namespace loom::controller
