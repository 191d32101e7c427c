#include "worker/engine/loss_scaler.h"

#include "gtest/gtest.h"

namespace loom::engine {
namespace {

TEST(DynamicLossScalerTest, DefaultsAreGradScalers) {
  DynamicLossScaler scaler;
  EXPECT_EQ(scaler.scale(), 65536.0);
  EXPECT_EQ(scaler.inv_scale(), 1.0 / 65536.0);
  EXPECT_EQ(LossScalerOptions().growth_interval, 2000);
}

TEST(DynamicLossScalerTest, OverflowHalvesAndSkips) {
  DynamicLossScaler scaler;
  EXPECT_FALSE(scaler.Update(/*grads_finite=*/false));
  EXPECT_EQ(scaler.scale(), 32768.0);
  EXPECT_FALSE(scaler.Update(false));
  EXPECT_EQ(scaler.scale(), 16384.0);
  EXPECT_EQ(scaler.overflow_steps(), 2);
  EXPECT_EQ(scaler.clean_steps(), 0);
}

TEST(DynamicLossScalerTest, DoublesAfterExactlyGrowthIntervalCleanSteps) {
  DynamicLossScaler scaler;  // N = 2000
  for (int i = 0; i < 1999; ++i) ASSERT_TRUE(scaler.Update(true));
  EXPECT_EQ(scaler.scale(), 65536.0);
  EXPECT_EQ(scaler.clean_steps(), 1999);
  EXPECT_TRUE(scaler.Update(true));
  EXPECT_EQ(scaler.scale(), 131072.0);
  EXPECT_EQ(scaler.clean_steps(), 0);
  // The next doubling needs another full interval.
  for (int i = 0; i < 1999; ++i) scaler.Update(true);
  EXPECT_EQ(scaler.scale(), 131072.0);
  scaler.Update(true);
  EXPECT_EQ(scaler.scale(), 262144.0);
}

TEST(DynamicLossScalerTest, OverflowRestartsTheCleanRun) {
  LossScalerOptions options;
  options.growth_interval = 3;
  DynamicLossScaler scaler(options);
  scaler.Update(true);
  scaler.Update(true);
  scaler.Update(false);  // 65536 -> 32768, run reset
  EXPECT_EQ(scaler.scale(), 32768.0);
  scaler.Update(true);
  scaler.Update(true);
  EXPECT_EQ(scaler.scale(), 32768.0);
  scaler.Update(true);
  EXPECT_EQ(scaler.scale(), 65536.0);
}

TEST(DynamicLossScalerTest, StaysWithinMinAndMax) {
  LossScalerOptions options;
  options.initial_scale = 4;
  options.min_scale = 1;
  options.max_scale = 8;
  options.growth_interval = 1;
  DynamicLossScaler scaler(options);
  for (int i = 0; i < 10; ++i) scaler.Update(false);
  EXPECT_EQ(scaler.scale(), 1.0);
  for (int i = 0; i < 10; ++i) scaler.Update(true);
  EXPECT_EQ(scaler.scale(), 8.0);
}

// A scaler restored from a checkpoint's state continues exactly as the one
// that was saved: same scale, and it doubles after the same remaining clean
// steps. Bad states are refused without changing anything.
TEST(DynamicLossScalerTest, RestoreContinuesTheSavedRun) {
  LossScalerOptions o;
  o.growth_interval = 4;
  DynamicLossScaler saved(o);
  saved.Update(false);  // 32768, 1 overflow
  saved.Update(true);
  saved.Update(true);   // 2 clean steps
  DynamicLossScaler resumed(o);
  ASSERT_TRUE(resumed.Restore(saved.scale(), saved.clean_steps(), saved.overflow_steps()).ok());
  EXPECT_EQ(resumed.scale(), 32768);
  EXPECT_EQ(resumed.overflow_steps(), 1);
  for (int i = 0; i < 2; ++i) {
    saved.Update(true);
    resumed.Update(true);
    EXPECT_EQ(resumed.scale(), saved.scale());
  }
  EXPECT_EQ(resumed.scale(), 65536);  // doubled after 4 clean steps in all

  EXPECT_FALSE(resumed.Restore(0.5, 0, 0).ok());        // below min_scale 1
  EXPECT_FALSE(resumed.Restore(1e9, 0, 0).ok());        // above max_scale
  EXPECT_FALSE(resumed.Restore(1024, 4, 0).ok());       // clean_steps >= growth_interval
  EXPECT_FALSE(resumed.Restore(1024, 0, -1).ok());
  EXPECT_EQ(resumed.scale(), 65536);  // unchanged by the refusals
}

TEST(DynamicLossScalerTest, ValidationNamesTheOption) {
  LossScalerOptions bad;
  bad.growth_interval = 0;
  EXPECT_EQ(ValidateLossScalerOptions(bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ValidateLossScalerOptions(bad).message().find("growth_interval"), std::string::npos);
  bad = {};
  bad.backoff_factor = 1;
  EXPECT_NE(ValidateLossScalerOptions(bad).message().find("backoff_factor"), std::string::npos);
  bad = {};
  bad.initial_scale = 0.5;  // below min_scale 1
  EXPECT_NE(ValidateLossScalerOptions(bad).message().find("initial_scale"), std::string::npos);
  EXPECT_TRUE(ValidateLossScalerOptions({}).ok());
}

}  // namespace
}  // namespace loom::engine
