#include "controller/progress/step_reports.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "controller/jobs/job_state_machine.h"
#include "controller/progress/job_progress.h"
#include "controller/recovery/recovery_policy.h"

namespace loom::controller {

using loom::v1::JobEvent;
using loom::v1::JobState;

StepReports::StepReports(JobTable* jobs, WorkerRegistry* workers, CheckpointCatalog* catalog,
                         Store* store, EventHub* hub, const Clock* clock, RecoveryMetrics* metrics,
                         Rollbacks* rollbacks, SlowRankHandler* slow_ranks)
    : jobs_(jobs),
      workers_(workers),
      catalog_(catalog),
      store_(store),
      hub_(hub),
      clock_(clock),
      metrics_(metrics),
      rollbacks_(rollbacks),
      slow_ranks_(slow_ranks) {}
StepReports::Applied StepReports::Apply(const loom::v1::ReportStepMetricsRequest& req) {
  Applied applied;
  JobRecord* it = jobs_->Find(req.job_id());
  if (it != nullptr) applied.last_step_before = it->attempt_last_step;
  applied.response = ApplyEvents(req, &applied.write, &applied.events_through);
  if (it != nullptr) applied.last_step_after = it->attempt_last_step;
  return applied;
}

absl::StatusOr<loom::v1::ReportStepMetricsResponse> StepReports::Finish(
    const std::string& job_id, int64_t generation, Applied applied, const absl::Status& durable) {
  if (durable.ok()) {
    if (applied.events_through > 0) {
      // Its event log entries are stored: no later write need carry them.
      if (JobRecord* rec = jobs_->Find(job_id))
        JobTable::EventsStored(*rec, applied.events_through);
    }
    return std::move(applied.response);
  }
  {
    // The report's steps are not on disk. The worker retries an
    // UNAVAILABLE report: unless a later report moved on, let that retry
    // apply its steps again (instead of skipping them as already seen), and
    // have the job row written again.
    JobRecord* it = jobs_->Find(job_id);
    if (it != nullptr) {
      JobRecord& rec = *it;
      if (rec.job.generation() == generation && rec.attempt_last_step == applied.last_step_after) {
        rec.attempt_last_step = applied.last_step_before;
      }
      jobs_->MarkUnpersisted(rec.job.id());
    }
  }
  return absl::UnavailableError(absl::StrCat("could not record metrics: ", durable.message()));
}

absl::StatusOr<loom::v1::ReportStepMetricsResponse> StepReports::ApplyEvents(
    const loom::v1::ReportStepMetricsRequest& req, Store::Ticket* write, int64_t* events_through) {
  if (workers_->Find(req.worker_id()) == nullptr) {
    return absl::NotFoundError(absl::StrCat("worker \"", req.worker_id(), "\" is not registered"));
  }
  JobRecord* it = jobs_->Find(req.job_id());
  if (it == nullptr) {
    return absl::NotFoundError(absl::StrCat("no job with id \"", req.job_id(), "\""));
  }
  JobRecord& rec = *it;
  if (absl::Status valid = ValidateCheckpointEvents(req); !valid.ok()) return valid;
  loom::v1::ReportStepMetricsResponse resp;
  bool only_uploads = false;
  RETURN_IF_ERROR(ApplyUploadEvents(rec, req, &only_uploads));
  if (only_uploads) {
    *write = store_->Enqueue(&rec.job, 0, {}, rec.job.id(), rec.unstored_events);
    *events_through = JobTable::NewestUnstoredEvent(rec);
    return resp;
  }
  if (req.generation() < rec.job.generation()) return RefuseStale(rec, req);
  if (req.generation() != rec.job.generation()) {
    return absl::InvalidArgumentError(absl::StrCat("generation: ", req.generation(),
                                                   " is newer than job ", req.job_id(),
                                                   "'s current attempt ", rec.job.generation()));
  }
  if (rec.job.state() != loom::v1::SCHEDULED && rec.job.state() != loom::v1::RUNNING) {
    // Ended, or between attempts: these are the last words of stopped ranks.
    resp.set_stop(true);
    return resp;
  }
  // Only a worker the current attempt placed ranks on reports for it (by
  // node: a worker that re-registered after a controller restart reports
  // under its new id before its ranks are re-adopted).
  const std::string& node = workers_->Find(req.worker_id())->info.node();
  if (std::none_of(rec.job.ranks().begin(), rec.job.ranks().end(),
                   [&](const loom::v1::RankAssignment& a) { return a.node() == node; })) {
    return absl::PermissionDeniedError(
        absl::StrCat("worker ", req.worker_id(), " (node '", node, "') holds no rank of attempt ",
                     rec.job.generation(), " of job ", req.job_id(), " and may not report for it"));
  }
  RecoveryOptions recovery = RecoveryPolicy::EffectiveRecovery(rec.job.spec().recovery());
  if (!rec.detector && recovery.detect_spikes && rollbacks_ != nullptr) {
    rec.detector = std::make_unique<recovery::SpikeDetector>(recovery.detector);
  }
  // (A rank's reports from before its first step, such as corrupt
  // checkpoints found while choosing where to resume, do not make it RUNNING.)
  const bool has_step = std::any_of(req.events().begin(), req.events().end(),
                                    [](const loom::v1::RankEvent& e) { return e.has_step(); });
  if (rec.job.state() == loom::v1::SCHEDULED && has_step) {
    jobs_->Transition(rec, loom::v1::RUNNING, "first step reported");
  }
  std::vector<loom::v1::StepMetrics> steps;
  for (const auto& ev : req.events()) {
    JobEvent out;
    out.set_time_unix_ms(clock_->NowUnixMillis());
    // A retried report (its answer was lost, or the controller restarted
    // after applying it): the attempt's steps only go forward.
    if (ev.has_step() && ev.step().step() > 0 && ev.step().step() <= rec.attempt_last_step) {
      continue;
    }
    if (ev.has_step()) {
      loom::v1::StepMetrics m = ev.step();
      if (m.time_unix_ms() == 0) m.set_time_unix_ms(out.time_unix_ms());
      m.set_generation(rec.job.generation());
      m.set_layout_generation(rec.job.layout_generation());
      ApplyStepReport(m, out.time_unix_ms(), &rec);
      if (slow_ranks_ != nullptr) slow_ranks_->Observe(rec, m, recovery);
      // Per-rank times are for the detector and live watchers; the stored
      // series stays one row per step whatever the world size.
      steps.push_back(m);
      steps.back().clear_rank_compute_seconds();
      steps.back().clear_rank_snapshot_steps();
      if (rec.detector && m.step() > 0) {
        recovery::SpikeVerdict verdict = rec.detector->Observe(m.step(), m.loss(), m.grad_norm());
        if (verdict.spike) {
          *out.mutable_step() = m;
          hub_->PublishLive(rec.job.id(), out);
          // The steps up to the spike, then the rollback's own writes.
          *write = store_->Enqueue(nullptr, 0, steps, rec.job.id());
          rollbacks_->OnSpike(rec, verdict, m.data_batch());
          resp.set_stop(true);
          return resp;
        }
      }
      *out.mutable_step() = std::move(m);
    } else if (ev.has_checkpoint()) {
      if (IsUploadOutcome(ev.checkpoint())) continue;  // ApplyUploadEvents
      if (ev.checkpoint().status() == kSnapshotsOff) {
        loom::v1::RecoveryEvent off;
        off.set_kind(loom::v1::RecoveryEvent::SNAPSHOTS_OFF);
        off.set_generation(rec.job.generation());
        off.set_worker_id(req.worker_id());
        off.set_message(
            absl::StrCat("in-memory snapshots are off for this attempt on node ", node,
                         " (restarts resume from checkpoints): ", ev.checkpoint().error()));
        jobs_->AddEvent(rec, off);
        continue;
      }
      ASSIGN_OR_RETURN(std::optional<loom::v1::CheckpointInfo> committed,
                       ApplyCheckpointEvent(rec, ev.checkpoint(), out.time_unix_ms()));
      if (!committed.has_value()) continue;
      *out.mutable_checkpoint() = *std::move(committed);
      jobs_->RecordEvent(rec, out);
      continue;  // watchers hear of it from the log
    } else {
      continue;
    }
    hub_->PublishLive(rec.job.id(), out);  // steps are live only
  }
  rec.job.set_updated_unix_ms(clock_->NowUnixMillis());
  // (The job's unstored transitions were stored by the Transition above, or
  // are kept for the retry of a write that failed.)
  *write = store_->Enqueue(&rec.job, 0, steps, rec.job.id(), rec.unstored_events);
  *events_through = JobTable::NewestUnstoredEvent(rec);
  return resp;
}

absl::Status StepReports::RefuseStale(JobRecord& rec,
                                      const loom::v1::ReportStepMetricsRequest& req) {
  // A fenced attempt's report: refused, and its ranks are stopped. Its
  // checkpoints were committed while it was current (a new attempt starts
  // only once the old one's ranks are gone or fenced) and are on disk,
  // where the next attempt resumes from, so the catalog records them.
  for (const auto& ev : req.events()) {
    if (!ev.has_checkpoint() || ev.checkpoint().status() == "failed") continue;
    if (ev.checkpoint().status() == kCheckpointCorrupt) continue;  // its load was stale too
    if (ev.checkpoint().status() == kSnapshotsOff) continue;       // not a checkpoint
    if (IsUploadOutcome(ev.checkpoint())) continue;                // recorded by ApplyUploadEvents
    loom::v1::CheckpointInfo info = ev.checkpoint();
    info.set_generation(req.generation());
    info.set_time_unix_ms(clock_->NowUnixMillis());
    absl::Status cs = catalog_->RecordCommitted(rec.job.id(), info);
    if (!cs.ok()) {
      return absl::UnavailableError(absl::StrCat("could not record checkpoint: ", cs.message()));
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "stale attempt: the report is from attempt ", req.generation(), " of ", req.job_id(),
      ", which now runs attempt ", rec.job.generation(), "; its ranks must stop"));
}

absl::StatusOr<std::optional<loom::v1::CheckpointInfo>> StepReports::ApplyCheckpointEvent(
    JobRecord& rec, const loom::v1::CheckpointInfo& reported, int64_t now_unix_ms) {
  if (reported.status() == "failed") {
    // A save that failed never enters the catalog; the rank stops with the
    // error next, and the failure handling restarts from the newest good
    // checkpoint. The event tells watchers why.
    loom::v1::RecoveryEvent failed;
    failed.set_time_unix_ms(now_unix_ms);
    failed.set_kind(loom::v1::RecoveryEvent::CHECKPOINT_FAILED);
    failed.set_step(reported.step());
    failed.set_cause(kCauseCheckpointFailed);
    failed.set_message(
        absl::StrCat("checkpoint at step ", reported.step(), " failed: ", reported.error()));
    failed.set_generation(rec.job.generation());
    jobs_->AddEvent(rec, failed);
    if (metrics_ != nullptr) metrics_->RecordCheckpointFailure(rec.job.id());
    return std::nullopt;
  }
  if (reported.status() == kCheckpointCorrupt) {
    RETURN_IF_ERROR(RecordCorruptCheckpoint(rec, reported));
    return std::nullopt;
  }
  loom::v1::CheckpointInfo info = reported;
  info.set_generation(rec.job.generation());
  info.set_time_unix_ms(now_unix_ms);
  absl::Status cs = catalog_->RecordCommitted(rec.job.id(), info);
  info.set_status(kCheckpointCommitted);
  if (!cs.ok()) {
    return absl::UnavailableError(absl::StrCat("could not record checkpoint: ", cs.message()));
  }
  loom::v1::JobSummary* sum = rec.job.mutable_summary();
  sum->set_checkpoints_written(sum->checkpoints_written() + 1);
  sum->set_last_checkpoint(info.path());
  rec.newest_checkpoint_step = info.step();
  if (metrics_ != nullptr) metrics_->RecordCheckpoint(rec.job.id(), info);
  return info;
}

absl::Status StepReports::ValidateCheckpointEvents(const loom::v1::ReportStepMetricsRequest& req) {
  for (int i = 0; i < req.events_size(); ++i) {
    if (!req.events(i).has_checkpoint()) continue;
    const loom::v1::CheckpointInfo& c = req.events(i).checkpoint();
    const std::string field = absl::StrCat("events[", i, "].checkpoint");
    if (c.status() != "" && c.status() != kCheckpointCommitted && c.status() != "failed" &&
        c.status() != kCheckpointCorrupt && c.status() != kSnapshotsOff && !IsUploadOutcome(c)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".status: \"", c.status(),
          "\" is not committed, failed, corrupt, snapshots_off, uploaded or upload_failed"));
    }
    if (c.status() == kSnapshotsOff && c.error().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": snapshots_off needs its reason in error"));
    }
    if (c.status() == kCheckpointUploaded &&
        (c.path().empty() || c.step() < 0 || !absl::StartsWith(c.remote_url(), "s3://"))) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": an uploaded checkpoint needs its path, a step >= 0 and its s3:// remote_url"));
    }
    if (c.status() == kCheckpointCorrupt &&
        (c.path().empty() || c.step() < 0 || c.failed_check().empty())) {
      return absl::InvalidArgumentError(
          absl::StrCat(field,
                       ": a corrupt checkpoint needs its path, a step >= 0 and its "
                       "failed_check"));
    }
  }
  return absl::OkStatus();
}

