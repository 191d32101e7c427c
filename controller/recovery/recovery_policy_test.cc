#include "controller/recovery/recovery_policy.h"

#include <functional>
#include <map>
#include <vector>

#include "common/rank_exit.h"
#include "controller/recovery/recovery_metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(RecoveryPolicyTest, EffectiveRecoveryAppliesDefaultsAndClampsLimits) {
  RecoveryOptions d = RecoveryPolicy::EffectiveRecovery(loom::v1::RecoverySpec());
  EXPECT_EQ(d.max_restarts, 3);
  EXPECT_TRUE(d.detect_spikes);
  EXPECT_EQ(d.rollback_distance, 100);
  EXPECT_EQ(d.skip_before, 100);
  EXPECT_EQ(d.skip_after, 200);
  EXPECT_EQ(d.max_rollbacks, 5);
  EXPECT_EQ(d.detector.window, recovery::SpikeDetectorOptions().window);

  loom::v1::RecoverySpec spec;
  spec.set_max_restarts(0);  // set, so 0 means no restarts
  spec.set_max_rollbacks(-2);
  spec.set_disable_spike_detection(true);
  spec.set_window(16);
  spec.set_min_history(8);
  spec.set_threshold(4.5);
  spec.set_confirm_steps(2);
  spec.set_rollback_distance(30);
  spec.set_skip_before(7);
  spec.set_skip_after(9);
  RecoveryOptions o = RecoveryPolicy::EffectiveRecovery(spec);
  EXPECT_EQ(o.max_restarts, 0);
  EXPECT_EQ(o.max_rollbacks, 0);
  EXPECT_FALSE(o.detect_spikes);
  EXPECT_EQ(o.detector.window, 16);
  EXPECT_EQ(o.detector.min_history, 8);
  EXPECT_EQ(o.detector.threshold, 4.5);
  EXPECT_EQ(o.detector.confirm_steps, 2);
  EXPECT_EQ(o.rollback_distance, 30);
  EXPECT_EQ(o.skip_before, 7);
  EXPECT_EQ(o.skip_after, 9);
}

TEST(RecoveryPolicyTest, RestartsLeftUntilMaxRestartsAreUsed) {
  RecoveryOptions o;
  o.max_restarts = 2;
  EXPECT_TRUE(RecoveryPolicy::RestartsLeft(0, o));
  EXPECT_TRUE(RecoveryPolicy::RestartsLeft(1, o));
  EXPECT_FALSE(RecoveryPolicy::RestartsLeft(2, o));
  o.max_restarts = 0;
  EXPECT_FALSE(RecoveryPolicy::RestartsLeft(0, o));
}

TEST(RecoveryPolicyTest, ExitCodesThatARestartCannotHelpSaySo) {
  EXPECT_THAT(RecoveryPolicy::NoRestartBecause(kRankExitNoGoodCheckpoint, 0),
              HasSubstr("no checkpoint verifies"));
  EXPECT_THAT(RecoveryPolicy::NoRestartBecause(kRankExitCheckpointVolumeFull, 0),
              HasSubstr("checkpoint volume is full"));
  EXPECT_THAT(RecoveryPolicy::NoRestartBecause(kRankExitCheckpointFenced, 0),
              HasSubstr("claimed by another job or attempt"));
  EXPECT_EQ(RecoveryPolicy::NoRestartBecause(1, 0), "");
  EXPECT_EQ(RecoveryPolicy::NoRestartBecause(kRankExitRendezvousFailed, 0), "");
  // A signal, whatever the code field says, is the usual policy.
  EXPECT_EQ(RecoveryPolicy::NoRestartBecause(kRankExitNoGoodCheckpoint, 9), "");
}

TEST(RecoveryPolicyTest, RendezvousFailureIsOnlyBeforeAnyStepAndWithoutSignal) {
  EXPECT_TRUE(RecoveryPolicy::IsRendezvousFailure(kRankExitRendezvousFailed, 0, -1));
  EXPECT_FALSE(RecoveryPolicy::IsRendezvousFailure(kRankExitRendezvousFailed, 0, 0));
  EXPECT_FALSE(RecoveryPolicy::IsRendezvousFailure(kRankExitRendezvousFailed, 15, -1));
  EXPECT_FALSE(RecoveryPolicy::IsRendezvousFailure(1, 0, -1));
  EXPECT_EQ(RecoveryPolicy::LeaseExpiredCauseKind(false), kCauseWorkerLost);
  EXPECT_EQ(RecoveryPolicy::LeaseExpiredCauseKind(true), kCauseControllerRestart);
}

