#include "controller/progress/job_progress.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "common/jobspec_model.h"
#include "controller/progress/diagnosis.h"

namespace loom::controller {
namespace {

void UpdateSummary(const loom::v1::StepMetrics& m, int ranks, loom::v1::JobSummary* sum) {
  if (m.step() > 0) {
    if (sum->last_step() == 0) {
      sum->set_first_loss(m.loss());
      sum->set_first_step_unix_ms(m.time_unix_ms());
      sum->set_first_step_tokens(m.tokens_seen());
      sum->set_tokens_per_second(m.tokens_per_second());
    }
    sum->set_last_step(m.step());
    sum->set_last_loss(m.loss());
    sum->set_last_tokens_per_second(m.tokens_per_second());
    sum->set_tokens_seen(m.tokens_seen());
    sum->set_last_step_unix_ms(m.time_unix_ms());
    if (m.peak_flops_per_second() > 0) {
      sum->set_mfu(m.mfu());
      sum->set_peak_flops_source(m.peak_flops_source());
    }
    sum->set_energy_joules(m.energy_joules() * std::max(1, ranks));
    // Mean throughput from step 1 on (start-up and data loading of the
    // first step excluded), by wall clock of the reports.
    const int64_t span_ms = m.time_unix_ms() - sum->first_step_unix_ms();
    if (span_ms > 0) {
      sum->set_tokens_per_second(static_cast<double>(m.tokens_seen() - sum->first_step_tokens()) *
                                 1000.0 / span_ms);
    }
  }
  if (m.has_val_loss()) {
    if (!sum->has_val_loss()) sum->set_first_val_loss(m.val_loss());
    sum->set_has_val_loss(true);
    sum->set_last_val_loss(m.val_loss());
  }
}

void UpdateDiagnosis(const loom::v1::StepMetrics& m, int64_t now_unix_ms, JobRecord* rec) {
  if (m.step() <= 0 || m.compute_seconds() <= 0) return;
  // A new attempt (rollback, restart) starts the window afresh.
  if (!rec->recent_steps.empty() && m.step() <= rec->recent_steps.back().step()) {
    rec->recent_steps.clear();
  }
  rec->recent_steps.push_back(m);
  while (rec->recent_steps.size() > static_cast<size_t>(DiagnosisOptions().window)) {
    rec->recent_steps.pop_front();
  }
  std::vector<const loom::v1::StepMetrics*> window;
  window.reserve(rec->recent_steps.size());
  for (const auto& r : rec->recent_steps) window.push_back(&r);
  loom::v1::Diagnosis d = Diagnose(std::move(window));
  d.set_time_unix_ms(now_unix_ms);
  *rec->job.mutable_diagnosis() = std::move(d);
}

}  // namespace

void ApplyStepReport(const loom::v1::StepMetrics& m, int64_t now_unix_ms, JobRecord* rec) {
  UpdateSummary(m, rec->job.ranks_size(), rec->job.mutable_summary());
  UpdateDiagnosis(m, now_unix_ms, rec);
  if (m.rank_snapshot_steps_size() > 0 && m.rank_snapshot_steps_size() == rec->job.ranks_size()) {
    rec->attempt_snapshot_steps.assign(m.rank_snapshot_steps().begin(),
                                       m.rank_snapshot_steps().end());
  }
  if (m.step() > 0) {
    rec->attempt_last_step = m.step();
    rec->rendezvous_retries = 0;  // this attempt's ranks did join
    rec->step_batches.erase(rec->step_batches.lower_bound(m.step()), rec->step_batches.end());
    rec->step_batches[m.step()] = m.data_batch();
    while (rec->step_batches.size() > kMaxStepBatchesKept) {
      rec->step_batches.erase(rec->step_batches.begin());
    }
  }
}

std::optional<absl::Time> LastTransitionTo(const loom::v1::Job& job, loom::v1::JobState state) {
  for (int i = job.history_size() - 1; i >= 0; --i) {
    if (job.history(i).to() == state) return absl::FromUnixMillis(job.history(i).time_unix_ms());
  }
  return std::nullopt;
}

absl::Duration EstimatedRemainingRuntime(const loom::v1::Job& job) {
  const loom::v1::JobSpec& spec = job.spec();
  const int64_t left =
      std::max<int64_t>(0, spec.schedule().total_steps() - job.summary().last_step());
  const double tokens_per_step =
      static_cast<double>(spec.batch().global_batch()) * EffectiveDecoder(spec.model()).seq_len();
  if (job.summary().last_tokens_per_second() > 0 && tokens_per_step > 0) {
    const double step = tokens_per_step / job.summary().last_tokens_per_second();
    return absl::Seconds(1.2 * step * static_cast<double>(left));
  }
  if (job.plan().layout().step_seconds() > 0) {
    return absl::Seconds(2.0 * job.plan().layout().step_seconds() * static_cast<double>(left));
  }
  return absl::InfiniteDuration();
}

}  // namespace loom::controller