absl::Status StepReports::ApplyUploadEvents(JobRecord& rec,
                                            const loom::v1::ReportStepMetricsRequest& req,
                                            bool* only_uploads) {
  *only_uploads = req.events_size() > 0;
  for (const auto& ev : req.events()) {
    if (!ev.has_checkpoint() || !IsUploadOutcome(ev.checkpoint())) {
      *only_uploads = false;
      continue;
    }
    const loom::v1::CheckpointInfo& c = ev.checkpoint();
    const int64_t now = clock_->NowUnixMillis();
    if (c.status() == kCheckpointUploaded) {
      loom::v1::CheckpointInfo info = c;
      info.set_time_unix_ms(now);
      absl::Status s = catalog_->RecordUploaded(rec.job.id(), info);
      if (!s.ok()) {
        return absl::UnavailableError(absl::StrCat("could not record checkpoint: ", s.message()));
      }
      JobEvent out;
      out.set_time_unix_ms(now);
      *out.mutable_checkpoint() = info;
      jobs_->RecordEvent(rec, out);
      continue;
    }
    // The checkpoint stays on the fast tier only; training goes on.
    loom::v1::RecoveryEvent failed;
    failed.set_time_unix_ms(now);
    failed.set_kind(loom::v1::RecoveryEvent::CHECKPOINT_UPLOAD_FAILED);
    failed.set_step(c.step());
    failed.set_generation(req.generation());
    failed.set_message(absl::StrCat("checkpoint at step ", c.step(),
                                    " was not uploaded to the object store: ", c.error()));
    jobs_->AddEvent(rec, std::move(failed));
  }
  return absl::OkStatus();
}

absl::Status StepReports::RecordCorruptCheckpoint(JobRecord& rec,
                                                  const loom::v1::CheckpointInfo& report) {
  loom::v1::CheckpointInfo info = report;
  info.set_time_unix_ms(clock_->NowUnixMillis());
  absl::Status s = catalog_->MarkCorrupt(rec.job.id(), info);
  if (!s.ok()) {
    return absl::UnavailableError(absl::StrCat("could not record checkpoint: ", s.message()));
  }
  loom::v1::RecoveryEvent corrupt;
  corrupt.set_kind(loom::v1::RecoveryEvent::CHECKPOINT_CORRUPT);
  corrupt.set_step(report.step());
  corrupt.set_generation(rec.job.generation());
  corrupt.set_message(absl::StrCat("checkpoint at step ", report.step(),
                                   " is corrupt: ", report.corrupt_file(), " failed its ",
                                   report.failed_check(), " check (", report.error(), ")"));
  jobs_->AddEvent(rec, std::move(corrupt));
  return absl::OkStatus();
}

}  // namespace loom::controller
