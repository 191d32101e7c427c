#include "worker/engine/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/formats/data.h"
#include "common/prune_log.h"
#include "common/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/checkpoint/checkpoint_choice.h"
#include "worker/engine/checkpoint/checkpoint_inspect.h"
#include "worker/engine/checkpoint/checkpoint_writer.h"
#include "worker/engine/checkpoint/model_fingerprint.h"
#include "worker/engine/gpt.h"
#include "worker/engine/optimizer.h"
#include "worker/engine/process_group_handle.h"
#include "worker/engine/trainer_test_util.h"

namespace loom::engine {
namespace {

namespace fs = std::filesystem;

// Rank 0's shard of checkpoint `step`.
std::string ShardOf(const std::string& dir, int64_t step) {
  return StepDir(dir, step) + "/shard-00000.bin";
}

// Steps of the committed checkpoints (step-<9 digits>/) in `dir`, ascending.
std::vector<int64_t> CheckpointSteps(const std::string& dir) {
  std::vector<int64_t> steps;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.size() == 14 && name.rfind("step-", 0) == 0 &&
        name.find_first_not_of("0123456789", 5) == std::string::npos) {
      steps.push_back(std::stoll(name.substr(5)));
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

// Names in `dir` of interrupted saves (step-*.tmp-*), sorted.
std::vector<std::string> TemporaryNames(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.find(".tmp-") != std::string::npos) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// The generation that the manifest of checkpoint `step` in `dir` records
// (its line "  \"generation\": G,"); -1 if there is none.
int64_t ManifestGeneration(const std::string& dir, int64_t step) {
  std::ifstream in(StepDir(dir, step) + "/MANIFEST.json");
  std::string line;
  while (std::getline(in, line)) {
    long long generation = 0;
    if (std::sscanf(line.c_str(), "  \"generation\": %lld,", &generation) == 1) return generation;
  }
  return -1;
}

void FlipMiddleByte(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  const std::streamoff middle = static_cast<std::streamoff>(fs::file_size(path) / 2);
  f.seekg(middle);
  char c;
  f.get(c);
  f.seekp(middle);
  f.put(static_cast<char>(c ^ 0x5a));
}

struct RankOutcome {
  absl::StatusOr<TrainResult> result = absl::UnknownError("not run");
  std::vector<torch::Tensor> parameters;
  std::vector<loom::v1::StepMetrics> steps;
  std::vector<CorruptCheckpoint> corrupt;  // as on_checkpoint_corrupt reported them
};

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    char pattern[] = "/tmp/loom_trainer_testXXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    train_shard_ = dir_ + "/train_000000.bin";
    val_shard_ = dir_ + "/val_000000.bin";
    ASSERT_TRUE(WriteShard(train_shard_, MakeText(1, 40000)).ok());
    ASSERT_TRUE(WriteShard(val_shard_, MakeText(2, 8000)).ok());
  }
  void TearDown() override { fs::remove_all(dir_); }

  TrainerConfig SmallConfig() const {
    TrainerConfig c = TinyGptConfig(/*steps=*/8, /*seed=*/1234);
    c.eval_batches = 4;
    c.train_shards = {train_shard_};
    c.val_shards = {val_shard_};
    return c;
  }

  // Runs Train() on every rank of an in-process Gloo group (world_size 1
  // runs without a group). stop_after[r] > 0 makes rank r ask to stop once
  // that many steps have run in this call.
  // save_after[r] > 0 likewise makes rank r ask to save and stop
  // (checkpoint-then-preempt).
  std::vector<RankOutcome> RunRanks(const TrainerConfig& config, int world_size,
                                    std::vector<int64_t> stop_after = {},
                                    std::vector<int64_t> save_after = {}) {
    stop_after.resize(world_size, 0);
    save_after.resize(world_size, 0);
    std::vector<RankOutcome> outcomes(world_size);
    auto run = [&](int rank, std::shared_ptr<c10d::ProcessGroup> group) {
      RankOutcome& out = outcomes[rank];
      // should_stop is polled once before each step, on every rank.
      int64_t polls = 0;
      TrainerCallbacks callbacks;
      callbacks.on_step = [&out](const loom::v1::StepMetrics& r) { out.steps.push_back(r); };
      callbacks.should_stop = [&polls, limit = stop_after[rank]] {
        const int64_t steps_run = polls++;
        return limit > 0 && steps_run >= limit;
      };
      int64_t save_polls = 0;
      callbacks.should_save_and_stop = [&save_polls, limit = save_after[rank]] {
        const int64_t steps_run = save_polls++;
        return limit > 0 && steps_run >= limit;
      };
      callbacks.on_finish = [&out](const torch::nn::Module& m) { out.parameters = Snapshot(m); };
      callbacks.on_checkpoint_corrupt = [&out](const CorruptCheckpoint& c) {
        out.corrupt.push_back(c);
      };
      out.result = Train(config, std::move(group), callbacks);
    };
    if (world_size == 1) {
      run(0, nullptr);
      return outcomes;
    }
    auto store = c10::make_intrusive<c10d::HashStore>();
    std::vector<std::thread> threads;
    for (int rank = 0; rank < world_size; ++rank) {
      threads.emplace_back([&, rank] {
        // One intra-op thread in every rank thread, as SetUp sets for the
        // main one (OpenMP's thread count is per thread). That alone is not
        // enough: ranks that share a process call Debian's OpenMP OpenBLAS
        // from several threads, and two identical 2-rank runs differed by up
        // to 2e-6 in about half the runs unless OMP_NUM_THREADS=1 is set for
        // the whole process, which CTest does (engine.cmake). Rank processes
        // (loom-rank) are single-rank and unaffected.
        torch::set_num_threads(1);
        run(rank, MakeGlooRank(store, rank, world_size));
      });
    }
    for (std::thread& t : threads) t.join();
    return outcomes;
  }

  std::string dir_, train_shard_, val_shard_;
};


TEST_F(TrainerTest, LossFallsOnTextAndReportsEveryStep) {
  TrainerConfig config = SmallConfig();
  config.schedule.total_steps = 60;
  config.schedule.warmup_steps = 5;
  config.micro_batch = 4;
  config.eval_interval = 30;
  std::vector<RankOutcome> out = RunRanks(config, 1);
  ASSERT_TRUE(out[0].result.ok()) << out[0].result.status();
  const TrainResult& result = *out[0].result;
  EXPECT_EQ(result.steps, 60);
  EXPECT_EQ(result.resumed_from_step, 0);
  // Step 0 is the untrained model's validation pass, then one report a step.
  ASSERT_EQ(out[0].steps.size(), 61u);
  const loom::v1::StepMetrics& initial = out[0].steps.front();
  EXPECT_EQ(initial.step(), 0);
  EXPECT_TRUE(initial.has_val_loss());
  EXPECT_NEAR(initial.val_loss(), std::log(256.0), 0.3);
  EXPECT_EQ(initial.tokens_seen(), 0);
  const loom::v1::StepMetrics& first = out[0].steps[1];
  EXPECT_EQ(first.step(), 1);
  const loom::v1::StepMetrics& last = out[0].steps.back();
  // Uniform prediction over 256 bytes costs ln 256 = 5.55 nats.
  EXPECT_NEAR(first.loss(), std::log(256.0), 0.3);
  EXPECT_LT(last.loss(), first.loss() - 2.0);
  EXPECT_DOUBLE_EQ(result.final_loss, last.loss());
  EXPECT_EQ(last.step(), 60);
  EXPECT_EQ(last.tokens_seen(), 60 * 8 * 32);
  EXPECT_GT(last.tokens_per_second(), 0);
  EXPECT_GT(first.grad_norm(), 0);
  EXPECT_DOUBLE_EQ(first.lr(), 3e-3 / 5);
  // Validation before training and at steps 30 and 60 only.
  for (const loom::v1::StepMetrics& r : out[0].steps) {
    EXPECT_EQ(r.has_val_loss(), r.step() == 0 || r.step() == 30 || r.step() == 60) << r.step();
  }
  EXPECT_TRUE(last.has_val_loss());
  EXPECT_DOUBLE_EQ(result.final_val_loss, last.val_loss());
  EXPECT_LT(result.final_val_loss, std::log(256.0) - 2.0);
}

TEST_F(TrainerTest, ReportsWhereTheStepTimeWent) {
  TrainerConfig config = SmallConfig();
  config.schedule.total_steps = 6;
  config.checkpoint_dir = dir_ + "/ckpt";
  config.checkpoint_interval = 2;
  std::vector<RankOutcome> out = RunRanks(config, 2);
  ASSERT_TRUE(out[0].result.ok()) << out[0].result.status();
  ASSERT_EQ(out[0].steps.size(), 7u);  // step 0 (validation) and 1..6
  for (size_t i = 1; i < out[0].steps.size(); ++i) {
    const loom::v1::StepMetrics& r = out[0].steps[i];
    SCOPED_TRACE(r.step());
    EXPECT_GT(r.compute_seconds(), 0);
    EXPECT_GT(r.forward_seconds(), 0);
    EXPECT_GT(r.backward_seconds(), 0);
    EXPECT_LE(r.forward_seconds() + r.backward_seconds(), r.compute_seconds() * (1 + 1e-9));
    EXPECT_EQ(r.host_to_device_seconds(), 0);  // CPU: nothing to copy
    EXPECT_GT(r.comm_seconds(), 0);  // two ranks: the all-reduce is real
    EXPECT_GT(r.optimizer_seconds(), 0);
    EXPECT_GE(r.data_wait_seconds(), 0);
    EXPECT_GE(r.checkpoint_stall_seconds(), 0);
    // The loop's own work between steps (the boundary agreement, the
    // per-rank gather, the report) is part of the step, from the second on.
    if (r.step() > 1) {
      EXPECT_GT(r.control_seconds(), 0);
    } else {
      EXPECT_EQ(r.control_seconds(), 0);
    }
    ASSERT_EQ(r.rank_compute_seconds_size(), 2);
    EXPECT_NEAR(r.rank_compute_seconds(0), r.forward_seconds() + r.backward_seconds(), 1e-9);
    EXPECT_GT(r.rank_compute_seconds(1), 0);
    const double parts = r.data_wait_seconds() + r.host_to_device_seconds() + r.compute_seconds() +
                         r.comm_seconds() + r.optimizer_seconds() + r.checkpoint_stall_seconds() +
                         r.control_seconds();
    EXPECT_LE(parts, r.step_time_seconds() * (1 + 1e-9));
    EXPECT_FALSE(r.optimizer_step_skipped());
    EXPECT_EQ(r.nonfinite_steps_skipped(), 0);
  }
  // Steps right after a periodic checkpoint carry its capture.
  EXPECT_GT(out[0].steps[3].checkpoint_stall_seconds(), 0);
}

// A save that cannot be written is reported through on_checkpoint_failed
// (for telemetry) before training stops with its error.
TEST_F(TrainerTest, FailedCheckpointSaveIsReportedAndStopsTraining) {
  TrainerConfig config = SmallConfig();
  config.schedule.total_steps = 6;
  // The checkpoint "directory" is a regular file: nothing can be created in it.
  config.checkpoint_dir = dir_ + "/not-a-directory";
  { std::ofstream(config.checkpoint_dir) << "x"; }
  config.checkpoint_interval = 2;
  std::vector<std::pair<int64_t, std::string>> failures;
  TrainerCallbacks callbacks;
  callbacks.on_checkpoint_failed = [&](int64_t step, const absl::Status& error) {
    failures.emplace_back(step, std::string(error.message()));
  };
  absl::StatusOr<TrainResult> result = Train(config, nullptr, callbacks);
  EXPECT_FALSE(result.ok());
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].first, 2);
  EXPECT_FALSE(failures[0].second.empty());
}