TEST(RecoveryPolicyTest, RendezvousFailuresArePlacedAgainABoundedNumberOfTimes) {
  RecoveryPolicyOptions options;
  options.max_rendezvous_retries = 2;
  RecoveryPolicy policy(options);
  SettledFailure f;
  f.rendezvous = true;
  f.rendezvous_retries = 0;
  EXPECT_EQ(policy.DecideFailure(f).action, FailureDecision::kPlaceAgain);
  f.rendezvous_retries = 1;
  EXPECT_EQ(policy.DecideFailure(f).action, FailureDecision::kPlaceAgain);
  f.rendezvous_retries = 2;
  FailureDecision d = policy.DecideFailure(f);
  EXPECT_EQ(d.action, FailureDecision::kRestartOrFail);
  EXPECT_EQ(d.cause_kind, kCauseRankFailure);
  // A silent worker is the likelier cause: no free retry.
  f.rendezvous_retries = 0;
  f.worker_went_silent = true;
  d = policy.DecideFailure(f);
  EXPECT_EQ(d.action, FailureDecision::kRestartOrFail);
  EXPECT_EQ(d.cause_kind, kCauseWorkerLost);
}

TEST(RecoveryPolicyTest, NoRestartBecauseFailsWithoutARestartUnlessAWorkerIsToBlame) {
  RecoveryPolicy policy;
  SettledFailure f;
  f.no_restart_because = "the checkpoint volume is full";
  EXPECT_EQ(policy.DecideFailure(f).action, FailureDecision::kFailWithoutRestart);
  f.worker_went_silent = true;
  EXPECT_EQ(policy.DecideFailure(f).action, FailureDecision::kRestartOrFail);
  f.worker_went_silent = false;
  f.across_controller_restart = true;
  FailureDecision d = policy.DecideFailure(f);
  EXPECT_EQ(d.action, FailureDecision::kRestartOrFail);
  EXPECT_TRUE(d.blame_controller_restart);
  EXPECT_EQ(d.cause_kind, kCauseControllerRestart);
}

TEST(RecoveryPolicyTest, CauseKindPrefersWhatIsKnownThenTheSilentWorker) {
  RecoveryPolicy policy;
  SettledFailure f;
  FailureDecision d = policy.DecideFailure(f);
  EXPECT_EQ(d.action, FailureDecision::kRestartOrFail);
  EXPECT_EQ(d.cause_kind, kCauseRankFailure);
  EXPECT_FALSE(d.blame_controller_restart);

  f.worker_went_silent = true;
  EXPECT_EQ(policy.DecideFailure(f).cause_kind, kCauseWorkerLost);

  // A rank killed when its worker's lease ran out, across a controller
  // restart: the known kind stands, and the restart is not named again.
  f.worker_went_silent = false;
  f.across_controller_restart = true;
  f.cause_kind = kCauseControllerRestart;
  d = policy.DecideFailure(f);
  EXPECT_EQ(d.cause_kind, kCauseControllerRestart);
  EXPECT_FALSE(d.blame_controller_restart);
  f.cause_kind = kCauseWorkerLost;
  EXPECT_EQ(policy.DecideFailure(f).cause_kind, kCauseWorkerLost);

  // A silent worker outranks the controller restart.
  f.cause_kind.clear();
  f.worker_went_silent = true;
  d = policy.DecideFailure(f);
  EXPECT_FALSE(d.blame_controller_restart);
  EXPECT_EQ(d.cause_kind, kCauseWorkerLost);
}

// Checkpoints on "disk" at these steps.
std::function<int64_t(int64_t)> Checkpoints(std::vector<int64_t> steps,
                                            std::vector<int64_t>* asked = nullptr) {
  return [steps, asked](int64_t max_step) {
    if (asked != nullptr) asked->push_back(max_step);
    int64_t newest = 0;
    for (int64_t s : steps) {
      if ((max_step < 0 || s <= max_step) && s > newest) newest = s;
    }
    return newest;
  };
}

TEST(RecoveryPolicyTest, SpikeRollsBackRollbackDistanceAndSkipsAroundItsBatch) {
  RecoveryOptions o;  // distance 100, skip 100 before and 200 after
  std::map<int64_t, int64_t> batches;
  for (int64_t s = 1; s <= 500; ++s) batches[s] = 1000 + s;  // step s trained batch 1000+s
  SpikeFacts spike;
  spike.step = 450;
  spike.data_batch = 1450;
  spike.step_batches = &batches;
  std::vector<int64_t> asked;
  SpikeRollback r =
      RecoveryPolicy::DecideSpikeRollback(o, spike, Checkpoints({200, 300, 400}, &asked));
  EXPECT_FALSE(r.give_up);
  EXPECT_FALSE(r.widen_skip);
  EXPECT_THAT(asked, ElementsAre(350));
  EXPECT_EQ(r.resume_step, 300);
  // Batches [1350, 1651) minus those trained up to step 300 (<= 1300): none.
  EXPECT_EQ(r.skip.begin(), 1350);
  EXPECT_EQ(r.skip.end(), 1651);

  // The window reaches back past the resume point: it starts at the first
  // batch the rollback undoes (step 301's).
  o.skip_before = 400;
  r = RecoveryPolicy::DecideSpikeRollback(o, spike, Checkpoints({200, 300, 400}));
  EXPECT_EQ(r.skip.begin(), 1301);
  // Unknown batches (no record of step resume+1): the window as computed,
  // never below batch 0.
  o.skip_before = 5000;
  std::map<int64_t, int64_t> none;
  spike.step_batches = &none;
  r = RecoveryPolicy::DecideSpikeRollback(o, spike, Checkpoints({300}));
  EXPECT_EQ(r.skip.begin(), 0);
}

