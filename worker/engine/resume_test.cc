// Resuming from in-memory snapshots (checkpoint/snapshot_keeper.h,
// resume.h): two in-process ranks, each standing for a node with its own
// snapshot directory, stopped mid-run and started again as a restart would.
#include "worker/engine/resume.h"

#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "common/formats/checkpoint_files.h"
#include "common/formats/data.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/checkpoint/snapshot_keeper.h"
#include "worker/engine/trainer.h"
#include "worker/engine/trainer_test_util.h"

namespace loom::engine {
namespace {

namespace fs = std::filesystem;

struct RankRun {
  absl::StatusOr<TrainResult> result = absl::UnknownError("not run");
  std::vector<torch::Tensor> parameters;
  std::vector<loom::v1::StepMetrics> steps;
  std::vector<std::string> snapshots_off;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

class ResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    char pattern[] = "/tmp/loom_resume_testXXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    ASSERT_TRUE(WriteShard(dir_ + "/train_000000.bin", MakeText(1, 40000)).ok());
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Two ranks; rank r keeps its snapshots in <dir>/node-r (its own node).
  TrainerConfig Config(int rank) const {
    TrainerConfig c = TinyGptConfig(/*steps=*/16, /*seed=*/99);
    c.train_shards = {dir_ + "/train_000000.bin"};
    c.checkpoint_dir = dir_ + "/checkpoints";
    c.checkpoint_interval = 5;
    c.keep_checkpoints = 0;  // keep every one
    c.job_id = "job-1";
    c.snapshot_dir = Node(rank);
    c.snapshot_interval = 1;
    c.snapshot_writer = true;
    return c;
  }
  std::string Node(int rank) const { return dir_ + "/node-" + std::to_string(rank); }

  // Runs both ranks; rank 0 asks to stop after `stop_after` steps (0: run to
  // the end). `edit` adjusts each rank's config.
  std::vector<RankRun> Run(int64_t generation, int64_t stop_after,
                           const std::function<void(int, TrainerConfig&)>& edit = nullptr) {
    std::vector<RankRun> runs(2);
    auto store = c10::make_intrusive<c10d::HashStore>();
    std::vector<std::thread> threads;
    for (int rank = 0; rank < 2; ++rank) {
      threads.emplace_back([&, rank] {
        torch::set_num_threads(1);
        TrainerConfig config = Config(rank);
        config.generation = generation;
        if (edit) edit(rank, config);
        RankRun& out = runs[rank];
        int64_t polls = 0;
        TrainerCallbacks callbacks;
        callbacks.on_step = [&out](const loom::v1::StepMetrics& r) { out.steps.push_back(r); };
        callbacks.should_stop = [&polls, rank, stop_after] {
          return rank == 0 && stop_after > 0 && polls++ >= stop_after;
        };
        callbacks.on_finish = [&out](const torch::nn::Module& m) { out.parameters = Snapshot(m); };
        callbacks.on_snapshots_off = [&out](const std::string& why) {
          out.snapshots_off.push_back(why);
        };
        out.result = Train(config, MakeGlooRank(store, rank, 2), callbacks);
      });
    }
    for (std::thread& t : threads) t.join();
    return runs;
  }