// A stale attempt: a newer attempt of the job claims the
// checkpoint directory while this one trains (as the controller's restart
// on another worker does while this one is frozen). This attempt's next
// save point ends it as fenced, before it writes anything: no checkpoint
// or temporary directory after the claim, and the error says who holds the
// directory. CONTINUE (a policy for failed saves) does not keep it going.
TEST_F(TrainerTest, AStaleAttemptStopsAtItsNextSavePointWritingNothing) {
  TrainerConfig config = SmallConfig();
  config.schedule.total_steps = 12;
  config.checkpoint_dir = dir_ + "/ckpt";
  config.checkpoint_interval = 2;
  config.job_id = "job-7";
  config.generation = 0;
  config.continue_after_failed_save = true;
  TrainerCallbacks callbacks;
  std::vector<int64_t> failed_at;
  // Claimed once checkpoint 2's save has ended (pruning, fenced too,
  // included) and before checkpoint 4's begins.
  callbacks.on_checkpoint = [&](const CheckpointReport& r) {
    if (r.step == 2) {
      ASSERT_TRUE(ClaimCheckpointDir(config.checkpoint_dir, {"job-7", 1}).ok());
    }
  };
  callbacks.on_checkpoint_failed = [&](int64_t step, const absl::Status&) {
    failed_at.push_back(step);
  };
  std::atomic<int64_t> newest_staged{-1};  // the writer's thread reports stages
  callbacks.on_checkpoint_stage = [&](CheckpointStage, int64_t step) {
    newest_staged = std::max<int64_t>(newest_staged, step);
  };
  absl::StatusOr<TrainResult> result = Train(config, nullptr, callbacks);
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(IsCheckpointFenced(result.status())) << result.status();
  EXPECT_EQ(newest_staged, 2);  // checkpoint 4's writing never began
  EXPECT_THAT(std::string(result.status().message()),
              ::testing::HasSubstr("attempt 1 of job 'job-7' claimed it"));
  EXPECT_EQ(failed_at, std::vector<int64_t>{4});
  EXPECT_EQ(CheckpointSteps(config.checkpoint_dir), std::vector<int64_t>{2});
  EXPECT_TRUE(TemporaryNames(config.checkpoint_dir).empty());
  EXPECT_EQ(ReadFence(config.checkpoint_dir)->attempt, 1);
}

// A small tmpfs the test mounts (tests run as root), unmounted and removed
// on every path out of the test.
class ScopedTmpfs {
 public:
  ScopedTmpfs(const std::string& path, uint64_t bytes) : path_(path) {
    fs::create_directories(path);
    const std::string options = absl::StrCat("size=", bytes);
    mounted_ = ::mount("tmpfs", path.c_str(), "tmpfs", 0, options.c_str()) == 0;
    if (!mounted_) error_ = std::strerror(errno);
  }
  ~ScopedTmpfs() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
    std::error_code ec;
    fs::remove(path_, ec);
  }
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }

 private:
  std::string path_;
  bool mounted_ = false;
  std::string error_;
};

// Disk full: the checkpoint volume fills up during a save (a
// filler file written once the first checkpoint commits). The save fails
// with RESOURCE_EXHAUSTED and is reported; the previous checkpoint stays
// intact and is what a resume would load; no partial checkpoint is left.
// STOP (the default) ends training with that error; CONTINUE trains on, and
// once space is freed (the failure callback deletes the filler) the next
// save commits, with the parameters of an uninterrupted run.
TEST_F(TrainerTest, DiskFullSaveFailsKeepsThePreviousCheckpointAndFollowsThePolicy) {
  TrainerConfig config = SmallConfig();
  config.schedule.total_steps = 6;
  config.checkpoint_interval = 2;
  config.checkpoint_async = false;  // the filler lands between saves
  std::vector<RankOutcome> straight = RunRanks(config, 1);
  ASSERT_TRUE(straight[0].result.ok()) << straight[0].result.status();
  // One checkpoint's size, from a save on ordinary disk.
  config.checkpoint_dir = dir_ + "/sizing";
  absl::StatusOr<TrainResult> sizing = Train(config, nullptr, {});
  ASSERT_TRUE(sizing.ok()) << sizing.status();
  const uint64_t checkpoint_bytes = sizing->checkpoints.at(0).bytes;

  for (const bool keep_training : {false, true}) {
    SCOPED_TRACE(keep_training ? "CONTINUE" : "STOP");
    // Room for three checkpoints and a half; the filler leaves half of one.
    ScopedTmpfs volume(dir_ + "/volume", checkpoint_bytes * 7 / 2);
    ASSERT_TRUE(volume.mounted()) << "mount tmpfs: " << volume.error();
    config.checkpoint_dir = dir_ + "/volume/ckpt";
    config.keep_checkpoints = 3;
    config.continue_after_failed_save = keep_training;
    const std::string filler = dir_ + "/volume/filler";
    std::vector<int64_t> committed, failed;
    std::vector<absl::Status> errors;
    std::vector<torch::Tensor> parameters;
    TrainerCallbacks callbacks;
    callbacks.on_checkpoint = [&](const CheckpointReport& r) {
      committed.push_back(r.step);
      if (r.step == 2) {
        // Fill the volume up to half a checkpoint of free space.
        struct statvfs st;
        ASSERT_EQ(::statvfs(config.checkpoint_dir.c_str(), &st), 0);
        const uint64_t free_bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
        ASSERT_GT(free_bytes, checkpoint_bytes);  // the next save would fit
        std::ofstream out(filler, std::ios::binary);
        const std::string block(4096, 'x');
        for (uint64_t n = 0; n + block.size() <= free_bytes - checkpoint_bytes / 2;
             n += block.size()) {
          out << block;
        }
        out.close();
        ASSERT_TRUE(out.good());
      }
    };
    callbacks.on_checkpoint_failed = [&](int64_t step, const absl::Status& error) {
      failed.push_back(step);
      errors.push_back(error);
      fs::remove(filler);  // space freed (a CONTINUE run's next save can commit)
    };
    callbacks.on_finish = [&](const torch::nn::Module& m) { parameters = Snapshot(m); };
    absl::StatusOr<TrainResult> result = Train(config, nullptr, callbacks);

    ASSERT_EQ(failed, std::vector<int64_t>{4});
    EXPECT_EQ(errors[0].code(), absl::StatusCode::kResourceExhausted) << errors[0];
    EXPECT_TRUE(IsCheckpointVolumeFull(errors[0])) << errors[0];
    EXPECT_THAT(std::string(errors[0].message()), ::testing::HasSubstr("checkpoint at step 4"));
    // No partial checkpoint, and the previous one is what a resume loads.
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(config.checkpoint_dir)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    std::vector<CorruptCheckpoint> corrupt;
    absl::StatusOr<ResumeChoice> choice =
        ChooseResumeCheckpoint({config.checkpoint_dir, -1, false, std::nullopt}, &corrupt);
    ASSERT_TRUE(choice.ok()) << choice.status();
    ASSERT_TRUE(choice->checkpoint.has_value());
    EXPECT_TRUE(corrupt.empty());
    if (!keep_training) {
      EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
      EXPECT_TRUE(IsCheckpointVolumeFull(result.status()));  // what loom-rank's exit code says
      EXPECT_EQ(committed, std::vector<int64_t>{2});
      EXPECT_EQ(names, std::vector<std::string>{"step-000000002"});
      EXPECT_EQ(choice->checkpoint->manifest.state.step, 2);
    } else {
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->steps, 6);
      EXPECT_EQ(committed, (std::vector<int64_t>{2, 6}));
      EXPECT_EQ(names, (std::vector<std::string>{"step-000000002", "step-000000006"}));
      EXPECT_EQ(choice->checkpoint->manifest.state.step, 6);
      EXPECT_EQ(MaxAbsDiff(straight[0].parameters, parameters), 0.0);
    }
  }
}

