// In-memory snapshots end to end on a local cluster: a two-rank job loses
// a node (its worker killed with SIGKILL and that worker's snapshot
// directory, standing for the node's memory, wiped); the restart resumes
// from the snapshot the surviving node holds, redoes at most a step or
// two instead of everything since the last checkpoint, and still ends
// bitwise equal to the uninterrupted run of the same spec.
#include <signal.h>

#include <filesystem>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "cli/local_cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster_fixture.h"

namespace loom {
namespace {

using ::testing::HasSubstr;

TEST_F(ClusterTest, ALostNodeCostsAStepOrTwoFromTheSnapshotASurvivorHolds) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(3));
  constexpr int kSteps = 1500;
  // A checkpoint every 500 steps: without snapshots a loss at step ~300
  // would redo ~300 steps.
  const std::string extra =
      "recovery: {disable_spike_detection: true, max_restarts: 2}\n"
      "checkpoint: {interval_steps: 500, keep: 10}\n";
  // The uninterrupted run first (two of the three one-slot workers).
  const std::string reference = Submit(WriteSpec("uncut", kSteps, 2, extra));
  ASSERT_TRUE(WaitFor([&] { return Status(reference).state() == loom::v1::SUCCEEDED; }, 300))
      << Status(reference).DebugString();
  const std::string job = Submit(WriteSpec("snapped", kSteps, 2, extra));
  ASSERT_TRUE(WaitFor([&] { return Status(job).summary().last_step() >= 200; }, 120))
      << Status(job).DebugString();
  const loom::v1::Job running = Status(job);
  ASSERT_EQ(running.ranks_size(), 2);
  ASSERT_LT(running.summary().last_step(), 500) << "the loss must land before a checkpoint";
  // Rank 0's node is lost, with its memory.
  const std::string victim = running.ranks(0).node();
  ASSERT_NO_FATAL_FAILURE(KillWorkerOnNode(victim));
  const std::string root = cli::LocalSnapshotRoot(home_);
  ASSERT_FALSE(root.empty()) << "no /dev/shm";
  std::filesystem::remove_all(absl::StrCat(root, "/worker-", victim.substr(victim.rfind('-') + 1)));
  ASSERT_TRUE(WaitFor([&] { return Status(job).state() == loom::v1::SUCCEEDED; }, 300))
      << Status(job).DebugString();

  const loom::v1::Job done = Status(job);
  EXPECT_EQ(done.restarts(), 1) << done.DebugString();
  const loom::v1::RecoveryEvent* restart = nullptr;
  for (const auto& e : done.events()) {
    if (e.kind() == loom::v1::RecoveryEvent::RESTART) restart = &e;
    EXPECT_NE(e.kind(), loom::v1::RecoveryEvent::SNAPSHOTS_OFF) << e.message();
  }
  ASSERT_NE(restart, nullptr) << done.DebugString();
  // The surviving node's snapshot, not the start: the controller counted
  // from the newest one the survivor reported.
  EXPECT_GT(restart->checkpoint_step(), 150) << restart->DebugString();
  EXPECT_LE(restart->steps_lost(), 3) << restart->DebugString();
  EXPECT_THAT(restart->message(), HasSubstr("stopped heartbeating"));
  EXPECT_THAT(Ctl("events " + job).out, HasSubstr("from the in-memory snapshot at step"));
  // The next attempt's first report says where it resumed: from memory, at
  // or after the step the controller counted from.
  loom::v1::GetStepMetricsResponse steps;
  ASSERT_NO_FATAL_FAILURE(GetStepMetrics(job, &steps));
  const loom::v1::StepMetrics* first_after = nullptr;
  std::map<int64_t, int> trained;
  for (const auto& m : steps.steps()) {
    if (m.step() > 0) trained[m.step()] += 1;
    if (m.generation() == restart->generation() && first_after == nullptr) first_after = &m;
  }
  ASSERT_NE(first_after, nullptr);
  EXPECT_TRUE(first_after->resumed_from_snapshot()) << first_after->DebugString();
  EXPECT_GE(first_after->step(), restart->checkpoint_step() + 1);
  EXPECT_EQ(trained.size(), static_cast<size_t>(kSteps));
  // Bitwise the uninterrupted run's final state.
  EXPECT_EQ(Digest(CheckpointPathAt(job, kSteps)), Digest(CheckpointPathAt(reference, kSteps)));
  std::cout << "loomctl events " << job << ":\n" << Ctl("events " + job).out << std::endl;
}

}  // namespace
}  // namespace loom