TEST(RecoveryPolicyTest, SpikeWithNoCheckpointThatFarBackTakesTheNewestBeforeItOrScratch) {
  RecoveryOptions o;
  SpikeFacts spike;
  spike.step = 150;
  spike.data_batch = 150;
  std::vector<int64_t> asked;
  SpikeRollback r = RecoveryPolicy::DecideSpikeRollback(o, spike, Checkpoints({100}, &asked));
  EXPECT_THAT(asked, ElementsAre(50, 149));
  EXPECT_EQ(r.resume_step, 100);
  asked.clear();
  r = RecoveryPolicy::DecideSpikeRollback(o, spike, Checkpoints({150, 200}, &asked));
  EXPECT_THAT(asked, ElementsAre(50, 149));
  EXPECT_EQ(r.resume_step, 0);  // from scratch
  spike.step = 30;              // target clamps at step 0
  asked.clear();
  RecoveryPolicy::DecideSpikeRollback(o, spike, Checkpoints({}, &asked));
  EXPECT_THAT(asked, ElementsAre(0, 29));
}

TEST(RecoveryPolicyTest, SpikeReturningInsideTheWindowWidensItOnce) {
  RecoveryOptions o;
  o.skip_before = 10;
  o.skip_after = 20;
  SpikeFacts spike;
  spike.step = 500;
  spike.data_batch = 500;
  spike.last_spike_step = 480;  // within skip_after of the last spike
  SpikeRollback r = RecoveryPolicy::DecideSpikeRollback(o, spike, Checkpoints({}));
  EXPECT_TRUE(r.widen_skip);
  EXPECT_EQ(r.skip.begin(), 480);
  EXPECT_EQ(r.skip.end(), 541);
  spike.skip_widened = true;  // once only
  r = RecoveryPolicy::DecideSpikeRollback(o, spike, Checkpoints({}));
  EXPECT_FALSE(r.widen_skip);
  EXPECT_EQ(r.skip.begin(), 490);
  EXPECT_EQ(r.skip.end(), 521);
  spike.skip_widened = false;
  spike.last_spike_step = 479;  // 21 steps before: outside
  EXPECT_FALSE(RecoveryPolicy::DecideSpikeRollback(o, spike, Checkpoints({})).widen_skip);
}

TEST(RecoveryPolicyTest, SpikeGivesUpAtMaxRollbacksWithoutLookingForACheckpoint) {
  RecoveryOptions o;
  o.max_rollbacks = 2;
  SpikeFacts spike;
  spike.step = 500;
  spike.rollbacks = 1;
  EXPECT_FALSE(RecoveryPolicy::DecideSpikeRollback(o, spike, Checkpoints({})).give_up);
  spike.rollbacks = 2;
  std::vector<int64_t> asked;
  EXPECT_TRUE(RecoveryPolicy::DecideSpikeRollback(o, spike, Checkpoints({}, &asked)).give_up);
  EXPECT_THAT(asked, IsEmpty());
  o.max_rollbacks = 0;
  spike.rollbacks = 0;
  EXPECT_TRUE(RecoveryPolicy::DecideSpikeRollback(o, spike, Checkpoints({})).give_up);
}

loom::v1::SkipRange Range(int64_t begin, int64_t end) {
  loom::v1::SkipRange r;
  r.set_begin(begin);
  r.set_end(end);
  return r;
}

TEST(RecoveryPolicyTest, OperatorSkipRangesAreClippedToTheFirstUndoneBatch) {
  std::map<int64_t, int64_t> batches = {{40, 400}, {41, 410}, {42, 420}};
  google::protobuf::RepeatedPtrField<loom::v1::SkipRange> skips;
  *skips.Add() = Range(405, 430);
  *skips.Add() = Range(500, 510);
  auto clipped = RecoveryPolicy::ClipSkipRanges(skips, 40, batches);
  ASSERT_TRUE(clipped.ok()) << clipped.status();
  ASSERT_EQ(clipped->size(), 2u);
  EXPECT_EQ((*clipped)[0].begin(), 410);
  EXPECT_EQ((*clipped)[0].end(), 430);
  EXPECT_EQ((*clipped)[1].begin(), 500);

  *skips.Add() = Range(100, 410);  // ends where the undone batches begin
  auto refused = RecoveryPolicy::ClipSkipRanges(skips, 40, batches);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("skip[2]: batches [100, 410) were trained before the checkpoint at "
                        "step 40"));
  // Not known which batch step 51 trained: nothing is clipped.
  clipped = RecoveryPolicy::ClipSkipRanges(skips, 50, batches);
  ASSERT_TRUE(clipped.ok());
  EXPECT_EQ((*clipped)[2].begin(), 100);
  EXPECT_EQ(RecoveryPolicy::FirstUndoneBatch(batches, 41), 420);
  EXPECT_EQ(RecoveryPolicy::FirstUndoneBatch(batches, 42), -1);
}

}  // namespace
}  // namespace loom::controller