// A step whose gradients are not finite is skipped by the fused optimizer:
// reported, counted, and never applied. An absurd learning rate blows the
// weights up after the first step, so that every later forward overflows.
TEST_F(TrainerTest, NonFiniteGradientsSkipTheStepAndLeaveWeightsFinite) {
  TrainerConfig config = SmallConfig();
  config.schedule.total_steps = 5;
  config.schedule.warmup_steps = 0;
  config.optimizer.lr = 1e37;
  config.optimizer.grad_clip = 0;
  std::vector<RankOutcome> out = RunRanks(config, 1);
  ASSERT_TRUE(out[0].result.ok()) << out[0].result.status();
  int64_t skipped = 0;
  for (const loom::v1::StepMetrics& r : out[0].steps) {
    if (r.step() == 0) continue;
    if (r.optimizer_step_skipped()) {
      ++skipped;
      EXPECT_FALSE(std::isfinite(r.loss()) && std::isfinite(r.grad_norm())) << r.step();
    }
    EXPECT_EQ(r.nonfinite_steps_skipped(), skipped) << r.step();
  }
  EXPECT_GE(skipped, 1);
  EXPECT_FALSE(out[0].steps[1].optimizer_step_skipped());
  for (const torch::Tensor& p : out[0].parameters) {
    EXPECT_TRUE(torch::isfinite(p).all().item<bool>());
  }
}

TEST_F(TrainerTest, TwoRanksMatchOneRankOnTheSameGlobalBatch) {
  TrainerConfig config = SmallConfig();
  config.schedule.total_steps = 5;
  const auto start = std::chrono::steady_clock::now();
  std::vector<RankOutcome> single = RunRanks(config, 1);
  std::vector<RankOutcome> pair = RunRanks(config, 2);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(single[0].result.ok()) << single[0].result.status();
  ASSERT_TRUE(pair[0].result.ok()) << pair[0].result.status();
  ASSERT_TRUE(pair[1].result.ok()) << pair[1].result.status();
  // Replicas stay bit-identical: they apply the same all-reduced gradients.
  EXPECT_EQ(MaxAbsDiff(pair[0].parameters, pair[1].parameters), 0.0);
  const double diff = MaxAbsDiff(single[0].parameters, pair[0].parameters);
  std::printf("DP equivalence: max |params(1 rank) - params(2 ranks)| = %.3g after %lld steps "
              "(%.2f s for both runs)\n",
              diff, static_cast<long long>(config.schedule.total_steps), seconds);
  EXPECT_LE(diff, 1e-5);
  EXPECT_EQ(single[0].result->steps, 5);
  EXPECT_NEAR(single[0].result->final_loss, pair[0].result->final_loss, 1e-5);
  // Validation covers the same samples whatever the world size.
  EXPECT_NEAR(single[0].result->final_val_loss, pair[0].result->final_val_loss, 1e-5);
  EXPECT_TRUE(pair[1].steps.empty());  // on_step is rank 0 only
}

TEST_F(TrainerTest, ResumesFromCheckpointAndMatchesUninterruptedRun) {
  TrainerConfig config = SmallConfig();
  std::vector<RankOutcome> straight = RunRanks(config, 1);
  ASSERT_TRUE(straight[0].result.ok()) << straight[0].result.status();

  config.checkpoint_dir = dir_ + "/ckpt";
  config.checkpoint_interval = 4;
  std::vector<RankOutcome> first = RunRanks(config, 1, {4});
  EXPECT_EQ(first[0].result.status().code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(fs::exists(ShardOf(config.checkpoint_dir, 4)));
  ASSERT_TRUE(fs::exists(StepDir(config.checkpoint_dir, 4) + "/MANIFEST.json"));
  EXPECT_FALSE(fs::exists(StepDir(config.checkpoint_dir, 8)));

  std::vector<RankOutcome> second = RunRanks(config, 1);
  ASSERT_TRUE(second[0].result.ok()) << second[0].result.status();
  EXPECT_EQ(second[0].result->resumed_from_step, 4);
  EXPECT_EQ(second[0].result->steps, 8);
  ASSERT_EQ(second[0].steps.size(), 4u);
  EXPECT_EQ(second[0].steps.front().step(), 5);
  EXPECT_EQ(MaxAbsDiff(straight[0].parameters, second[0].parameters), 0.0);
  EXPECT_DOUBLE_EQ(second[0].result->final_loss, straight[0].result->final_loss);

  // The final checkpoint, and the report describing it.
  ASSERT_EQ(second[0].result->checkpoints.size(), 1u);
  const CheckpointReport& report = second[0].result->checkpoints[0];
  EXPECT_EQ(report.step, 8);
  EXPECT_EQ(report.path, StepDir(config.checkpoint_dir, 8));
  EXPECT_EQ(report.generation, 0);
  // Exactly the shard and the manifest; bytes counts both; sha256 is the
  // manifest's, which holds the shard's size and CRC-32C.
  std::vector<std::string> files;
  uintmax_t bytes = 0;
  for (const auto& entry : fs::directory_iterator(report.path)) {
    files.push_back(entry.path().filename().string());
    bytes += entry.file_size();
  }
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"MANIFEST.json", "shard-00000.bin"}));
  EXPECT_EQ(report.bytes, bytes);
  absl::StatusOr<std::string> digest = Sha256File(report.path + "/MANIFEST.json");
  ASSERT_TRUE(digest.ok());
  EXPECT_EQ(report.sha256, *digest);
  EXPECT_GT(report.write_seconds, 0);
  EXPECT_GE(report.stall_seconds, 0);

  // A third call finds the run complete and trains no further.
  std::vector<RankOutcome> third = RunRanks(config, 1);
  ASSERT_TRUE(third[0].result.ok()) << third[0].result.status();
  EXPECT_EQ(third[0].result->resumed_from_step, 8);
  EXPECT_TRUE(third[0].steps.empty());
  EXPECT_DOUBLE_EQ(third[0].result->final_loss, straight[0].result->final_loss);
  EXPECT_EQ(MaxAbsDiff(straight[0].parameters, third[0].parameters), 0.0);
}

