#include "worker/telemetry/peak_flops.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::telemetry {
namespace {

// The case that printed "MFU 115.5%": a 1-thread rank calibrated at 68.8
// GFLOP/s, then steps at 79.5. The step raises the peak, not the MFU.
TEST(PeakFlopsTest, AStepFasterThanTheCalibrationRaisesThePeakNotTheMfu) {
  PeakFlops peak(68.8e9, PeakFlops::Source::kCalibrated, "calibrated fp32 GEMM, 1 thread");
  EXPECT_DOUBLE_EQ(peak.Observe(34.4e9), 0.5);
  EXPECT_DOUBLE_EQ(peak.Observe(79.5e9), 1.0);
  EXPECT_DOUBLE_EQ(peak.peak(), 79.5e9);
  EXPECT_EQ(peak.exceeded(), 1);
  // Later steps are measured against the raised peak.
  EXPECT_NEAR(peak.Observe(68.8e9), 68.8 / 79.5, 1e-12);
  EXPECT_DOUBLE_EQ(peak.initial_peak(), 68.8e9);
  EXPECT_THAT(peak.Describe(), testing::HasSubstr("calibrated fp32 GEMM, 1 thread, raised 16%"));
  EXPECT_THAT(peak.Describe(), testing::HasSubstr("by 1 step(s)"));
}

TEST(PeakFlopsTest, NeverAboveOneWhateverTheSteps) {
  for (PeakFlops::Source source : {PeakFlops::Source::kCalibrated, PeakFlops::Source::kDatasheet}) {
    PeakFlops peak(100, source, "p");
    for (double achieved : {1.0, 99.0, 100.0, 150.0, 1e6, 120.0, 5.0}) {
      const double mfu = peak.Observe(achieved);
      EXPECT_GE(mfu, 0);
      EXPECT_LE(mfu, 1.0) << achieved;
    }
  }
}

// A datasheet peak is not raised: a step above it is a wrong FLOP count or
// board, reported at 100% and named.
TEST(PeakFlopsTest, ADatasheetPeakIsNotRaisedAndAnExcessIsNamed) {
  PeakFlops peak(989.4e12, PeakFlops::Source::kDatasheet, "datasheet bf16 peak of H100-SXM");
  EXPECT_DOUBLE_EQ(peak.Observe(1000e12), 1.0);
  EXPECT_DOUBLE_EQ(peak.peak(), 989.4e12);
  EXPECT_NEAR(peak.Observe(494.7e12), 0.5, 1e-12);
  EXPECT_EQ(peak.exceeded(), 1);
  EXPECT_THAT(peak.Describe(), testing::HasSubstr("exceeded it"));
}

TEST(PeakFlopsTest, NoPeakOrNoWorkGivesNoMfu) {
  PeakFlops none(0, PeakFlops::Source::kDatasheet, "unknown board");
  EXPECT_EQ(none.Observe(1e12), 0);
  PeakFlops peak(1e9, PeakFlops::Source::kCalibrated, "p");
  EXPECT_EQ(peak.Observe(0), 0);
  EXPECT_EQ(peak.Describe(), "p");
}

}  // namespace
}  // namespace loom::telemetry
