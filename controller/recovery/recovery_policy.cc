#include "controller/recovery/recovery_policy.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/rank_exit.h"
#include "controller/recovery/recovery_metrics.h"

namespace loom::controller {

RecoveryOptions RecoveryPolicy::EffectiveRecovery(const loom::v1::RecoverySpec& spec) {
  RecoveryOptions o;
  if (spec.has_max_restarts()) o.max_restarts = std::max(0, spec.max_restarts());
  o.detect_spikes = !spec.disable_spike_detection();
  if (spec.window() > 0) o.detector.window = spec.window();
  if (spec.min_history() > 0) o.detector.min_history = spec.min_history();
  if (spec.threshold() > 0) o.detector.threshold = spec.threshold();
  if (spec.confirm_steps() > 0) o.detector.confirm_steps = spec.confirm_steps();
  if (spec.rollback_distance() > 0) o.rollback_distance = spec.rollback_distance();
  if (spec.skip_before() > 0) o.skip_before = spec.skip_before();
  if (spec.skip_after() > 0) o.skip_after = spec.skip_after();
  if (spec.has_max_rollbacks()) o.max_rollbacks = std::max(0, spec.max_rollbacks());
  const loom::v1::SlowRankSpec& slow = spec.slow_rank();
  o.detect_slow_ranks = !slow.disabled();
  if (slow.min_slowdown() > 0) o.slow_ranks.min_slowdown = slow.min_slowdown();
  if (slow.threshold() > 0) o.slow_ranks.threshold = slow.threshold();
  if (slow.confirm_reports() > 0) o.slow_ranks.confirm_reports = slow.confirm_reports();
  if (slow.window() > 0) o.slow_ranks.window = slow.window();
  if (slow.confirm_seconds() > 0) o.slow_ranks.confirm_seconds = slow.confirm_seconds();
  o.slow_ranks.window = std::max(o.slow_ranks.window, o.slow_ranks.confirm_reports);
  if (!slow.action().empty()) o.slow_rank_action = slow.action();
  if (slow.cordon_seconds() > 0) o.cordon_seconds = slow.cordon_seconds();
  return o;
}

bool RecoveryPolicy::IsRendezvousFailure(int exit_code, int signal, int64_t attempt_last_step) {
  return signal == 0 && exit_code == kRankExitRendezvousFailed && attempt_last_step < 0;
}

std::string RecoveryPolicy::NoRestartBecause(int exit_code, int signal) {
  if (signal != 0) return "";
  switch (exit_code) {
    case kRankExitNoGoodCheckpoint:
      return "no checkpoint verifies and the spec does not allow starting from scratch "
             "(recovery.allow_start_from_scratch)";
    case kRankExitCheckpointVolumeFull:
      return "the checkpoint volume is full and a restart begins with a save "
             "(checkpoint.on_save_failure: CONTINUE trains on through failed saves); the "
             "committed checkpoints are intact";
    case kRankExitCheckpointFenced:
      return "its checkpoint directory is claimed by another job or attempt "
             "(checkpoint.dir must not be shared); a restart would take it back";
    default:
      return "";
  }
}

std::string RecoveryPolicy::LeaseExpiredCauseKind(bool across_controller_restart) {
  return across_controller_restart ? kCauseControllerRestart : kCauseWorkerLost;
}

FailureDecision RecoveryPolicy::DecideFailure(const SettledFailure& f) const {
  FailureDecision d;
  d.cause_kind = f.cause_kind;
  bool blamed = f.worker_went_silent;
  // Still awaiting re-adoption after a controller restart: the restart
  // (the workers' leases ran out, and a rank's peers lost it) is the
  // likelier root cause too.
  if (!blamed && f.cause_kind.empty() && f.across_controller_restart) {
    d.blame_controller_restart = true;
    d.cause_kind = kCauseControllerRestart;
    blamed = true;
  }
  if (!blamed && f.rendezvous && f.rendezvous_retries < options_.max_rendezvous_retries) {
    d.action = FailureDecision::kPlaceAgain;
    return d;
  }
  if (!blamed && !f.no_restart_because.empty()) {
    d.action = FailureDecision::kFailWithoutRestart;
    return d;
  }
  d.action = FailureDecision::kRestartOrFail;
  if (d.cause_kind.empty()) d.cause_kind = blamed ? kCauseWorkerLost : kCauseRankFailure;
  return d;
}

bool RecoveryPolicy::RestartsLeft(int restarts_used, const RecoveryOptions& o) {
  return restarts_used < o.max_restarts;
}

SpikeRollback RecoveryPolicy::DecideSpikeRollback(
    const RecoveryOptions& o, const SpikeFacts& spike,
    const std::function<int64_t(int64_t max_step)>& newest_checkpoint) {
  SpikeRollback r;
  if (spike.rollbacks >= o.max_rollbacks) {
    r.give_up = true;
    return r;
  }
  int64_t before = o.skip_before, after = o.skip_after;
  // A spike that comes back inside the window of the previous rollback
  // widens the skip window, once.
  if (spike.last_spike_step >= 0 && spike.step <= spike.last_spike_step + after &&
      !spike.skip_widened) {
    before *= 2;
    after *= 2;
    r.widen_skip = true;
  }
  // Resume from the newest checkpoint still on disk at or before
  // spike - rollback_distance; if retention or a crash left none that far
  // back, the newest one before the spike; else from scratch (step 0).
  int64_t target = std::max<int64_t>(0, spike.step - o.rollback_distance);
  r.resume_step = newest_checkpoint(target);
  if (r.resume_step == 0) r.resume_step = newest_checkpoint(spike.step - 1);
  r.skip.set_begin(std::max<int64_t>(0, spike.data_batch - before));
  // Batches trained before the resume point stay trained (FirstUndoneBatch).
  if (spike.step_batches != nullptr) {
    int64_t first_undone = FirstUndoneBatch(*spike.step_batches, r.resume_step);
    if (first_undone >= 0) r.skip.set_begin(std::max(r.skip.begin(), first_undone));
  }
  r.skip.set_end(spike.data_batch + after + 1);
  return r;
}

int64_t RecoveryPolicy::FirstUndoneBatch(const std::map<int64_t, int64_t>& step_batches,
                                         int64_t resume_step) {
  auto b = step_batches.find(resume_step + 1);
  return b == step_batches.end() ? -1 : b->second;
}

absl::StatusOr<std::vector<loom::v1::SkipRange>> RecoveryPolicy::ClipSkipRanges(
    const google::protobuf::RepeatedPtrField<loom::v1::SkipRange>& skips,
    int64_t checkpoint_step, const std::map<int64_t, int64_t>& step_batches) {
  // Batches trained up to the checkpoint stay trained (FirstUndoneBatch):
  // a range is clipped to start at the first batch the rollback undoes.
  const int64_t first_undone = FirstUndoneBatch(step_batches, checkpoint_step);
  std::vector<loom::v1::SkipRange> out;
  for (int i = 0; i < skips.size(); ++i) {
    loom::v1::SkipRange r = skips.Get(i);
    if (first_undone >= 0 && r.end() <= first_undone) {
      return absl::InvalidArgumentError(absl::StrCat(
          "skip[", i, "]: batches [", r.begin(), ", ", r.end(),
          ") were trained before the checkpoint at step ", checkpoint_step,
          " that the job resumes from; the first batch it will train again is ", first_undone));
    }
    if (first_undone >= 0) r.set_begin(std::max(r.begin(), first_undone));
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace loom::controller