// Checkpoint-then-preempt: one rank asks to save and stop between checkpoint
// intervals; every rank agrees at the step boundary, the state reached is
// saved and committed, Train returns OK with saved_and_stopped, and the run
// resumed from that checkpoint ends bitwise equal to an uninterrupted one.
// Asked right after an interval's save, nothing is saved twice.
TEST_F(TrainerTest, SaveAndStopCommitsTheStepReachedAndResumesBitExactly) {
  TrainerConfig config = SmallConfig();
  std::vector<RankOutcome> straight = RunRanks(config, 2);
  ASSERT_TRUE(straight[0].result.ok()) << straight[0].result.status();

  config.checkpoint_dir = dir_ + "/ckpt";
  config.checkpoint_interval = 4;
  std::vector<RankOutcome> first = RunRanks(config, 2, {}, {0, 3});
  for (const RankOutcome& out : first) {
    ASSERT_TRUE(out.result.ok()) << out.result.status();
    EXPECT_TRUE(out.result->saved_and_stopped);
    EXPECT_EQ(out.result->steps, 3);
  }
  ASSERT_EQ(first[0].result->checkpoints.size(), 1u);
  EXPECT_EQ(first[0].result->checkpoints[0].step, 3);
  EXPECT_TRUE(first[0].parameters.empty()) << "on_finish is not called for a stop";
  ASSERT_TRUE(fs::exists(StepDir(config.checkpoint_dir, 3) + "/MANIFEST.json"));

  // Asked at step 4, just after the interval's save of step 4: stops with
  // that one.
  std::vector<RankOutcome> second = RunRanks(config, 2, {}, {1, 0});
  for (const RankOutcome& out : second) {
    ASSERT_TRUE(out.result.ok()) << out.result.status();
    EXPECT_TRUE(out.result->saved_and_stopped);
    EXPECT_EQ(out.result->steps, 4);
  }
  EXPECT_EQ(second[0].result->resumed_from_step, 3);
  ASSERT_EQ(second[0].result->checkpoints.size(), 1u);
  EXPECT_EQ(second[0].result->checkpoints[0].step, 4);

  // A plain stop asked at the same boundary wins: no save.
  std::vector<RankOutcome> third = RunRanks(config, 2, {0, 1}, {1, 0});
  EXPECT_EQ(third[0].result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(fs::exists(StepDir(config.checkpoint_dir, 5)));

  std::vector<RankOutcome> last = RunRanks(config, 2);
  ASSERT_TRUE(last[0].result.ok()) << last[0].result.status();
  EXPECT_EQ(last[0].result->resumed_from_step, 4);
  EXPECT_FALSE(last[0].result->saved_and_stopped);
  EXPECT_EQ(MaxAbsDiff(straight[0].parameters, last[0].parameters), 0.0);
  EXPECT_DOUBLE_EQ(last[0].result->final_loss, straight[0].result->final_loss);
}

// When checkpoints exist and none verifies, a resume does not
// quietly train from step 0. Rank 0 reports each corrupt one and fails with
// DATA_LOSS (IsNoGoodCheckpoint), the other ranks with FAILED_PRECONDITION;
// allow_start_from_scratch trains from scratch instead, as a run without
// checkpoints would, bit for bit.
TEST_F(TrainerTest, NoGoodCheckpointFailsUnlessStartingFromScratchIsAllowed) {
  TrainerConfig config = SmallConfig();
  config.schedule.total_steps = 4;
  std::vector<RankOutcome> straight = RunRanks(config, 2);
  ASSERT_TRUE(straight[0].result.ok()) << straight[0].result.status();

  config.checkpoint_dir = dir_ + "/ckpt";
  config.checkpoint_interval = 2;
  ASSERT_TRUE(RunRanks(config, 2)[0].result.ok());
  FlipMiddleByte(ShardOf(config.checkpoint_dir, 2));
  FlipMiddleByte(ShardOf(config.checkpoint_dir, 4));

  std::vector<RankOutcome> failed = RunRanks(config, 2);
  EXPECT_EQ(failed[0].result.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(IsNoGoodCheckpoint(failed[0].result.status()));
  EXPECT_THAT(std::string(failed[0].result.status().message()),
              ::testing::HasSubstr("allow_start_from_scratch"));
  EXPECT_EQ(failed[1].result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(failed[0].steps.empty());
  ASSERT_EQ(failed[0].corrupt.size(), 2u);
  EXPECT_EQ(failed[0].corrupt[0].file, ShardOf(config.checkpoint_dir, 4));
  EXPECT_EQ(failed[0].corrupt[0].check, kCheckCrc32c);
  EXPECT_EQ(failed[0].corrupt[1].file, ShardOf(config.checkpoint_dir, 2));
  EXPECT_TRUE(failed[1].corrupt.empty());  // rank 0 reports

  config.allow_start_from_scratch = true;
  std::vector<RankOutcome> scratch = RunRanks(config, 2);
  ASSERT_TRUE(scratch[0].result.ok()) << scratch[0].result.status();
  EXPECT_EQ(scratch[0].result->resumed_from_step, 0);
  EXPECT_EQ(scratch[0].corrupt.size(), 2u);
  // Every step from 1 (and the step-0 validation) reported, as in the run
  // without checkpoints.
  EXPECT_EQ(scratch[0].steps.size(), straight[0].steps.size());
  EXPECT_EQ(MaxAbsDiff(straight[0].parameters, scratch[0].parameters), 0.0);
}

TEST_F(TrainerTest, SkipsCorruptNewestCheckpoint) {
  TrainerConfig config = SmallConfig();
  config.schedule.total_steps = 4;
  std::vector<RankOutcome> straight = RunRanks(config, 1);
  ASSERT_TRUE(straight[0].result.ok()) << straight[0].result.status();

  config.checkpoint_dir = dir_ + "/ckpt";
  config.checkpoint_interval = 2;
  ASSERT_TRUE(RunRanks(config, 1)[0].result.ok());
  const std::string newest = StepDir(config.checkpoint_dir, 4);
  const CheckpointEntry entry{4, newest, 0, false};
  ASSERT_TRUE(ReadVerifiedCheckpoint(entry).ok());
  // Flip one byte in the middle of the newest checkpoint's shard: loading
  // it fails with DATA_LOSS naming the shard.
  FlipMiddleByte(ShardOf(config.checkpoint_dir, 4));
  absl::StatusOr<std::string> damaged = ReadVerifiedCheckpoint(entry);
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(damaged.status().message()),
              ::testing::StartsWith(ShardOf(config.checkpoint_dir, 4) + ": crc32c "));

  std::vector<RankOutcome> resumed = RunRanks(config, 1);
  ASSERT_TRUE(resumed[0].result.ok()) << resumed[0].result.status();
  EXPECT_EQ(resumed[0].result->resumed_from_step, 2);
  ASSERT_EQ(resumed[0].result->corrupt_checkpoints.size(), 1u);
  const CorruptCheckpoint& corrupt = resumed[0].result->corrupt_checkpoints[0];
  EXPECT_EQ(corrupt.path, newest);
  EXPECT_EQ(corrupt.step, 4);
  EXPECT_EQ(corrupt.file, ShardOf(config.checkpoint_dir, 4));
  EXPECT_EQ(corrupt.check, kCheckCrc32c);
  EXPECT_EQ(MaxAbsDiff(straight[0].parameters, resumed[0].parameters), 0.0);
  // The rewritten step-4 checkpoint verifies again.
  EXPECT_TRUE(ReadVerifiedCheckpoint(entry).ok());
}

TEST_F(TrainerTest, CheckpointWithoutManifestIsSkipped) {
  TrainerConfig config = SmallConfig();
  config.schedule.total_steps = 2;
  config.checkpoint_dir = dir_ + "/ckpt";
  config.checkpoint_interval = 1;
  ASSERT_TRUE(RunRanks(config, 1)[0].result.ok());
  ASSERT_TRUE(fs::remove(StepDir(config.checkpoint_dir, 2) + "/MANIFEST.json"));
  std::vector<RankOutcome> resumed = RunRanks(config, 1);
  ASSERT_TRUE(resumed[0].result.ok()) << resumed[0].result.status();
  // Without a readable manifest its generation is unknown, so it sorts last;
  // it is still checked and reported, not passed over in silence.
  EXPECT_EQ(resumed[0].result->resumed_from_step, 1);
  EXPECT_EQ(resumed[0].steps.size(), 1u);
  ASSERT_EQ(resumed[0].corrupt.size(), 1u);
  EXPECT_EQ(resumed[0].corrupt[0].step, 2);
  EXPECT_EQ(resumed[0].corrupt[0].file, StepDir(config.checkpoint_dir, 2) + "/MANIFEST.json");
  EXPECT_EQ(resumed[0].corrupt[0].check, kCheckMissing);
}

TEST_F(TrainerTest, KeepsOnlyNewestCheckpoints) {
  TrainerConfig config = SmallConfig();
  config.schedule.total_steps = 6;
  config.checkpoint_dir = dir_ + "/ckpt";
  config.checkpoint_interval = 1;
  config.keep_checkpoints = 2;
  std::vector<CheckpointReport> reported;
  TrainerCallbacks callbacks;
  callbacks.on_checkpoint = [&](const CheckpointReport& r) { reported.push_back(r); };
  absl::StatusOr<TrainResult> result = Train(config, nullptr, callbacks);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(reported.size(), 6u);
  EXPECT_EQ(result->checkpoints.size(), 6u);
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(config.checkpoint_dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  // The two newest, and the prune log naming what retention deleted.
  EXPECT_EQ(names, (std::vector<std::string>{"PRUNED", "step-000000005", "step-000000006"}));
  EXPECT_THAT(*ReadPruneLog(config.checkpoint_dir),
              ::testing::ElementsAre("step-000000001", "step-000000002", "step-000000003",
                                     "step-000000004"));
  // Reported in step order, each once it had committed.
  for (size_t i = 0; i < reported.size(); ++i) {
    EXPECT_EQ(reported[i].step, static_cast<int64_t>(i + 1));
    EXPECT_EQ(reported[i].path, result->checkpoints[i].path);
  }
}

TEST_F(TrainerTest, TwoRanksResumeFromRankZeroCheckpoint) {
  TrainerConfig config = SmallConfig();
  std::vector<RankOutcome> straight = RunRanks(config, 1);
  ASSERT_TRUE(straight[0].result.ok()) << straight[0].result.status();

  config.checkpoint_dir = dir_ + "/ckpt";
  config.checkpoint_interval = 4;
  // Only rank 1 asks to stop; both ranks must stop together.
  std::vector<RankOutcome> first = RunRanks(config, 2, {0, 4});
  EXPECT_EQ(first[0].result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(first[1].result.status().code(), absl::StatusCode::kCancelled);
  std::vector<RankOutcome> second = RunRanks(config, 2);
  ASSERT_TRUE(second[0].result.ok()) << second[0].result.status();
  ASSERT_TRUE(second[1].result.ok()) << second[1].result.status();
  EXPECT_EQ(second[0].result->resumed_from_step, 4);
  EXPECT_EQ(second[1].result->resumed_from_step, 4);
  EXPECT_EQ(MaxAbsDiff(second[0].parameters, second[1].parameters), 0.0);
  EXPECT_LE(MaxAbsDiff(straight[0].parameters, second[0].parameters), 1e-5);
}

TEST_F(TrainerTest, ShouldStopBeforeFirstStepCancels) {
  TrainerConfig config = SmallConfig();
  TrainerCallbacks callbacks;
  callbacks.should_stop = [] { return true; };
  EXPECT_EQ(Train(config, nullptr, callbacks).status().code(), absl::StatusCode::kCancelled);
}

TEST_F(TrainerTest, RejectsBadConfig) {
  TrainerConfig config = SmallConfig();
  config.global_batch = 6;  // not a multiple of world_size * micro_batch = 4
  config.micro_batch = 4;
  absl::StatusOr<TrainResult> result = Train(config, nullptr, {});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("global_batch"), std::string::npos);

  config = SmallConfig();
  config.model.vocab_size = 100;  // the text holds bytes >= 100 ('e', 's', ...)
  EXPECT_EQ(Train(config, nullptr, {}).status().code(), absl::StatusCode::kInvalidArgument);

  config = SmallConfig();
  config.train_shards = {dir_ + "/missing_*.bin"};
  EXPECT_EQ(Train(config, nullptr, {}).status().code(), absl::StatusCode::kNotFound);

  config = SmallConfig();
  config.skip_batches = {{0, 2}, {5, 5}};  // empty range
  result = Train(config, nullptr, {});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()), ::testing::HasSubstr("skip_batches[1]"));

  config = SmallConfig();
  config.resume_step = -2;
  result = Train(config, nullptr, {});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()), ::testing::HasSubstr("resume_step"));

  config = SmallConfig();
  config.generation = -1;
  EXPECT_EQ(Train(config, nullptr, {}).status().code(), absl::StatusCode::kInvalidArgument);
  config = SmallConfig();
  config.retain_distance_steps = -1;
  EXPECT_EQ(Train(config, nullptr, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

// TrainerConfig::device. The CUDA cases here are those of a LibTorch without
// CUDA (Debian's, CI's); on a machine with a GPU they do not apply.
TEST_F(TrainerTest, DeviceIsValidatedNamingTheField) {
  TrainerConfig config = SmallConfig();
  config.device = "gpu0";
  absl::StatusOr<TrainResult> result = Train(config, nullptr, {});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()),
              ::testing::HasSubstr("device: \"gpu0\" is not a device"));

  config.device = "meta";
  result = Train(config, nullptr, {});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()),
              ::testing::HasSubstr("the engine trains on cpu or cuda"));

  // The rest checks the refusal of a LibTorch without CUDA (Debian's, CI's).
  // Where CUDA and a GPU exist those devices are valid and train instead, so
  // there is nothing left to check here.
  if (torch::cuda::is_available()) GTEST_SKIP() << "this LibTorch has CUDA and a GPU";
  for (const char* device : {"cuda", "cuda:1"}) {
    config.device = device;
    result = Train(config, nullptr, {});
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << device;
    EXPECT_THAT(std::string(result.status().message()),
                ::testing::HasSubstr(absl::StrCat("device: \"", device,
                                                  "\" needs CUDA, but this LibTorch has no CUDA")));
  }
  // fp16 is refused on the CPU with the precision error, device given or not.
  config.device = "cpu";
  config.model.precision = Precision::kFp16;
  result = Train(config, nullptr, {});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()),
              ::testing::HasSubstr("precision: fp16 needs a GPU"));
}

