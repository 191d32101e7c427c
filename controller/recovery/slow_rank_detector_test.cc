#include "controller/recovery/slow_rank_detector.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace loom::recovery {
namespace {

// Per-rank compute seconds of one report: `base` with log-normal jitter
// (sigma 0.15, as ranks sharing this machine's cores show), rank `slow`
// (if any) `factor` times slower.
std::vector<double> Report(std::mt19937& rng, int ranks, double base, int slow = -1,
                           double factor = 1) {
  std::lognormal_distribution<double> jitter(0.0, 0.15);
  std::vector<double> out;
  for (int r = 0; r < ranks; ++r) out.push_back(base * jitter(rng) * (r == slow ? factor : 1));
  return out;
}

TEST(SlowRankDetectorTest, CleanNoisyRunsNameNoRank) {
  for (int ranks : {2, 3, 4, 8}) {
    for (unsigned seed = 1; seed <= 5; ++seed) {
      std::mt19937 rng(seed);
      SlowRankDetector detector;
      for (int step = 1; step <= 3000; ++step) {
        // The whole job slows down now and then (a checkpoint, another job).
        const double base = (step / 200) % 2 == 0 ? 0.05 : 0.2;
        EXPECT_TRUE(detector.Observe(step, step, Report(rng, ranks, base)).empty())
            << ranks << " ranks, seed " << seed << ", step " << step;
      }
    }
  }
}

TEST(SlowRankDetectorTest, NamesARankThatStaysSlowWithinTheConfirmingReports) {
  std::mt19937 rng(7);
  SlowRankDetector detector;
  for (int step = 1; step <= 100; ++step) {
    ASSERT_TRUE(detector.Observe(step, step, Report(rng, 4, 0.1)).empty());
  }
  std::vector<SlowRankFinding> found;
  int step = 101;
  for (; step <= 120 && found.empty(); ++step) {
    found = detector.Observe(step, step, Report(rng, 4, 0.1, /*slow=*/2, /*factor=*/3));
  }
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].rank, 2);
  // Named on the fourth slow report (confirm_reports 4).
  EXPECT_EQ(found[0].step, 104);
  EXPECT_EQ(found[0].first_slow_step, 101);
  EXPECT_EQ(found[0].reports, 4);
  EXPECT_GT(found[0].slowdown, 1.5);
  EXPECT_NEAR(found[0].peer_seconds, 0.1, 0.02);
  EXPECT_NEAR(found[0].seconds, 0.3, 0.1);
  EXPECT_GE(found[0].z, 6);
  EXPECT_NE(found[0].Describe().find("rank 2"), std::string::npos);
  // Once per attempt.
  for (int more = 0; more < 20; ++more) {
    EXPECT_TRUE(detector.Observe(step++, step++, Report(rng, 4, 0.1, 2, 3)).empty());
  }
  EXPECT_EQ(detector.named().count(2), 1u);
  // A new attempt starts again.
  detector.Reset();
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(detector.Observe(step++, step++, Report(rng, 4, 0.1, 2, 3)).empty());
  found.clear();
  for (int i = 0; i < 4 && found.empty(); ++i)
    found = detector.Observe(step++, step++, Report(rng, 4, 0.1, 2, 3));
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].rank, 2);
}

TEST(SlowRankDetectorTest, TwoRanksAreEnoughAndModestSlowdownsBelowTheFloorAreNot) {
  std::mt19937 rng(3);
  SlowRankDetector detector;
  for (int step = 1; step <= 50; ++step) detector.Observe(step, step, Report(rng, 2, 0.1));
  // 1.2x stays under min_slowdown 1.5.
  for (int step = 51; step <= 300; ++step) {
    EXPECT_TRUE(detector.Observe(step, step, Report(rng, 2, 0.1, 1, 1.2)).empty()) << step;
  }
  std::vector<SlowRankFinding> found;
  for (int step = 301; step <= 310 && found.empty(); ++step) {
    found = detector.Observe(step, step, Report(rng, 2, 0.1, 1, 4));
  }
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].rank, 1);
}

