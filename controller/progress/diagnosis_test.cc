#include "controller/progress/diagnosis.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::controller {
namespace {

using ::testing::HasSubstr;
using V = loom::v1::Diagnosis;

// `n` steps of 1 s each split as given (seconds), at `mfu`, with a peak
// resident set of `rss` bytes out of `limit`.
std::vector<loom::v1::StepMetrics> Steps(int n, double data, double compute, double comm,
                                         double optimizer, double mfu, double rss = 1e9,
                                         double limit = 8e9) {
  std::vector<loom::v1::StepMetrics> out;
  for (int i = 1; i <= n; ++i) {
    loom::v1::StepMetrics m;
    m.set_step(i);
    m.set_step_time_seconds(1.0);
    m.set_data_wait_seconds(data);
    m.set_compute_seconds(compute);
    m.set_comm_seconds(comm);
    m.set_optimizer_seconds(optimizer);
    m.set_mfu(mfu);
    m.set_peak_flops_per_second(1e12);
    m.set_peak_rss_bytes(static_cast<uint64_t>(rss));
    m.set_memory_limit_bytes(limit);
    out.push_back(m);
  }
  return out;
}

TEST(DiagnosisTest, TooFewStepsGiveNoVerdict) {
  V d = Diagnose(Steps(2, 0, 0.9, 0, 0.1, 0.5));
  EXPECT_EQ(d.verdict(), V::VERDICT_UNSPECIFIED);
  EXPECT_THAT(d.summary(), HasSubstr("not enough steps"));
  // Step 0 (validation before training) and steps without a split do not count.
  std::vector<loom::v1::StepMetrics> steps = Steps(5, 0, 0.9, 0, 0.1, 0.5);
  steps[0].set_step(0);
  steps[1].set_compute_seconds(0);
  steps[2].set_compute_seconds(0);
  EXPECT_EQ(Diagnose(steps).verdict(), V::VERDICT_UNSPECIFIED);
}

TEST(DiagnosisTest, WaitingForInputIsDataBoundWhateverElseHolds) {
  // Even with high communication, the data wait is the first question.
  V d = Diagnose(Steps(10, 0.3, 0.3, 0.35, 0.05, 0.2));
  EXPECT_EQ(d.verdict(), V::DATA_BOUND);
  EXPECT_THAT(d.summary(), HasSubstr("30.0%"));
  EXPECT_THAT(d.intervention(), HasSubstr("prefetch"));
  EXPECT_THAT(d.evidence(1), HasSubstr("data wait 30.0%"));
}

TEST(DiagnosisTest, NearTheMemoryLimitIsCapacityBound) {
  V d = Diagnose(Steps(10, 0.0, 0.9, 0.0, 0.1, 0.6, /*rss=*/7.6e9, /*limit=*/8e9));
  EXPECT_EQ(d.verdict(), V::MEMORY_CAPACITY_BOUND);
  EXPECT_THAT(d.intervention(), HasSubstr("activation checkpointing"));
  EXPECT_THAT(d.evidence(3), HasSubstr("95.0%"));
}

TEST(DiagnosisTest, ExposedAllReduceIsCommunicationBound) {
  V d = Diagnose(Steps(10, 0.01, 0.5, 0.45, 0.04, 0.3));
  EXPECT_EQ(d.verdict(), V::COMMUNICATION_BOUND);
  EXPECT_THAT(d.intervention(), HasSubstr("accumulation"));
}

TEST(DiagnosisTest, HighMfuIsComputeBoundAndLowMfuIsBandwidthBound) {
  EXPECT_EQ(Diagnose(Steps(10, 0.0, 0.9, 0.02, 0.08, 0.55)).verdict(), V::COMPUTE_BOUND);
  V d = Diagnose(Steps(10, 0.0, 0.8, 0.02, 0.18, 0.2));
  EXPECT_EQ(d.verdict(), V::MEMORY_BANDWIDTH_BOUND);
  EXPECT_THAT(d.intervention(), HasSubstr("micro-batch"));
  EXPECT_THAT(d.evidence(2), HasSubstr("MFU 20.0%"));
}

TEST(DiagnosisTest, UsesOnlyTheNewestWindow) {
  // 40 old data-bound steps, then 32 healthy ones: the window sees only the latter.
  std::vector<loom::v1::StepMetrics> steps = Steps(72, 0.5, 0.4, 0, 0.1, 0.6);
  for (int i = 40; i < 72; ++i) {
    steps[i].set_data_wait_seconds(0);
    steps[i].set_compute_seconds(0.9);
  }
  V d = Diagnose(steps);
  EXPECT_EQ(d.steps_considered(), 32);
  EXPECT_EQ(d.step(), 72);
  EXPECT_EQ(d.verdict(), V::COMPUTE_BOUND);
}

TEST(DiagnosisTest, VerdictNames) {
  EXPECT_STREQ(VerdictName(V::DATA_BOUND), "data-bound");
  EXPECT_STREQ(VerdictName(V::VERDICT_UNSPECIFIED), "undetermined");
}

}  // namespace
}  // namespace loom::controller