TEST_F(TrainerTest, ExplicitCpuDeviceTrainsBitForBitLikeTheDefault) {
  TrainerConfig config = SmallConfig();
  config.schedule.total_steps = 3;
  std::vector<RankOutcome> by_default = RunRanks(config, 1);
  config.device = "cpu";
  std::vector<RankOutcome> explicit_cpu = RunRanks(config, 1);
  ASSERT_TRUE(by_default[0].result.ok()) << by_default[0].result.status();
  ASSERT_TRUE(explicit_cpu[0].result.ok()) << explicit_cpu[0].result.status();
  EXPECT_EQ(explicit_cpu[0].result->optimizer_implementation, "cpu-kernel");
  EXPECT_EQ(MaxAbsDiff(by_default[0].parameters, explicit_cpu[0].parameters), 0.0);
}

TEST(GptConfigTest, Fp16IsAcceptedOnlyOnAGpu) {
  GptConfig config;
  config.precision = Precision::kFp16;
  EXPECT_EQ(ValidateGptConfig(config).code(), absl::StatusCode::kInvalidArgument);
  config.on_gpu = true;
  EXPECT_TRUE(ValidateGptConfig(config).ok());
  config.precision = Precision::kBf16;
  config.on_gpu = false;
  EXPECT_TRUE(ValidateGptConfig(config).ok());
}

TEST_F(TrainerTest, RejectsCheckpointOfAnotherModel) {
  TrainerConfig config = SmallConfig();
  config.schedule.total_steps = 1;
  config.checkpoint_dir = dir_ + "/ckpt";
  ASSERT_TRUE(Train(config, nullptr, {}).ok());
  config.model.d_model = 64;
  config.schedule.total_steps = 2;
  EXPECT_EQ(Train(config, nullptr, {}).status().code(), absl::StatusCode::kFailedPrecondition);

  // Data batch indices depend on the global batch: a checkpoint does not
  // resume under another one.
  config = SmallConfig();
  config.checkpoint_dir = dir_ + "/ckpt";
  config.schedule.total_steps = 2;
  config.global_batch = 4;
  absl::StatusOr<TrainResult> result = Train(config, nullptr, {});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(result.status().message()), ::testing::HasSubstr("global_batch"));
}

TEST_F(TrainerTest, SkipListMapsStepsToDataBatchesAndIsSavedInCheckpoints) {
  TrainerConfig config = SmallConfig();
  config.schedule.total_steps = 6;
  config.checkpoint_dir = dir_ + "/ckpt";
  config.checkpoint_interval = 3;
  config.skip_batches = {{3, 5}, {2, 4}};  // overlapping: the union is [2, 5)
  std::vector<RankOutcome> first = RunRanks(config, 1);
  ASSERT_TRUE(first[0].result.ok()) << first[0].result.status();
  EXPECT_EQ(first[0].result->skip_batches, (std::vector<BatchRange>{{2, 5}}));
  std::vector<int64_t> batches, skipped;
  for (const loom::v1::StepMetrics& r : first[0].steps) {
    batches.push_back(r.data_batch());
    skipped.push_back(r.batches_skipped());
  }
  // Step 0 is the validation pass before training (no batch).
  EXPECT_EQ(batches, (std::vector<int64_t>{-1, 0, 1, 5, 6, 7, 8}));
  EXPECT_EQ(skipped, (std::vector<int64_t>{0, 0, 0, 3, 3, 3, 3}));

  // Resuming adds a range to the stored list; the union is in force, and the
  // resume point is rewritten with it before the first step.
  config.schedule.total_steps = 8;
  config.skip_batches = {{9, 10}};
  std::vector<RankOutcome> second = RunRanks(config, 1);
  ASSERT_TRUE(second[0].result.ok()) << second[0].result.status();
  EXPECT_EQ(second[0].result->resumed_from_step, 6);
  EXPECT_EQ(second[0].result->skip_batches, (std::vector<BatchRange>{{2, 5}, {9, 10}}));
  ASSERT_EQ(second[0].steps.size(), 2u);
  EXPECT_EQ(second[0].steps[0].data_batch(), 10);
  EXPECT_EQ(second[0].steps[1].data_batch(), 11);
  EXPECT_EQ(second[0].steps[1].batches_skipped(), 4);
  ASSERT_EQ(second[0].result->checkpoints.size(), 2u);
  EXPECT_EQ(second[0].result->checkpoints[0].step, 6);
  EXPECT_EQ(second[0].result->checkpoints[1].step, 8);

  // A later resume that names no ranges keeps the saved ones.
  config.schedule.total_steps = 9;
  config.skip_batches.clear();
  std::vector<RankOutcome> third = RunRanks(config, 1);
  ASSERT_TRUE(third[0].result.ok()) << third[0].result.status();
  EXPECT_EQ(third[0].result->resumed_from_step, 8);
  EXPECT_EQ(third[0].result->skip_batches, (std::vector<BatchRange>{{2, 5}, {9, 10}}));
  ASSERT_EQ(third[0].steps.size(), 1u);
  EXPECT_EQ(third[0].steps[0].data_batch(), 12);
  EXPECT_TRUE(third[0].result->checkpoints.size() == 1u &&
              third[0].result->checkpoints[0].step == 9);  // no rewrite of step 8
}

