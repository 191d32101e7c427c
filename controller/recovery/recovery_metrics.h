// Prometheus series of automatic and operator recovery, per job: what
// rollbacks and restarts cost (steps lost, batches skipped) and what
// checkpoints cost (bytes, write and stall seconds). JobManager records into
// it as events happen; the families live in the controller's registry and
// are served on its /metrics.
//
//   loom_controller_recoveries_total{job_id, kind, cause}      counter
//   loom_controller_steps_lost_total{job_id, cause}            counter
//   loom_controller_batches_skipped_total{job_id}              counter
//   loom_controller_checkpoints_total{job_id}                  counter
//   loom_controller_checkpoint_bytes_total{job_id}             counter
//   loom_controller_checkpoint_write_seconds_total{job_id}     counter
//   loom_controller_checkpoint_stall_seconds_total{job_id}     counter
//   loom_controller_last_checkpoint_bytes{job_id}              gauge
//   loom_controller_last_checkpoint_write_seconds{job_id}      gauge
//   loom_controller_last_checkpoint_stall_seconds{job_id}      gauge
//   loom_controller_last_checkpoint_step{job_id}               gauge
//   loom_controller_preemptions_total{job_id, queue, reason}   counter
//   loom_controller_slow_ranks_total{job_id, action}           counter
//   loom_controller_checkpoint_write_duration_seconds          histogram
//   loom_controller_checkpoint_stall_duration_seconds          histogram
//
// kind is "rollback" or "restart"; cause is one of kCause* below. Counters
// start at zero when the controller starts (Prometheus handles resets).
// Thread-safe (the metric types are).
#ifndef LOOM_CONTROLLER_RECOVERY_RECOVERY_METRICS_H_
#define LOOM_CONTROLLER_RECOVERY_RECOVERY_METRICS_H_

#include <cstdint>
#include <string>

#include "common/metrics.h"
#include "loom/v1/job.pb.h"

namespace loom::controller {

// RecoveryEvent.cause values.
inline constexpr char kCauseLossSpike[] = "loss_spike";
inline constexpr char kCauseOperator[] = "operator";
inline constexpr char kCauseRankFailure[] = "rank_failure";
inline constexpr char kCauseWorkerLost[] = "worker_lost";
inline constexpr char kCauseControllerRestart[] = "controller_restart";
inline constexpr char kCauseCheckpointFailed[] = "checkpoint_failed";
// steps_lost_total's cause for preemptions (0 when the save committed).
inline constexpr char kCausePreemption[] = "preemption";
// An elastic job grew back: workers returned (RecoveryEvent REPLANNED).
inline constexpr char kCauseCapacityReturned[] = "capacity_returned";
// An elastic job waiting for a gang that does not fit the free slots was
// re-planned smaller.
inline constexpr char kCauseCapacityShort[] = "capacity_short";
// A slow rank's worker was cordoned and the job re-planned without it.
inline constexpr char kCauseSlowRank[] = "slow_rank";
// An operator drained the node the job ran on (DrainNode).
inline constexpr char kCauseDrain[] = "drain";

class RecoveryMetrics {
 public:
  // Registers the families in `registry`, which must outlive this object.
  explicit RecoveryMetrics(metrics::Registry& registry);

  // A rollback or restart was decided. `kind` "rollback" or "restart".
  void RecordRecovery(const std::string& job_id, const std::string& kind,
                      const std::string& cause, int64_t steps_lost, int64_t batches_skipped);
  // A preempted job's ranks have stopped (RecoveryEvent PREEMPTED): `reason`
  // is the policy's ("priority", "reclaim", "fair_share", "reservation"),
  // `steps_lost` the steps after the checkpoint it resumes from.
  void RecordPreemption(const std::string& job_id, const std::string& queue,
                        const std::string& reason, int64_t steps_lost);
  // The slow-rank detector named a rank; `action` is what was done
  // ("report", "cordon").
  void RecordSlowRank(const std::string& job_id, const std::string& action);
  // A checkpoint was committed.
  void RecordCheckpoint(const std::string& job_id, const loom::v1::CheckpointInfo& info);
  // A rank reported a checkpoint save that failed.
  void RecordCheckpointFailure(const std::string& job_id);

 private:
  metrics::Family<metrics::Counter>& recoveries_;
  metrics::Family<metrics::Counter>& steps_lost_;
  metrics::Family<metrics::Counter>& batches_skipped_;
  metrics::Family<metrics::Counter>& checkpoints_;
  metrics::Family<metrics::Counter>& preemptions_;
  metrics::Family<metrics::Counter>& slow_ranks_;
  metrics::Family<metrics::Counter>& checkpoint_failures_;
  metrics::Family<metrics::Counter>& checkpoint_bytes_total_;
  metrics::Family<metrics::Counter>& checkpoint_write_total_;
  metrics::Family<metrics::Counter>& checkpoint_stall_total_;
  metrics::Family<metrics::Gauge>& last_bytes_;
  metrics::Family<metrics::Gauge>& last_write_;
  metrics::Family<metrics::Gauge>& last_stall_;
  metrics::Family<metrics::Gauge>& last_step_;
  metrics::Histogram& write_duration_;
  metrics::Histogram& stall_duration_;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_RECOVERY_RECOVERY_METRICS_H_
