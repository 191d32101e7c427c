#include "controller/recovery/recovery_metrics.h"

#include <algorithm>

namespace loom::controller {
namespace {

metrics::Family<metrics::Counter>& Counter(metrics::Registry& r, const char* name,
                                           const char* help) {
  return metrics::BuildCounter().Name(name).Help(help).Register(r);
}
metrics::Family<metrics::Gauge>& Gauge(metrics::Registry& r, const char* name, const char* help) {
  return metrics::BuildGauge().Name(name).Help(help).Register(r);
}

}  // namespace

RecoveryMetrics::RecoveryMetrics(metrics::Registry& r)
    : recoveries_(Counter(r, "loom_controller_recoveries_total",
                          "Rollbacks and restarts of a job, by kind (rollback, restart) and cause "
                          "(loss_spike, operator, rank_failure, worker_lost, "
                          "controller_restart).")),
      steps_lost_(Counter(r, "loom_controller_steps_lost_total",
                          "Optimizer steps of training undone by rollbacks and restarts (last "
                          "reported step minus the checkpoint resumed from), by cause.")),
      batches_skipped_(Counter(r, "loom_controller_batches_skipped_total",
                               "Data batches a job was told to skip by rollbacks.")),
      checkpoints_(
          Counter(r, "loom_controller_checkpoints_total", "Checkpoints committed by a job.")),
      preemptions_(Counter(r, "loom_controller_preemptions_total",
                           "Times a job was preempted (saved at a step boundary, stopped and "
                           "requeued) to make room for another, by queue and reason (priority, "
                           "reclaim, fair_share, reservation). Its steps lost are counted in "
                           "loom_controller_steps_lost_total{cause=\"preemption\"}.")),
      slow_ranks_(Counter(r, "loom_controller_slow_ranks_total",
                          "Ranks the slow-rank detector named (compute time above their peers' "
                          "for recovery.slow_rank.confirm_reports reports), by what was done "
                          "(report, cordon).")),
      checkpoint_failures_(Counter(r, "loom_controller_checkpoint_failures_total",
                                   "Checkpoint saves of a job that a rank reported failed.")),
      checkpoint_bytes_total_(Counter(r, "loom_controller_checkpoint_bytes_total",
                                      "Bytes of checkpoints committed by a job.")),
      checkpoint_write_total_(Counter(r, "loom_controller_checkpoint_write_seconds_total",
                                      "Seconds spent writing a job's checkpoints (serialise, "
                                      "checksum, fsync, rename; in the background).")),
      checkpoint_stall_total_(Counter(r, "loom_controller_checkpoint_stall_seconds_total",
                                      "Training seconds a job was blocked by checkpoint saves.")),
      last_bytes_(Gauge(r, "loom_controller_last_checkpoint_bytes",
                        "Size of the job's newest committed checkpoint.")),
      last_write_(Gauge(r, "loom_controller_last_checkpoint_write_seconds",
                        "Write time of the job's newest committed checkpoint.")),
      last_stall_(Gauge(r, "loom_controller_last_checkpoint_stall_seconds",
                        "Training stall of the job's newest committed checkpoint.")),
      last_step_(Gauge(r, "loom_controller_last_checkpoint_step",
                       "Step of the job's newest committed checkpoint.")),
      write_duration_(metrics::BuildHistogram()
                          .Name("loom_controller_checkpoint_write_duration_seconds")
                          .Help("Write time of committed checkpoints, all jobs.")
                          .Register(r)
                          .Add({}, metrics::ExponentialBuckets(0.01, 4, 8))),
      stall_duration_(metrics::BuildHistogram()
                          .Name("loom_controller_checkpoint_stall_duration_seconds")
                          .Help("Training stall per committed checkpoint, all jobs.")
                          .Register(r)
                          .Add({}, metrics::ExponentialBuckets(0.0005, 4, 8))) {}

void RecoveryMetrics::RecordRecovery(const std::string& job_id, const std::string& kind,
                                     const std::string& cause, int64_t steps_lost,
                                     int64_t batches_skipped) {
  recoveries_.Add({{"job_id", job_id}, {"kind", kind}, {"cause", cause}}).Increment();
  steps_lost_.Add({{"job_id", job_id}, {"cause", cause}})
      .Increment(static_cast<double>(std::max<int64_t>(0, steps_lost)));
  auto& skipped = batches_skipped_.Add({{"job_id", job_id}});
  if (batches_skipped > 0) skipped.Increment(static_cast<double>(batches_skipped));
}

void RecoveryMetrics::RecordPreemption(const std::string& job_id, const std::string& queue,
                                       const std::string& reason, int64_t steps_lost) {
  preemptions_.Add({{"job_id", job_id}, {"queue", queue}, {"reason", reason}}).Increment();
  steps_lost_.Add({{"job_id", job_id}, {"cause", kCausePreemption}})
      .Increment(static_cast<double>(std::max<int64_t>(0, steps_lost)));
}

void RecoveryMetrics::RecordSlowRank(const std::string& job_id, const std::string& action) {
  slow_ranks_.Add({{"job_id", job_id}, {"action", action}}).Increment();
}

void RecoveryMetrics::RecordCheckpointFailure(const std::string& job_id) {
  checkpoint_failures_.Add({{"job_id", job_id}}).Increment();
}

void RecoveryMetrics::RecordCheckpoint(const std::string& job_id,
                                       const loom::v1::CheckpointInfo& info) {
  metrics::Labels job{{"job_id", job_id}};
  checkpoints_.Add(job).Increment();
  checkpoint_bytes_total_.Add(job).Increment(static_cast<double>(info.bytes()));
  checkpoint_write_total_.Add(job).Increment(std::max(0.0, info.write_seconds()));
  checkpoint_stall_total_.Add(job).Increment(std::max(0.0, info.stall_seconds()));
  last_bytes_.Add(job).Set(static_cast<double>(info.bytes()));
  last_write_.Add(job).Set(info.write_seconds());
  last_stall_.Add(job).Set(info.stall_seconds());
  last_step_.Add(job).Set(static_cast<double>(info.step()));
  write_duration_.Observe(info.write_seconds());
  stall_duration_.Observe(info.stall_seconds());
}

}  // namespace loom::controller