// The restart-and-skip equivalence, on the engine side: roll back to
// a checkpoint with a skip range, crash on the new branch before its next
// checkpoint, resume with resume_step = -1, and end bit-identical to a run
// from scratch configured with that range.
TEST_F(TrainerTest, RollbackWithSkipMatchesRunFromScratchWithSkip) {
  TrainerConfig config = SmallConfig();
  config.model.dropout = 0.1;
  config.schedule.total_steps = 10;
  config.checkpoint_dir = dir_ + "/ckpt";
  config.checkpoint_interval = 2;
  std::vector<RankOutcome> original = RunRanks(config, 1);
  ASSERT_TRUE(original[0].result.ok()) << original[0].result.status();
  EXPECT_EQ(original[0].result->generation, 0);
  EXPECT_EQ(CheckpointSteps(config.checkpoint_dir), (std::vector<int64_t>{6, 8, 10}));

  // Roll back to the newest checkpoint at step <= 7 (step 6, whose next data
  // batch is 6), skipping data batches [7, 9). Stop after one step.
  TrainerConfig rollback = config;
  rollback.resume_step = 7;
  rollback.generation = 1;
  rollback.skip_batches = {{7, 9}};
  std::vector<RankOutcome> interrupted = RunRanks(rollback, 1, {1});
  EXPECT_EQ(interrupted[0].result.status().code(), absl::StatusCode::kCancelled);
  ASSERT_EQ(interrupted[0].steps.size(), 1u);
  EXPECT_EQ(interrupted[0].steps[0].step(), 7);
  EXPECT_EQ(interrupted[0].steps[0].data_batch(), 6);
  // The resume point now belongs to generation 1; the abandoned branch's
  // later checkpoints are still there.
  EXPECT_EQ(CheckpointSteps(config.checkpoint_dir), (std::vector<int64_t>{6, 8, 10}));
  EXPECT_EQ(ManifestGeneration(config.checkpoint_dir, 6), 1);
  EXPECT_EQ(ManifestGeneration(config.checkpoint_dir, 8), 0);
  EXPECT_EQ(ManifestGeneration(config.checkpoint_dir, 10), 0);

  // A restart as after a crash: newest checkpoint, no skip list given. It
  // must pick generation 1's step 6, not generation 0's step 10.
  std::vector<RankOutcome> resumed = RunRanks(config, 1);
  ASSERT_TRUE(resumed[0].result.ok()) << resumed[0].result.status();
  EXPECT_EQ(resumed[0].result->resumed_from_step, 6);
  EXPECT_EQ(resumed[0].result->generation, 1);
  EXPECT_EQ(resumed[0].result->skip_batches, (std::vector<BatchRange>{{7, 9}}));
  std::vector<int64_t> batches, skipped;
  for (const loom::v1::StepMetrics& r : resumed[0].steps) {
    batches.push_back(r.data_batch());
    skipped.push_back(r.batches_skipped());
  }
  EXPECT_EQ(batches, (std::vector<int64_t>{6, 9, 10, 11}));
  EXPECT_EQ(skipped, (std::vector<int64_t>{0, 2, 2, 2}));
  for (const CheckpointReport& c : resumed[0].result->checkpoints) EXPECT_EQ(c.generation, 1);
  // Generation 1 replaced generation 0's files at the steps it reached.
  EXPECT_EQ(CheckpointSteps(config.checkpoint_dir), (std::vector<int64_t>{6, 8, 10}));
  for (int64_t step : {6, 8, 10}) EXPECT_EQ(ManifestGeneration(config.checkpoint_dir, step), 1);

  TrainerConfig scratch = SmallConfig();
  scratch.model.dropout = 0.1;
  scratch.schedule.total_steps = 10;
  scratch.skip_batches = {{7, 9}};
  std::vector<RankOutcome> reference = RunRanks(scratch, 1);
  ASSERT_TRUE(reference[0].result.ok()) << reference[0].result.status();
  EXPECT_EQ(MaxAbsDiff(reference[0].parameters, resumed[0].parameters), 0.0);
  EXPECT_EQ(reference[0].result->final_loss, resumed[0].result->final_loss);
  // And the skip changed something.
  EXPECT_GT(MaxAbsDiff(original[0].parameters, resumed[0].parameters), 0.0);
}

TEST_F(TrainerTest, TwoRanksRollbackWithSkipMatchesTwoRankRunWithSkip) {
  TrainerConfig config = SmallConfig();
  config.schedule.total_steps = 6;
  config.checkpoint_dir = dir_ + "/ckpt";
  config.checkpoint_interval = 2;
  std::vector<RankOutcome> original = RunRanks(config, 2);
  ASSERT_TRUE(original[0].result.ok()) << original[0].result.status();

  config.resume_step = 4;
  config.generation = 1;
  config.skip_batches = {{5, 7}};
  std::vector<RankOutcome> rolled_back = RunRanks(config, 2);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(rolled_back[rank].result.ok()) << rolled_back[rank].result.status();
    EXPECT_EQ(rolled_back[rank].result->resumed_from_step, 4);
    EXPECT_EQ(rolled_back[rank].result->generation, 1);
  }
  // Rank 0 rewrote the resume point under generation 1, then wrote 6.
  ASSERT_EQ(rolled_back[0].result->checkpoints.size(), 2u);
  EXPECT_EQ(rolled_back[0].result->checkpoints[0].step, 4);
  EXPECT_TRUE(rolled_back[1].result->checkpoints.empty());

  TrainerConfig scratch = SmallConfig();
  scratch.schedule.total_steps = 6;
  scratch.skip_batches = {{5, 7}};
  std::vector<RankOutcome> reference = RunRanks(scratch, 2);
  ASSERT_TRUE(reference[0].result.ok()) << reference[0].result.status();
  EXPECT_EQ(MaxAbsDiff(reference[0].parameters, rolled_back[0].parameters), 0.0);
  EXPECT_EQ(MaxAbsDiff(reference[1].parameters, rolled_back[1].parameters), 0.0);
}

