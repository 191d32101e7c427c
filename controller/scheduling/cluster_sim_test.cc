// Multi-cycle scenarios on a fake clock (the scheduler's unit tests): the real
// AdmissionPolicy driven through ClusterSim, which fails a cycle on any
// partial gang, over-committed worker or inconsistent decision.
#include "controller/scheduling/cluster_sim.h"

#include <cstdlib>
#include <string>

#include "controller/scheduling/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::scheduling {
namespace {

using namespace ::loom::scheduling::testing;  // NOLINT: test builders

constexpr absl::Duration kCycle = absl::Seconds(10);

TEST(ClusterSimTest, DeadlockScenarioOneRunsOneWaitsBothFinish) {
  ClusterSim sim(DefaultQueueConfig(), Workers(4), kT0);
  sim.Submit(Pending("x", "default", 4), absl::Seconds(25));
  sim.Submit(Pending("y", "default", 4), absl::Seconds(25));
  int cycles = 0;
  while (!(sim.Finished("x") && sim.Finished("y")) && cycles < 20) {
    auto d = sim.RunCycle();
    ASSERT_TRUE(d.ok()) << d.status();
    // Never both, never a part of either.
    EXPECT_FALSE(sim.Running("x") && sim.Running("y"));
    EXPECT_THAT(sim.QueueUsage("default").slots, ::testing::AnyOf(0, 4));
    sim.Advance(kCycle);
    ++cycles;
  }
  EXPECT_TRUE(sim.Finished("x"));
  EXPECT_TRUE(sim.Finished("y"));
  EXPECT_EQ(sim.preemptions(), 0);
}

TEST(ClusterSimTest, DeadlockScenarioAcrossQueuesOfACohort) {
  // Each queue may borrow the whole cohort; both submit a whole-cluster gang.
  ClusterSim sim(Config(R"(
queues:
  - {name: a, cohort: c, nominal_quota: {slots: 2}}
  - {name: b, cohort: c, nominal_quota: {slots: 2}}
)"),
                 Workers(4), kT0);
  sim.Submit(Pending("x", "a", 4), absl::InfiniteDuration());
  sim.Submit(Pending("y", "b", 4), absl::InfiniteDuration());
  for (int c = 0; c < 10; ++c) {
    auto d = sim.RunCycle();
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(sim.Running("x") + sim.Running("y"), 1) << "cycle " << c;
    sim.Advance(kCycle);
  }
  EXPECT_EQ(sim.preemptions(), 0);  // equal borrowed shares: no back and forth
}

// A 4-worker gang behind a steady stream of 1-worker jobs starts within a
// bounded number of cycles: its reservation keeps the freed workers.
TEST(ClusterSimTest, BigGangBehindAStreamOfSmallJobsStarts) {
  ClusterSim sim(DefaultQueueConfig(), Workers(4), kT0);
  int next = 0;
  auto submit_small = [&] {
    PendingJob j = Pending(absl::StrCat("s", next++), "default", 1);
    j.expected_runtime = absl::Seconds(40);
    j.preemptible = false;
    sim.Submit(j, absl::Seconds(40));
  };
  // Saturate the cluster, with a backlog.
  for (int i = 0; i < 6; ++i) submit_small();
  for (int c = 0; c < 5; ++c) {
    ASSERT_TRUE(sim.RunCycle().ok());
    submit_small();
    sim.Advance(kCycle);
  }
  PendingJob gang = Pending("gang", "default", 4);
  gang.expected_runtime = absl::Seconds(30);
  sim.Submit(gang, absl::Seconds(30));
  int waited = 0;
  while (!sim.Running("gang") && waited < 50) {
    auto d = sim.RunCycle();
    ASSERT_TRUE(d.ok()) << d.status();
    submit_small();  // the stream goes on: one per cycle, the cluster's whole throughput
    sim.Advance(kCycle);
    ++waited;
  }
  ASSERT_TRUE(sim.Running("gang"));
  // The backlog ahead of it (at most 4 in the queue) and one runtime: 40 s
  // to drain the running ones, 40 s for the ones queued before it.
  EXPECT_LE(waited, 10);
  EXPECT_EQ(sim.preemptions(), 0);
}

TEST(ClusterSimTest, SmallPreemptibleJobsFillTheReservationAndMakeWay) {
  ClusterSim sim(DefaultQueueConfig(), Workers(4), kT0);
  PendingJob first = Pending("first", "default", 2);
  first.expected_runtime = absl::Seconds(60);
  first.preemptible = false;
  sim.Submit(first, absl::Seconds(60));
  ASSERT_TRUE(sim.RunCycle().ok());
  sim.Advance(kCycle);
  sim.Submit(Pending("gang", "default", 4), absl::Seconds(30));
  sim.Advance(absl::Seconds(1));
  // Preemptible, no runtime: they may only run opportunistically.
  sim.Submit(Pending("filler0", "default", 1), absl::InfiniteDuration());
  sim.Submit(Pending("filler1", "default", 1), absl::InfiniteDuration());
  ASSERT_TRUE(sim.RunCycle().ok());
  EXPECT_TRUE(sim.Running("filler0") && sim.Running("filler1"));
  int cycles = 0;
  while (!sim.Running("gang") && cycles < 20) {
    sim.Advance(kCycle);
    ASSERT_TRUE(sim.RunCycle().ok());
    ++cycles;
  }
  EXPECT_TRUE(sim.Running("gang"));
  EXPECT_LE(cycles, 7);  // first ends at +60 s; fillers save and stop in a cycle
  EXPECT_EQ(sim.preemptions(), 2);
  EXPECT_EQ(sim.steps_lost(), 0);
}

// Two equal-weight queues, one idle then busy, reach an even split (±1
// slot) within a bounded number of cycles, by reclaiming what the other
// borrowed, and stay there.
TEST(ClusterSimTest, FairShareConvergesByReclaimingBorrowedCapacity) {
  ClusterSim sim(Config(R"(
queues:
  - {name: a, cohort: c, nominal_quota: {slots: 4}}
  - {name: b, cohort: c, nominal_quota: {slots: 4}}
)"),
                 Workers(8), kT0);
  for (int i = 0; i < 16; ++i)
    sim.Submit(Pending(absl::StrCat("b", i), "b", 1), absl::InfiniteDuration());
  for (int c = 0; c < 3; ++c) {
    ASSERT_TRUE(sim.RunCycle().ok());
    sim.Advance(kCycle);
  }
  EXPECT_EQ(sim.QueueUsage("b").slots, 8);  // a idle: b borrows all of it
  for (int i = 0; i < 16; ++i)
    sim.Submit(Pending(absl::StrCat("a", i), "a", 1), absl::InfiniteDuration());
  int cycles = 0;
  while (std::abs(sim.QueueUsage("a").slots - sim.QueueUsage("b").slots) > 1 && cycles < 10) {
    ASSERT_TRUE(sim.RunCycle().ok());
    sim.Advance(kCycle);
    ++cycles;
  }
  EXPECT_LE(cycles, 3);  // preempt, save, admit
  const int preemptions = sim.preemptions();
  EXPECT_EQ(preemptions, 4);
  for (int c = 0; c < 30; ++c) {
    ASSERT_TRUE(sim.RunCycle().ok());
    sim.Advance(kCycle);
  }
  EXPECT_EQ(sim.QueueUsage("a").slots, 4);
  EXPECT_EQ(sim.QueueUsage("b").slots, 4);
  EXPECT_EQ(sim.preemptions(), preemptions);  // no thrashing once even
}

TEST(ClusterSimTest, BorrowedCapacitySplitsByWeight) {
  // c lends its 4 slots; a (weight 3) and b (weight 1) borrow them 3:1.
  ClusterSim sim(Config(R"(
queues:
  - {name: a, cohort: shared, nominal_quota: {slots: 2}, weight: 3}
  - {name: b, cohort: shared, nominal_quota: {slots: 2}, weight: 1}
  - {name: c, cohort: shared, nominal_quota: {slots: 4}}
)"),
                 Workers(8), kT0);
  for (int i = 0; i < 16; ++i)
    sim.Submit(Pending(absl::StrCat("b", i), "b", 1), absl::InfiniteDuration());
  ASSERT_TRUE(sim.RunCycle().ok());
  sim.Advance(kCycle);
  EXPECT_EQ(sim.QueueUsage("b").slots, 8);
  for (int i = 0; i < 16; ++i)
    sim.Submit(Pending(absl::StrCat("a", i), "a", 1), absl::InfiniteDuration());
  for (int c = 0; c < 10; ++c) {
    ASSERT_TRUE(sim.RunCycle().ok());
    sim.Advance(kCycle);
  }
  EXPECT_EQ(sim.QueueUsage("a").slots, 2 + 3);
  EXPECT_EQ(sim.QueueUsage("b").slots, 2 + 1);
  const int preemptions = sim.preemptions();
  for (int c = 0; c < 20; ++c) {
    ASSERT_TRUE(sim.RunCycle().ok());
    sim.Advance(kCycle);
  }
  EXPECT_EQ(sim.preemptions(), preemptions);
}

TEST(ClusterSimTest, HigherPriorityPreemptsAndTheVictimResumes) {
  ClusterSim sim(DefaultQueueConfig(), Workers(2), kT0);
  sim.Submit(Pending("low", "default", 2, 1, 0), absl::Seconds(100));
  ASSERT_TRUE(sim.RunCycle().ok());
  sim.Advance(absl::Seconds(30));
  sim.Submit(Pending("high", "default", 2, 1, 10), absl::Seconds(20));
  auto d = sim.RunCycle();
  ASSERT_TRUE(d.ok());
  ASSERT_EQ(d->preemptions.size(), 1u);
  EXPECT_EQ(d->preemptions[0].victim_id, "low");
  sim.Advance(kCycle);
  ASSERT_TRUE(sim.RunCycle().ok());
  EXPECT_TRUE(sim.Running("high"));
  EXPECT_TRUE(sim.Pending("low"));
  for (int c = 0; c < 20 && !sim.Finished("low"); ++c) {
    sim.Advance(kCycle);
    ASSERT_TRUE(sim.RunCycle().ok());
  }
  EXPECT_TRUE(sim.Finished("high"));
  EXPECT_TRUE(sim.Finished("low"));
  EXPECT_EQ(sim.preemptions(), 1);
}

}  // namespace
}  // namespace loom::scheduling