  std::string dir_;
};

TEST_F(ResumeTest, ARestartResumesFromTheNewestSnapshotAndMatchesTheUninterruptedRun) {
  // The run to match: no snapshots, no stop.
  std::vector<RankRun> whole = Run(0, 0, [&](int, TrainerConfig& c) {
    c.checkpoint_dir = dir_ + "/whole";
    c.snapshot_dir.clear();
  });
  ASSERT_TRUE(whole[0].result.ok()) << whole[0].result.status();

  // Stopped before step 9: the files hold step 5, every node a later step.
  std::vector<RankRun> first = Run(0, 8);
  ASSERT_FALSE(first[0].result.ok());
  EXPECT_TRUE(absl::IsCancelled(first[0].result.status())) << first[0].result.status();
  const std::optional<VerifiedCheckpoint> node0 = NewestSnapshot(Node(0));
  const std::optional<VerifiedCheckpoint> node1 = NewestSnapshot(Node(1));
  ASSERT_TRUE(node0.has_value());
  ASSERT_TRUE(node1.has_value());
  EXPECT_GT(node0->manifest.state.step, 5);
  EXPECT_LE(node0->manifest.state.step, 8);
  // The step reports said which step each node held.
  ASSERT_FALSE(first[0].steps.empty());
  EXPECT_EQ(first[0].steps.back().rank_snapshot_steps_size(), 2);

  // The restart (the next attempt) takes the newest snapshot, not step 5.
  std::vector<RankRun> second = Run(1, 0);
  ASSERT_TRUE(second[0].result.ok()) << second[0].result.status();
  ASSERT_TRUE(second[1].result.ok()) << second[1].result.status();
  EXPECT_TRUE(second[0].result->resumed_from_snapshot);
  EXPECT_EQ(second[0].result->resumed_from_step,
            std::max(node0->manifest.state.step, node1->manifest.state.step));
  EXPECT_TRUE(second[0].steps.front().resumed_from_snapshot());
  EXPECT_EQ(MaxAbsDiff(second[0].parameters, whole[0].parameters), 0.0);
  EXPECT_EQ(MaxAbsDiff(second[1].parameters, whole[1].parameters), 0.0);
  EXPECT_GT(second[0].result->snapshots_written, 0);
  // A finished run leaves no snapshot behind.
  EXPECT_FALSE(NewestSnapshot(Node(0)).has_value());
  EXPECT_FALSE(NewestSnapshot(Node(1)).has_value());
}

TEST_F(ResumeTest, ALostNodesRanksGetTheStateFromASurvivingNode) {
  std::vector<RankRun> whole = Run(0, 0, [&](int, TrainerConfig& c) {
    c.checkpoint_dir = dir_ + "/whole";
    c.snapshot_dir.clear();
  });
  ASSERT_TRUE(whole[0].result.ok()) << whole[0].result.status();
  std::vector<RankRun> first = Run(0, 8);
  ASSERT_TRUE(absl::IsCancelled(first[0].result.status())) << first[0].result.status();
  const std::optional<VerifiedCheckpoint> survivor = NewestSnapshot(Node(1));
  ASSERT_TRUE(survivor.has_value());
  // Rank 0's node is gone, and with it its memory; a new node takes its
  // place. Rank 1's node sends the state to rank 0.
  fs::remove_all(Node(0));
  std::vector<RankRun> second = Run(1, 0);
  ASSERT_TRUE(second[0].result.ok()) << second[0].result.status();
  EXPECT_TRUE(second[0].result->resumed_from_snapshot);
  EXPECT_EQ(second[0].result->resumed_snapshot_rank, 1);
  EXPECT_EQ(second[0].result->resumed_from_step, survivor->manifest.state.step);
  EXPECT_EQ(MaxAbsDiff(second[0].parameters, whole[0].parameters), 0.0);
  EXPECT_EQ(MaxAbsDiff(second[1].parameters, whole[1].parameters), 0.0);
}

TEST_F(ResumeTest, ASnapshotIsBitwiseTheCheckpointOfTheSameStep) {
  // A checkpoint file at every step, a snapshot at every step on each node.
  std::vector<RankRun> first = Run(0, 8, [](int, TrainerConfig& c) { c.checkpoint_interval = 1; });
  ASSERT_TRUE(absl::IsCancelled(first[0].result.status())) << first[0].result.status();
  for (int node = 0; node < 2; ++node) {
    const std::optional<VerifiedCheckpoint> snapshot = NewestSnapshot(Node(node));
    ASSERT_TRUE(snapshot.has_value()) << node;
    const int64_t step = snapshot->manifest.state.step;
    const std::string file = ReadAll(StepDir(dir_ + "/checkpoints", step) + "/shard-00000.bin");
    ASSERT_FALSE(file.empty()) << "no checkpoint file of step " << step;
    absl::StatusOr<ShardView> a = ParseShard(snapshot->bytes);
    absl::StatusOr<ShardView> b = ParseShard(file);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->header.tensors.size(), b->header.tensors.size());
    EXPECT_EQ(a->header.state.step, b->header.state.step);
    EXPECT_EQ(a->header.state.next_data_batch, b->header.state.next_data_batch);
    for (size_t i = 0; i < a->header.tensors.size(); ++i) {
      EXPECT_EQ(a->header.tensors[i].name, b->header.tensors[i].name);
      // Each rank's generator is its own (dropout is reseeded per rank and
      // step before every step, so it carries nothing across steps); rank
      // 0's node holds rank 0's, as the file does.
      if (node != 0 && a->header.tensors[i].name == "rng/cpu") continue;
      EXPECT_TRUE(a->data[i] == b->data[i]) << node << ": " << a->header.tensors[i].name;
    }
    if (node == 0) EXPECT_TRUE(snapshot->bytes == file) << "rank 0's snapshot is its checkpoint";
  }
}

TEST_F(ResumeTest, ARollbackResumesFromFilesAndPassesOverNewerSnapshots) {
  std::vector<RankRun> first = Run(0, 8);
  ASSERT_TRUE(absl::IsCancelled(first[0].result.status())) << first[0].result.status();
  ASSERT_TRUE(NewestSnapshot(Node(0)).has_value());
  std::vector<RankRun> rolled = Run(1, 0, [](int, TrainerConfig& c) { c.resume_step = 5; });
  ASSERT_TRUE(rolled[0].result.ok()) << rolled[0].result.status();
  EXPECT_FALSE(rolled[0].result->resumed_from_snapshot);
  EXPECT_EQ(rolled[0].result->resumed_from_step, 5);
}

TEST_F(ResumeTest, SnapshotsThatDoNotFitAreOffWithTheReasonAndTrainingGoesOn) {
  std::vector<RankRun> runs = Run(0, 0, [](int, TrainerConfig& c) { c.snapshot_max_bytes = 1024; });
  ASSERT_TRUE(runs[0].result.ok()) << runs[0].result.status();
  ASSERT_EQ(runs[0].snapshots_off.size(), 1u);
  EXPECT_THAT(runs[0].snapshots_off[0], ::testing::HasSubstr("of host memory"));
  EXPECT_EQ(runs[0].result->snapshots_written, 0);
  EXPECT_EQ(runs[0].steps.back().rank_snapshot_steps(0), -1);
}

TEST_F(ResumeTest, AStaleAttemptCannotWriteASnapshotANewerOneWouldTake) {
  // A newer attempt (generation 3) has claimed node 0's directory; an older
  // one started after it writes nothing there.
  ASSERT_TRUE(ClaimCheckpointDir(Node(0), FenceToken{"job-1", 3}).ok());
  std::vector<RankRun> stale = Run(2, 8);
  EXPECT_EQ(stale[0].snapshots_off.size(), 1u);
  EXPECT_FALSE(NewestSnapshot(Node(0)).has_value());
  EXPECT_TRUE(NewestSnapshot(Node(1)).has_value());
}

}  // namespace
}  // namespace loom::engine