TEST_F(TrainerTest, ResumeStepPicksNewestValidCheckpointAtOrBeforeIt) {
  TrainerConfig config = SmallConfig();
  config.schedule.total_steps = 4;
  std::vector<RankOutcome> straight = RunRanks(config, 1);
  ASSERT_TRUE(straight[0].result.ok()) << straight[0].result.status();

  config.checkpoint_dir = dir_ + "/ckpt";
  config.checkpoint_interval = 1;
  config.keep_checkpoints = 0;  // keep every file
  ASSERT_TRUE(RunRanks(config, 1)[0].result.ok());
  const std::string dir = config.checkpoint_dir;
  FlipMiddleByte(ShardOf(dir, 3));

  // resume_step 3: step 3 is corrupt, so step 2. Checkpoints after 3 exist,
  // so this is a fork; the config forgot to raise the generation, so the
  // trainer does (1 + the highest in the directory). Stop before step 3.
  TrainerConfig rollback = config;
  rollback.resume_step = 3;
  TrainerCallbacks stop_at_once;
  stop_at_once.should_stop = [] { return true; };
  EXPECT_EQ(Train(rollback, nullptr, stop_at_once).status().code(),
            absl::StatusCode::kCancelled);
  EXPECT_EQ(ManifestGeneration(dir, 2), 1);
  EXPECT_EQ(ManifestGeneration(dir, 3), 0);  // corrupt, from the old branch
  EXPECT_EQ(ManifestGeneration(dir, 4), 0);

  std::vector<RankOutcome> finished = RunRanks(config, 1);
  ASSERT_TRUE(finished[0].result.ok()) << finished[0].result.status();
  EXPECT_EQ(finished[0].result->resumed_from_step, 2);
  EXPECT_EQ(finished[0].result->generation, 1);
  EXPECT_EQ(MaxAbsDiff(straight[0].parameters, finished[0].parameters), 0.0);
  EXPECT_EQ(CheckpointSteps(dir), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(ManifestGeneration(dir, 1), 0);  // on the branch: kept
  EXPECT_EQ(ManifestGeneration(dir, 3), 1);
  EXPECT_EQ(ManifestGeneration(dir, 4), 1);

  // resume_step 1 with step 1 corrupt: nothing at or before it verifies.
  FlipMiddleByte(ShardOf(dir, 1));
  rollback.resume_step = 1;
  absl::StatusOr<TrainResult> failed = Train(rollback, nullptr, {});
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(failed.status().message());
  EXPECT_THAT(message, ::testing::HasSubstr(StepDir(dir, 1) + " (crc32c: " + ShardOf(dir, 1) +
                                            ": crc32c "));
  EXPECT_THAT(message, ::testing::HasSubstr(StepDir(dir, 4) + " (generation 1, after step 1)"));

  // resume_step 0: from scratch, as a new branch stamped at step 0.
  rollback.resume_step = 0;
  EXPECT_EQ(Train(rollback, nullptr, stop_at_once).status().code(),
            absl::StatusCode::kCancelled);
  EXPECT_EQ(ManifestGeneration(dir, 0), 2);
  rollback.resume_step = -1;
  std::vector<RankOutcome> again = RunRanks(rollback, 1);
  ASSERT_TRUE(again[0].result.ok()) << again[0].result.status();
  EXPECT_EQ(again[0].result->resumed_from_step, 0);
  EXPECT_EQ(again[0].result->generation, 2);
  EXPECT_EQ(MaxAbsDiff(straight[0].parameters, again[0].parameters), 0.0);
}

TEST_F(TrainerTest, RetainsACheckpointRollbackDistanceBehindTheNewest) {
  TrainerConfig config = SmallConfig();
  config.schedule.total_steps = 12;
  config.checkpoint_dir = dir_ + "/ckpt";
  config.checkpoint_interval = 2;
  config.keep_checkpoints = 2;
  config.retain_distance_steps = 5;
  std::vector<std::vector<int64_t>> after_each;
  TrainerCallbacks callbacks;
  callbacks.on_checkpoint = [&](const CheckpointReport&) {
    after_each.push_back(CheckpointSteps(config.checkpoint_dir));
  };
  absl::StatusOr<TrainResult> result = Train(config, nullptr, callbacks);
  ASSERT_TRUE(result.ok()) << result.status();
  // Newest 2, plus the newest at or before (newest - 5) and all after it: so
  // after each write a checkpoint exists exactly where it would if nothing
  // had been pruned.
  EXPECT_EQ(after_each, (std::vector<std::vector<int64_t>>{{2},
                                                           {2, 4},
                                                           {2, 4, 6},
                                                           {2, 4, 6, 8},
                                                           {4, 6, 8, 10},
                                                           {6, 8, 10, 12}}));
}

// Rewrites checkpoint `step` in `dir` as format version 1 or 2 wrote it: one
// torch::serialize archive, ckpt_<8 digits>.pt, with a sha256sum sidecar
// (version 2: with a "# loom generation=G step=S" line). The directory is
// removed.
void WriteLegacyCheckpoint(int version, const TrainerConfig& config, int64_t step) {
  const std::string dir = config.checkpoint_dir;
  absl::StatusOr<std::string> bytes =
      ReadVerifiedCheckpoint({step, StepDir(dir, step), 0, false});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  Gpt model(config.model);
  std::unique_ptr<torch::optim::AdamW> optimizer = MakeAdamW(*model, config.optimizer);
  TrainingState state;
  const CheckpointShape shape{ModelFingerprint(config.model), config.global_batch, 1};
  ASSERT_TRUE(RestoreCheckpoint(*bytes, shape, *model, *optimizer, &state).ok());

  torch::serialize::OutputArchive out;
  out.write("format", c10::IValue(absl::StrCat("loom-checkpoint-v", version)));
  out.write("model_config", c10::IValue(ModelFingerprint(config.model)));
  out.write("step", c10::IValue(state.step));
  out.write("data_cursor", c10::IValue(state.next_data_batch * config.global_batch));
  out.write("loss", c10::IValue(state.loss));
  out.write("has_val_loss", c10::IValue(state.has_val_loss));
  out.write("val_loss", c10::IValue(state.val_loss));
  if (version == 2) {
    std::vector<int64_t> skips, lineage;
    for (const BatchRange& r : state.skip_batches) skips.insert(skips.end(), {r.begin, r.end});
    for (const auto& [g, s] : state.lineage) lineage.insert(lineage.end(), {g, s});
    out.write("global_batch", c10::IValue(int64_t{config.global_batch}));
    out.write("next_data_batch", c10::IValue(state.next_data_batch));
    out.write("skip_batches", c10::IValue(skips));
    out.write("generation", c10::IValue(state.generation));
    out.write("lineage", c10::IValue(lineage));
    out.write("cpu_generator_state", at::detail::getDefaultCPUGenerator().get_state(),
              /*is_buffer=*/true);
  }
  torch::serialize::OutputArchive model_out, optimizer_out;
  model->save(model_out);
  out.write("model", model_out);
  optimizer->save(optimizer_out);
  out.write("optimizer", optimizer_out);
  char name[32];
  std::snprintf(name, sizeof(name), "ckpt_%08lld.pt", static_cast<long long>(step));
  const std::string path = dir + "/" + name;
  out.save_to(path);
  absl::StatusOr<std::string> digest = Sha256File(path);
  ASSERT_TRUE(digest.ok());
  std::ofstream sidecar(path + ".sha256");
  sidecar << *digest << "  " << name << "\n";
  if (version == 2) sidecar << "# loom generation=" << state.generation << " step=" << step << "\n";
  sidecar.close();
  // Both formats digest the same weights the same.
  absl::StatusOr<ModelDigest> legacy_digest = DigestCheckpointModel(path);
  absl::StatusOr<ModelDigest> directory_digest = DigestCheckpointModel(StepDir(dir, step));
  ASSERT_TRUE(legacy_digest.ok()) << legacy_digest.status();
  ASSERT_TRUE(directory_digest.ok()) << directory_digest.status();
  EXPECT_EQ(legacy_digest->sha256, directory_digest->sha256);
  EXPECT_EQ(legacy_digest->tensors, directory_digest->tensors);
  fs::remove_all(StepDir(dir, step));
}

// Checkpoints of the single-file formats still resume: version 1
// (loom-checkpoint-v1: no generation, skip list, data batch index or
// generator state; the cursor in samples) as generation 0 with no skips,
// and version 2.
TEST_F(TrainerTest, ResumesFromVersion1And2Checkpoints) {
  TrainerConfig config = SmallConfig();
  config.schedule.total_steps = 4;
  std::vector<RankOutcome> straight = RunRanks(config, 1);
  ASSERT_TRUE(straight[0].result.ok()) << straight[0].result.status();
  for (int version : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("version ", version));
    config.checkpoint_dir = absl::StrCat(dir_, "/ckpt_v", version);
    config.checkpoint_interval = 2;
    ASSERT_TRUE(RunRanks(config, 1, {2})[0].result.status().code() ==
                absl::StatusCode::kCancelled);
    ASSERT_NO_FATAL_FAILURE(WriteLegacyCheckpoint(version, config, 2));
    ASSERT_TRUE(CheckpointSteps(config.checkpoint_dir).empty());

    std::vector<RankOutcome> resumed = RunRanks(config, 1);
    ASSERT_TRUE(resumed[0].result.ok()) << resumed[0].result.status();
    EXPECT_EQ(resumed[0].result->resumed_from_step, 2);
    EXPECT_EQ(resumed[0].result->generation, 0);
    ASSERT_EQ(resumed[0].steps.size(), 2u);
    EXPECT_EQ(resumed[0].steps[0].data_batch(), 2);
    EXPECT_EQ(MaxAbsDiff(straight[0].parameters, resumed[0].parameters), 0.0);
    // New checkpoints are directories; the legacy file stays (on the branch).
    EXPECT_EQ(CheckpointSteps(config.checkpoint_dir), (std::vector<int64_t>{4}));
    EXPECT_TRUE(fs::exists(config.checkpoint_dir + "/ckpt_00000002.pt"));
  }
}

// Runs loom_trainer_kill_helper on `config` (one rank) with `kill_flags`,
// which make it SIGKILL itself; fails the test unless it died that way. The
// helper is a separate executable, started with posix_spawn, so that nothing
// runs in a forked copy of this multi-threaded process.
void RunKillHelper(const TrainerConfig& config, const std::vector<std::string>& kill_flags) {
  std::vector<std::string> args = {
      LOOM_TRAINER_KILL_HELPER,
      "--train=" + config.train_shards.at(0),
      "--val=" + config.val_shards.at(0),
      "--checkpoint_dir=" + config.checkpoint_dir,
      absl::StrCat("--n_layer=", config.model.n_layer),
      absl::StrCat("--n_head=", config.model.n_head),
      absl::StrCat("--d_model=", config.model.d_model),
      absl::StrCat("--seq_len=", config.model.seq_len),
      absl::StrCat("--vocab_size=", config.model.vocab_size),
      absl::StrCat("--dropout=", config.model.dropout),
      absl::StrCat("--lr=", config.optimizer.lr),
      absl::StrCat("--total_steps=", config.schedule.total_steps),
      absl::StrCat("--warmup_steps=", config.schedule.warmup_steps),
      absl::StrCat("--global_batch=", config.global_batch),
      absl::StrCat("--micro_batch=", config.micro_batch),
      absl::StrCat("--seed=", config.seed),
      absl::StrCat("--eval_batches=", config.eval_batches),
      absl::StrCat("--checkpoint_interval=", config.checkpoint_interval)};
  args.insert(args.end(), kill_flags.begin(), kill_flags.end());
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ), 0)
      << std::strerror(errno);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "helper exited with status " << status;
}

// Kill -9 of a real training process after a checkpoint, then resume: the
// result is bitwise that of an uninterrupted run.
TEST_F(TrainerTest, ResumesBitExactAfterKill9) {
  TrainerConfig config = SmallConfig();
  config.model.dropout = 0.1;  // the resumed run needs the same masks
  config.schedule.total_steps = 8;
  std::vector<RankOutcome> straight = RunRanks(config, 1);
  ASSERT_TRUE(straight[0].result.ok()) << straight[0].result.status();

  config.checkpoint_dir = dir_ + "/ckpt";
  config.checkpoint_interval = 3;
  // Dies in step 5's report (once checkpoint 3 has committed), before
  // checkpoint 6.
  ASSERT_NO_FATAL_FAILURE(RunKillHelper(config, {"--kill_at_step=5"}));
  EXPECT_EQ(CheckpointSteps(config.checkpoint_dir), (std::vector<int64_t>{3}));

  std::vector<RankOutcome> resumed = RunRanks(config, 1);
  ASSERT_TRUE(resumed[0].result.ok()) << resumed[0].result.status();
  EXPECT_EQ(resumed[0].result->resumed_from_step, 3);
  EXPECT_TRUE(resumed[0].result->corrupt_checkpoints.empty());
  EXPECT_EQ(MaxAbsDiff(straight[0].parameters, resumed[0].parameters), 0.0);
  EXPECT_EQ(resumed[0].result->final_loss, straight[0].result->final_loss);
  EXPECT_EQ(resumed[0].result->final_val_loss, straight[0].result->final_val_loss);
}

