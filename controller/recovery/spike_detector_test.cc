#include "controller/recovery/spike_detector.h"

#include <cmath>
#include <limits>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::recovery {
namespace {

using ::testing::HasSubstr;

// A normal run: loss decays from ~5.5 towards 2 with multiplicative noise,
// gradient norm noisy around a slowly falling level.
struct Curve {
  std::mt19937_64 rng{12345};
  std::normal_distribution<double> noise{0.0, 1.0};
  double Loss(int t) { return (2.0 + 3.5 * std::exp(-t / 400.0)) * (1.0 + 0.02 * noise(rng)); }
  double GradNorm(int t) { return (0.5 + 2.0 * std::exp(-t / 300.0)) * (1.0 + 0.15 * noise(rng)); }
};

TEST(SpikeDetectorTest, NoFalsePositiveOnANoisyDecayingCurve) {
  SpikeDetector d;
  Curve c;
  int spikes = 0;
  for (int t = 1; t <= 5000; ++t) {
    SpikeVerdict v = d.Observe(t, c.Loss(t), c.GradNorm(t));
    if (v.spike) {
      ++spikes;
      ADD_FAILURE() << v.Describe();
    }
  }
  EXPECT_EQ(spikes, 0);
}

TEST(SpikeDetectorTest, ThreeTimesJumpIsCaughtOnThatStep) {
  SpikeDetector d;
  Curve c;
  for (int t = 1; t < 1000; ++t) ASSERT_FALSE(d.Observe(t, c.Loss(t), c.GradNorm(t)).spike);
  double normal = c.Loss(1000);
  SpikeVerdict v = d.Observe(1000, 3 * normal, c.GradNorm(1000));
  ASSERT_TRUE(v.spike);
  EXPECT_EQ(v.signal, "loss");
  EXPECT_EQ(v.step, 1000);
  EXPECT_GT(v.score, 6.0);
  EXPECT_NEAR(v.baseline, normal, 0.2);
  EXPECT_THAT(v.Describe(), HasSubstr("robust z"));
}

TEST(SpikeDetectorTest, NonFiniteIsASpikeEvenWithoutHistory) {
  SpikeDetector d;
  SpikeVerdict v = d.Observe(1, std::numeric_limits<double>::quiet_NaN(), 1.0);
  EXPECT_TRUE(v.spike);
  EXPECT_EQ(v.signal, "non-finite loss");
  v = d.Observe(2, 3.0, std::numeric_limits<double>::infinity());
  EXPECT_TRUE(v.spike);
  EXPECT_EQ(v.signal, "non-finite grad_norm");
}

TEST(SpikeDetectorTest, NoDecisionBeforeMinHistory) {
  SpikeDetector d;
  for (int t = 1; t <= 63; ++t) {
    // Wild values, but fewer than 64 steps of history: nothing is decided.
    EXPECT_FALSE(d.Observe(t, t % 2 ? 2.0 : 20.0, 1.0).spike);
  }
}

TEST(SpikeDetectorTest, SpikesDoNotEnterTheBaseline) {
  SpikeDetectorOptions o;
  o.confirm_steps = 3;
  SpikeDetector d(o);
  Curve c;
  for (int t = 1; t <= 200; ++t) d.Observe(t, c.Loss(t), c.GradNorm(t));
  int history = d.history();
  // Two anomalous steps: not yet confirmed, and not accepted either.
  EXPECT_FALSE(d.Observe(201, 30.0, 1.0).spike);
  EXPECT_FALSE(d.Observe(202, 30.0, 1.0).spike);
  EXPECT_EQ(d.history(), history);
  SpikeVerdict v = d.Observe(203, 30.0, 1.0);
  EXPECT_TRUE(v.spike);
  EXPECT_EQ(v.step, 203);
}

TEST(SpikeDetectorTest, UnconfirmedBlipResetsTheRun) {
  SpikeDetectorOptions o;
  o.confirm_steps = 2;
  SpikeDetector d(o);
  Curve c;
  for (int t = 1; t <= 200; ++t) d.Observe(t, c.Loss(t), c.GradNorm(t));
  EXPECT_FALSE(d.Observe(201, 30.0, 1.0).spike);
  EXPECT_FALSE(d.Observe(202, c.Loss(202), c.GradNorm(202)).spike);
  EXPECT_FALSE(d.Observe(203, 30.0, 1.0).spike);
  EXPECT_TRUE(d.Observe(204, 30.0, 1.0).spike);
}

TEST(SpikeDetectorTest, TruncateForgetsStepsAfterTheRollbackPoint) {
  SpikeDetector d;
  Curve c;
  for (int t = 1; t <= 300; ++t) d.Observe(t, c.Loss(t), c.GradNorm(t));
  d.Truncate(200);
  EXPECT_EQ(d.history(), 128);  // the window still holds 128 accepted steps <= 200
  // Replaying steps 201.. after the rollback is normal.
  for (int t = 201; t <= 300; ++t) EXPECT_FALSE(d.Observe(t, c.Loss(t), c.GradNorm(t)).spike);
}

TEST(SpikeDetectorTest, GradNormIsASecondarySignal) {
  SpikeDetector d;
  Curve c;
  for (int t = 1; t < 500; ++t) d.Observe(t, c.Loss(t), c.GradNorm(t));
  // One outlier gradient norm (7x, as real text batches produce) is no spike ...
  EXPECT_FALSE(d.Observe(500, c.Loss(500), 7 * c.GradNorm(500)).spike);
  EXPECT_FALSE(d.Observe(501, c.Loss(501), c.GradNorm(501)).spike);
  // ... three in a row are.
  EXPECT_FALSE(d.Observe(502, c.Loss(502), 100.0).spike);
  EXPECT_FALSE(d.Observe(503, c.Loss(503), 100.0).spike);
  SpikeVerdict v = d.Observe(504, c.Loss(504), 100.0);
  ASSERT_TRUE(v.spike);
  EXPECT_EQ(v.signal, "grad_norm");
  EXPECT_EQ(v.step, 504);
}

}  // namespace
}  // namespace loom::recovery
