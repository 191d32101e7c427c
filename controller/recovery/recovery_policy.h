// The controller's recovery policy: the decisions that follow a failed
// attempt or a loss spike, as pure functions of the job's facts. What the
// decisions do (transitions, recovery events, stopping ranks, requeueing)
// is JobManager's. No gRPC types, no store: the newest good checkpoint is
// asked of a function the caller passes.
//
// A failed attempt, once its failure settled (JobManagerOptions::
// failure_settle_time), ends in one of three ways (DecideFailure):
//   * placed again without counting a restart: a rank could not join the
//     job's process groups before any step (kRankExitRendezvousFailed), at
//     most max_rendezvous_retries times in a row;
//   * FAILED without spending a restart: the rank's exit code says a
//     restart cannot help (NoRestartBecause);
//   * otherwise restarted from the newest checkpoint while restarts are
//     left (RestartsLeft), else FAILED.
// A worker that went silent, or a controller restart, is the likelier root
// cause of a failure than what the rank said, and takes the usual path.
//
// A loss spike rolls the job back (DecideSpikeRollback) to a checkpoint
// about rollback_distance steps before it and skips the data batches
// around it (PaLM, Chowdhery et al. 2022, §5.1), at most max_rollbacks
// times; then the job fails.
//
// Thread-safe: no mutable state.
#ifndef LOOM_CONTROLLER_RECOVERY_RECOVERY_POLICY_H_
#define LOOM_CONTROLLER_RECOVERY_RECOVERY_POLICY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/recovery/slow_rank_detector.h"
#include "controller/recovery/spike_detector.h"
#include "loom/v1/job.pb.h"

namespace loom::controller {

// Effective recovery settings of a spec (defaults applied).
struct RecoveryOptions {
  int max_restarts = 3;
  bool detect_spikes = true;
  recovery::SpikeDetectorOptions detector;
  int64_t rollback_distance = 100;
  int64_t skip_before = 100;
  int64_t skip_after = 200;
  int max_rollbacks = 5;
  // Slow ranks (recovery.slow_rank): detection, and what a finding leads to.
  bool detect_slow_ranks = true;
  recovery::SlowRankOptions slow_ranks;
  std::string slow_rank_action = "report";  // "report" or "cordon"
  int64_t cordon_seconds = 600;
};

struct RecoveryPolicyOptions {
  // JobManagerOptions::max_rendezvous_retries.
  int max_rendezvous_retries = 3;
};

// What is known about an attempt's failure when it has settled.
struct SettledFailure {
  // A worker of the job stopped heartbeating (JobManager names it in the
  // reason): the likelier root cause than a rank that lost its peer.
  bool worker_went_silent = false;
  // The attempt was running when the controller restarted.
  bool across_controller_restart = false;
  // The kCause* value (recovery_metrics.h) when the cause is known better
  // than "a rank failed" (a rank its worker killed when its lease ran
  // out); empty otherwise.
  std::string cause_kind;
  bool rendezvous = false;     // a rank failed to join before any step
  int rendezvous_retries = 0;  // consecutive attempts placed again so far
  // Why restarting cannot help (NoRestartBecause), or empty.
  std::string no_restart_because;
};

struct FailureDecision {
  enum Action {
    kPlaceAgain,          // no restart counted (a rendezvous retry)
    kFailWithoutRestart,  // FAILED, no restart spent
    kRestartOrFail,       // restart while restarts are left (RestartsLeft), else FAILED
  };
  Action action = kRestartOrFail;
  // The kCause* value the failure is recorded under (kRestartOrFail).
  std::string cause_kind;
  // The controller restart, not the rank, is named as the root cause.
  bool blame_controller_restart = false;
};

// What a loss spike leads to.
struct SpikeRollback {
  // max_rollbacks reached: the job fails instead.
  bool give_up = false;
  // This rollback widens the skip window (doubled, once per job): the
  // spike came back within the previous rollback's window.
  bool widen_skip = false;
  int64_t resume_step = 0;  // the checkpoint resumed from; 0 = from scratch
  loom::v1::SkipRange skip;
};

// The facts of a job a spike rollback is decided on.
struct SpikeFacts {
  int64_t step = 0;        // the spike's step
  int64_t data_batch = 0;  // the data batch that step trained on
  int rollbacks = 0;       // spike rollbacks so far
  int64_t last_spike_step = -1;  // the previous spike's step, or -1
  bool skip_widened = false;     // a rollback already widened the window
  // step -> data batch it trained on, for the recent steps of the attempt.
  const std::map<int64_t, int64_t>* step_batches = nullptr;
};

class RecoveryPolicy {
 public:
  explicit RecoveryPolicy(RecoveryPolicyOptions options = {}) : options_(options) {}

  static RecoveryOptions EffectiveRecovery(const loom::v1::RecoverySpec& spec);

  // --- a rank's exit
  // A rank that could not join its groups before any step: nothing was
  // computed (see JobManagerOptions::max_rendezvous_retries).
  static bool IsRendezvousFailure(int exit_code, int signal, int64_t attempt_last_step);
  // Why restarting cannot help, when a rank's exit code says so
  // (kRankExitNoGoodCheckpoint, kRankExitCheckpointVolumeFull,
  // kRankExitCheckpointFenced; common/rank_exit.h); empty: the usual policy.
  static std::string NoRestartBecause(int exit_code, int signal);
  // The cause of a rank its worker killed when the worker's lease ran out:
  // during a re-adoption after a controller restart that is the restart's
  // doing, else the worker was lost.
  static std::string LeaseExpiredCauseKind(bool across_controller_restart);

  // --- an attempt's failure
  FailureDecision DecideFailure(const SettledFailure& failure) const;
  // Whether a failure may restart the job, after `restarts_used` restarts.
  static bool RestartsLeft(int restarts_used, const RecoveryOptions& o);

  // --- loss spikes
  // `newest_checkpoint(max_step)` is the step of the newest good checkpoint
  // at or before max_step, 0 when there is none. Resumes from the newest
  // one at or before spike - rollback_distance; if retention or a crash
  // left none that far back, the newest one before the spike; else from
  // scratch.
  static SpikeRollback DecideSpikeRollback(
      const RecoveryOptions& o, const SpikeFacts& spike,
      const std::function<int64_t(int64_t max_step)>& newest_checkpoint);

  // --- rollbacks
  // Batches trained before the resume point stay trained: the skip list
  // must describe what happened, so that a run from scratch with the same
  // list replays this one exactly. Step resume_step + 1 trained the first
  // batch that a rollback to resume_step undoes; -1 when not known.
  static int64_t FirstUndoneBatch(const std::map<int64_t, int64_t>& step_batches,
                                  int64_t resume_step);
  // An operator's skip ranges for a rollback to `checkpoint_step`, each
  // clipped to begin at the first batch the rollback undoes (when known).
  // INVALID_ARGUMENT naming skip[i] for a range wholly before it.
  static absl::StatusOr<std::vector<loom::v1::SkipRange>> ClipSkipRanges(
      const google::protobuf::RepeatedPtrField<loom::v1::SkipRange>& skips,
      int64_t checkpoint_step, const std::map<int64_t, int64_t>& step_batches);

 private:
  const RecoveryPolicyOptions options_;
};

}  // namespace loom::controller

#endif  // LOOM_CONTROLLER_RECOVERY_RECOVERY_POLICY_H_