// Kill -9 in the middle of saving checkpoint 4 (at `stage`): the directory
// holds the complete checkpoint 2 and the interrupted save's temporary
// directory with `temp_files`; resume ignores the temporary (however
// complete), picks checkpoint 2, removes the temporary, and ends bitwise
// equal to an uninterrupted run.
void CheckCrashDuringSave(const TrainerConfig& base, const std::vector<RankOutcome>& straight,
                          const std::string& stage,
                          const std::vector<std::string>& temp_files,
                          const std::function<std::vector<RankOutcome>(const TrainerConfig&)>&
                              run) {
  TrainerConfig config = base;
  config.checkpoint_interval = 2;
  ASSERT_NO_FATAL_FAILURE(
      RunKillHelper(config, {"--kill_at_stage=" + stage, "--kill_at_checkpoint=4"}));
  EXPECT_EQ(CheckpointSteps(config.checkpoint_dir), (std::vector<int64_t>{2}));
  const std::vector<std::string> temps = TemporaryNames(config.checkpoint_dir);
  ASSERT_EQ(temps.size(), 1u);
  EXPECT_EQ(temps[0].rfind("step-000000004.tmp-", 0), 0u) << temps[0];
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(config.checkpoint_dir + "/" + temps[0])) {
    files.push_back(entry.path().filename().string());
  }
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, temp_files);
  // Listing, and so the controller's view, has only the committed one.
  std::vector<CheckpointEntry> listed = ListCheckpoints(config.checkpoint_dir);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].step, 2);

  std::vector<RankOutcome> resumed = run(config);
  ASSERT_TRUE(resumed[0].result.ok()) << resumed[0].result.status();
  EXPECT_EQ(resumed[0].result->resumed_from_step, 2);
  EXPECT_TRUE(resumed[0].result->corrupt_checkpoints.empty());
  EXPECT_TRUE(TemporaryNames(config.checkpoint_dir).empty());
  EXPECT_EQ(MaxAbsDiff(straight[0].parameters, resumed[0].parameters), 0.0);
  EXPECT_EQ(resumed[0].result->final_loss, straight[0].result->final_loss);
}

TEST_F(TrainerTest, CrashAfterShardsBeforeManifestLeavesOnlyCompleteCheckpoints) {
  TrainerConfig config = SmallConfig();
  config.schedule.total_steps = 6;
  std::vector<RankOutcome> straight = RunRanks(config, 1);
  ASSERT_TRUE(straight[0].result.ok()) << straight[0].result.status();
  config.checkpoint_dir = dir_ + "/ckpt";
  CheckCrashDuringSave(config, straight, "shards_written", {"shard-00000.bin"},
                       [&](const TrainerConfig& c) { return RunRanks(c, 1); });
}

TEST_F(TrainerTest, CrashAfterManifestBeforeRenameLeavesOnlyCompleteCheckpoints) {
  TrainerConfig config = SmallConfig();
  config.schedule.total_steps = 6;
  std::vector<RankOutcome> straight = RunRanks(config, 1);
  ASSERT_TRUE(straight[0].result.ok()) << straight[0].result.status();
  config.checkpoint_dir = dir_ + "/ckpt";
  CheckCrashDuringSave(config, straight, "manifest_written", {"MANIFEST.json", "shard-00000.bin"},
                       [&](const TrainerConfig& c) { return RunRanks(c, 1); });
}

// Asynchronous saves write exactly the checkpoints synchronous saves write
// (every file bitwise equal, so equal model digests), and resuming from
// either gives the same run.
TEST_F(TrainerTest, AsyncSaveWritesTheSameCheckpointsAsSynchronousSave) {
  TrainerConfig config = SmallConfig();
  config.model.dropout = 0.1;
  config.schedule.total_steps = 6;
  config.checkpoint_interval = 1;
  config.keep_checkpoints = 0;
  TrainerConfig sync = config, async = config;
  sync.checkpoint_async = false;
  sync.checkpoint_dir = dir_ + "/sync";
  async.checkpoint_async = true;
  async.checkpoint_dir = dir_ + "/async";
  std::vector<RankOutcome> a = RunRanks(async, 1);
  std::vector<RankOutcome> b = RunRanks(sync, 1);
  ASSERT_TRUE(a[0].result.ok()) << a[0].result.status();
  ASSERT_TRUE(b[0].result.ok()) << b[0].result.status();
  EXPECT_EQ(MaxAbsDiff(a[0].parameters, b[0].parameters), 0.0);
  ASSERT_EQ(CheckpointSteps(async.checkpoint_dir), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  ASSERT_EQ(CheckpointSteps(sync.checkpoint_dir), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  ASSERT_EQ(a[0].result->checkpoints.size(), 6u);
  for (int64_t step = 1; step <= 6; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    for (const char* file : {"/shard-00000.bin", "/MANIFEST.json"}) {
      absl::StatusOr<std::string> x = Sha256File(StepDir(async.checkpoint_dir, step) + file);
      absl::StatusOr<std::string> y = Sha256File(StepDir(sync.checkpoint_dir, step) + file);
      ASSERT_TRUE(x.ok() && y.ok());
      EXPECT_EQ(*x, *y) << file;
    }
    absl::StatusOr<ModelDigest> x = DigestCheckpointModel(StepDir(async.checkpoint_dir, step));
    absl::StatusOr<ModelDigest> y = DigestCheckpointModel(StepDir(sync.checkpoint_dir, step));
    ASSERT_TRUE(x.ok()) << x.status();
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_EQ(x->sha256, y->sha256);
    EXPECT_EQ(x->parameters, GptParameterCount(config.model));
    EXPECT_EQ(a[0].result->checkpoints[step - 1].sha256, b[0].result->checkpoints[step - 1].sha256);
  }
  // Roll both back to step 3 and train on to 8: equal again.
  for (TrainerConfig* c : {&async, &sync}) {
    c->resume_step = 3;
    c->schedule.total_steps = 8;
  }
  std::vector<RankOutcome> ra = RunRanks(async, 1);
  std::vector<RankOutcome> rb = RunRanks(sync, 1);
  ASSERT_TRUE(ra[0].result.ok()) << ra[0].result.status();
  ASSERT_TRUE(rb[0].result.ok()) << rb[0].result.status();
  EXPECT_EQ(ra[0].result->resumed_from_step, 3);
  EXPECT_EQ(rb[0].result->resumed_from_step, 3);
  EXPECT_EQ(MaxAbsDiff(ra[0].parameters, rb[0].parameters), 0.0);
  EXPECT_EQ(ra[0].result->final_loss, rb[0].result->final_loss);
}

// Binds port 0 to find a free port. Racy in principle (another process may
// take it before the store does); good enough for a test.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

TEST(CreateGlooProcessGroupTest, TwoRanksAllReduceOverTcpStore) {
  GlooGroupOptions options;
  options.master_addr = "127.0.0.1";
  options.master_port = FreePort();
  options.local_addr = "127.0.0.1";
  options.world_size = 2;
  options.timeout_seconds = 60;
  std::vector<double> sums(2, 0);
  std::vector<absl::Status> statuses(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      GlooGroupOptions mine = options;
      mine.rank = rank;
      absl::StatusOr<std::shared_ptr<c10d::ProcessGroup>> group = CreateGlooProcessGroup(mine);
      statuses[rank] = group.status();
      if (!group.ok()) return;
      EXPECT_EQ((*group)->getRank(), rank);
      EXPECT_EQ((*group)->getSize(), 2);
      std::vector<torch::Tensor> t = {torch::tensor({rank + 1.0})};
      (*group)->allreduce(t)->wait();
      sums[rank] = t[0].item<double>();
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(statuses[0].ok()) << statuses[0];
  ASSERT_TRUE(statuses[1].ok()) << statuses[1];
  EXPECT_EQ(sums, (std::vector<double>{3.0, 3.0}));
}

TEST(CreateProcessGroupTest, CpuRanksGetGlooAndCudaNeedsCuda) {
  GlooGroupOptions options;
  options.master_addr = "127.0.0.1";
  options.master_port = FreePort();
  options.local_addr = "127.0.0.1";
  options.world_size = 1;
  options.timeout_seconds = 30;
  absl::StatusOr<std::shared_ptr<c10d::ProcessGroup>> group = CreateProcessGroup(options, "cpu");
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ((*group)->getBackendName(), "gloo");
  std::vector<torch::Tensor> t = {torch::tensor({2.5})};
  (*group)->allreduce(t)->wait();
  EXPECT_EQ(t[0].item<double>(), 2.5);

  EXPECT_EQ(CreateProcessGroup(options, "tpu:0").status().code(),
            absl::StatusCode::kInvalidArgument);
  // The rest checks the refusal of a LibTorch without CUDA (Debian's, CI's).
  // Where CUDA and a GPU exist those devices are valid and train instead, so
  // there is nothing left to check here.
  if (torch::cuda::is_available()) GTEST_SKIP() << "this LibTorch has CUDA and a GPU";
  EXPECT_EQ(CreateProcessGroup(options, "cuda:0").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CreateGlooProcessGroupTest, RejectsBadRank) {
  GlooGroupOptions options;
  options.world_size = 2;
  options.rank = 2;
  EXPECT_EQ(CreateGlooProcessGroup(options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom::engine