TEST(SlowRankDetectorTest, SingleOutliersAndWholeJobSlowdownsAreNotSlowRanks) {
  std::mt19937 rng(11);
  SlowRankDetector detector;
  for (int step = 1; step <= 400; ++step) {
    std::vector<double> r = Report(rng, 4, 0.1);
    if (step % 5 == 0) r[step % 4] *= 10;  // a hiccup every 5th report, never 4 in a row
    if (step >= 200 && step < 260) {
      for (double& x : r) x *= 4;  // all ranks slow together
    }
    EXPECT_TRUE(detector.Observe(step, step, r).empty()) << step;
  }
}

TEST(SlowRankDetectorTest, ASlowStretchOfTinyStepsMustLastSeconds) {
  SlowRankDetector detector;  // confirm_seconds 3
  double t = 0;
  int step = 1;
  for (; step <= 50; ++step, t += 0.002) detector.Observe(step, t, {0.001, 0.001, 0.001});
  // Rank 1 held back for 200 ms of 2 ms steps: 100 reports in a row.
  for (int i = 0; i < 100; ++i, ++step, t += 0.002) {
    EXPECT_TRUE(detector.Observe(step, t, {0.001, 0.004, 0.001}).empty()) << step;
  }
  for (int i = 0; i < 1500; ++i, ++step, t += 0.002) {
    EXPECT_TRUE(detector.Observe(step, t, {0.001, 0.001, 0.001}).empty()) << step;
  }
  // Held back for good: named once three in four of its newest 1,024
  // reports (2 s of them) are slow.
  std::vector<SlowRankFinding> found;
  const double from = t;
  while (found.empty() && t < from + 10) {
    found = detector.Observe(step++, t, {0.001, 0.004, 0.001});
    t += 0.002;
  }
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].rank, 1);
  EXPECT_NEAR(t - from, 0.75 * 1024 * 0.002, 0.01);
  EXPECT_EQ(found[0].reports, 1024);
  EXPECT_NEAR(found[0].slowdown, 4.0, 1e-9);
}

TEST(SlowRankDetectorTest, OneFastReportAmongSlowOnesDoesNotClearIt) {
  SlowRankDetector detector;
  int step = 1;
  for (; step <= 20; ++step) detector.Observe(step, step, {0.1, 0.1, 0.1, 0.1});
  // Every fifth report of rank 3 is at its peers' pace: still slow.
  std::vector<SlowRankFinding> found;
  for (int i = 0; i < 10 && found.empty(); ++i, ++step) {
    found = detector.Observe(step, step, {0.1, 0.1, 0.1, i % 5 == 4 ? 0.1 : 0.25});
  }
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].rank, 3);
}

TEST(SlowRankDetectorTest, NothingIsDecidedOnTheAttemptsFirstReportsOrNonMeasurements) {
  SlowRankDetector detector;
  // A rank slow from the very start is named once min_history reports passed.
  std::vector<SlowRankFinding> found;
  int step = 1;
  for (; step <= 3; ++step) EXPECT_TRUE(detector.Observe(step, step, {0.1, 0.1, 0.5}).empty());
  for (; step <= 6; ++step) EXPECT_TRUE(detector.Observe(step, step, {0.1, 0.1, 0.5}).empty());
  found = detector.Observe(step++, step++, {0.1, 0.1, 0.5});
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].rank, 2);
  // A world of one, and non-finite values, are not judged.
  SlowRankDetector other;
  for (int i = 0; i < 50; ++i) EXPECT_TRUE(other.Observe(i, i, {0.1}).empty());
  for (int i = 0; i < 50; ++i) EXPECT_TRUE(other.Observe(i, i, {0.1, NAN}).empty());
  // A new rank count (a re-plan) starts the history again.
  SlowRankDetector layout;
  for (int i = 1; i <= 6; ++i) layout.Observe(i, i, {0.1, 0.1, 0.1, 0.1});
  for (int i = 7; i <= 12; ++i) EXPECT_TRUE(layout.Observe(i, i, {0.1, 0.5, 0.1}).empty()) << i;
  EXPECT_EQ(layout.Observe(13, 13, {0.1, 0.5, 0.1}).size(), 1u);
}

}  // namespace
}  // namespace loom::recovery
