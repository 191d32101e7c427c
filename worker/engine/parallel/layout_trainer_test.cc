// Train() under parallel layouts: the layout engine
// trains like the replicated one, and checkpoints move between layouts.
// Ranks are threads of this process (real Gloo groups over loopback, one
// HashStore), training a 4-block GPT on real English text (Debian's
// fortunes), byte-level.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <unistd.h>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/parallel/layout_engine.h"
#include "worker/engine/checkpoint/checkpoint_choice.h"
#include "worker/engine/checkpoint/checkpoint_inspect.h"
#include "worker/engine/checkpoint/checkpoint_fence.h"
#include "common/formats/data.h"
#include "worker/engine/parallel/parallel_gpt.h"
#include "worker/engine/parallel/process_groups.h"
#include "worker/engine/checkpoint/checkpoint_choice.h"
#include "worker/engine/parallel/sharded_checkpoint.h"
#include "worker/engine/trainer.h"

namespace loom::engine {
namespace {

namespace fs = std::filesystem;

struct Layout {
  int tensor = 1;
  int pipeline = 1;
  int data = 1;
  int zero_stage = 0;
  bool replicated = false;  // Train() over a world group: today's engine
  std::string Name() const {
    if (replicated) return "replicated DP" + std::to_string(data);
    std::string name = "TP" + std::to_string(tensor) + "xPP" + std::to_string(pipeline) + "xDP" +
                       std::to_string(data);
    if (zero_stage > 0) name += " ZeRO-" + std::to_string(zero_stage);
    return name;
  }
};

struct RunOutcome {
  std::vector<absl::Status> statuses;     // per rank
  std::vector<loom::v1::StepMetrics> steps;          // rank 0's reports
  std::vector<TrainResult> results;       // per rank (when ok)
};

class LayoutTrainerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char pattern[] = "/tmp/loom_layout_trainer_testXXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    data_dir_ = new std::string(pattern);
    std::vector<std::string> inputs;
    for (const char* f : {"fortunes", "literature"}) {
      inputs.push_back(std::string("/usr/share/games/fortunes/") + f);
    }
    absl::StatusOr<PrepareResult> prepared =
        PrepareByteLevelData(inputs, *data_dir_ + "/data", 0.1);
    ASSERT_TRUE(prepared.ok()) << prepared.status();
    train_ = new std::vector<std::string>(prepared->train_shards);
    val_ = new std::vector<std::string>(prepared->val_shards);
  }
  static void TearDownTestSuite() {
    fs::remove_all(*data_dir_);
    delete data_dir_;
    delete train_;
    delete val_;
  }

  void SetUp() override {
    torch::set_num_threads(1);
    char pattern[] = "/tmp/loom_layout_ckptXXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  static TrainerConfig Config() {
    TrainerConfig c;
    c.model.n_layer = 4;
    c.model.n_head = 4;
    c.model.d_model = 32;
    c.model.seq_len = 32;
    c.model.vocab_size = 256;
    c.model.dropout = 0.0;
    c.optimizer.lr = 1e-3;
    c.optimizer.eps = 1e-5;  // why: parallel_gpt_test.cc, TestOptimizer
    c.optimizer.grad_clip = 1.0;
    c.schedule.total_steps = 10;
    c.schedule.warmup_steps = 2;
    c.global_batch = 8;
    c.micro_batch = 2;
    c.seed = 1234;
    c.eval_batches = 4;
    c.eval_interval = 5;
    c.train_shards = *train_;
    c.val_shards = *val_;
    return c;
  }

  // Trains `config` under `layout` on data x pipeline x tensor threads.
  // stop_after > 0: every rank asks to stop once that many steps ran.
  // on_step, if set, also sees rank 0's reports.
  RunOutcome Run(TrainerConfig config, const Layout& layout, int64_t stop_after = 0,
                 std::function<void(const loom::v1::StepMetrics&)> on_step = nullptr) {
    config.tensor_parallel = layout.tensor;
    config.pipeline_parallel = layout.pipeline;
    config.zero_stage = layout.zero_stage;
    const ParallelLayout parallel{layout.data, layout.tensor, layout.pipeline};
    const int world = parallel.world_size();
    auto store = c10::make_intrusive<c10d::HashStore>();
    RunOutcome out;
    out.statuses.assign(world, absl::UnknownError("not run"));
    out.results.resize(world);
    // Every rank's groups live until all ranks are done: a rank that fails
    // validation at once must not close its connections while a peer is
    // still setting up a group with it (the peer then fails or waits for
    // the rendezvous timeout).
    std::vector<std::optional<ParallelGroups>> kept(world);
    auto run = [&](int rank) {
      // One intra-op thread per rank thread; CTest also sets
      // OMP_NUM_THREADS=1 (trainer_test.cc, RunRanks, says why).
      torch::set_num_threads(1);
      ParallelGroupOptions options;
      options.timeout_seconds = 120;
      options.local_addr = "127.0.0.1";
      absl::StatusOr<ParallelGroups> created = CreateParallelGroups(store, rank, parallel, options);
      if (!created.ok()) {
        out.statuses[rank] = created.status();
        return;
      }
      kept[rank].emplace(*std::move(created));
      ParallelGroups* groups = &*kept[rank];
      int64_t polls = 0;
      TrainerCallbacks callbacks;
      if (rank == 0) {
        callbacks.on_step = [&out, &on_step](const loom::v1::StepMetrics& r) {
          out.steps.push_back(r);
          if (on_step) on_step(r);
        };
      }
      callbacks.should_stop = [&polls, stop_after] {
        return stop_after > 0 && polls++ >= stop_after;
      };
      absl::StatusOr<TrainResult> result =
          layout.replicated ? Train(config, groups->world, callbacks)
                            : TrainWithGroups(config, *groups, callbacks);
      out.statuses[rank] = result.status();
      if (result.ok()) out.results[rank] = *result;
    };
    std::vector<std::thread> threads;
    for (int rank = 0; rank < world; ++rank) threads.emplace_back(run, rank);
    for (std::thread& t : threads) t.join();
    return out;
  }

  static void ExpectAllOk(const RunOutcome& out, const std::string& what) {
    for (size_t r = 0; r < out.statuses.size(); ++r) {
      EXPECT_TRUE(out.statuses[r].ok()) << what << " rank " << r << ": " << out.statuses[r];
    }
  }

  // Reports of optimizer steps (step >= 1), by step.
  static std::map<int64_t, loom::v1::StepMetrics> ByStep(
      const std::vector<loom::v1::StepMetrics>& steps) {
    std::map<int64_t, loom::v1::StepMetrics> by_step;
    for (const loom::v1::StepMetrics& r : steps) {
      if (r.step() >= 1) by_step[r.step()] = r;
    }
    return by_step;
  }

  // Worst relative difference of train and validation losses over the
  // steps both runs report (from `first_step` on); prints it.
  static double WorstLossDifference(const std::vector<loom::v1::StepMetrics>& reference,
                                    const std::vector<loom::v1::StepMetrics>& run,
                                    const std::string& what, int64_t first_step = 1) {
    const auto want = ByStep(reference), got = ByStep(run);
    double worst = 0;
    int compared = 0;
    for (const auto& [step, r] : want) {
      if (step < first_step) continue;
      auto it = got.find(step);
      if (it == got.end()) {
        ADD_FAILURE() << what << ": no report of step " << step;
        continue;
      }
      worst = std::max(worst, std::abs(it->second.loss() - r.loss()) / std::abs(r.loss()));
      if (r.has_val_loss()) {
        EXPECT_TRUE(it->second.has_val_loss()) << what << " step " << step;
        worst = std::max(worst, std::abs(it->second.val_loss() - r.val_loss()) / r.val_loss());
      }
      ++compared;
    }
    std::printf("%s: %d steps compared, worst loss difference %.3g (relative)\n", what.c_str(),
                compared, worst);
    EXPECT_GT(compared, 0) << what;
    return worst;
  }

  static std::string* data_dir_;
  static std::vector<std::string>* train_;
  static std::vector<std::string>* val_;
  std::string dir_;
};
std::string* LayoutTrainerTest::data_dir_ = nullptr;
std::vector<std::string>* LayoutTrainerTest::train_ = nullptr;
std::vector<std::string>* LayoutTrainerTest::val_ = nullptr;

TEST_F(LayoutTrainerTest, EveryLayoutTrainsLikeOneRank) {
  const RunOutcome reference = Run(Config(), Layout{1, 1, 1, 0, /*replicated=*/true});
  ExpectAllOk(reference, "reference");
  ASSERT_EQ(ByStep(reference.steps).size(), 10u);
  EXPECT_LT(ByStep(reference.steps).at(10).loss(), ByStep(reference.steps).at(1).loss());
  for (const Layout& layout :
       {Layout{2, 1, 1}, Layout{1, 2, 1}, Layout{2, 2, 1}, Layout{1, 4, 1}, Layout{1, 1, 2, 1},
        Layout{1, 1, 2, 2}, Layout{2, 1, 2}, Layout{2, 1, 2, 1},
        // ZeRO-0 over two replicas of a pipeline: the data-parallel
        // all-reduce overlaps the last backward, the tied wte (summed
        // between the stages afterwards) goes last.
        Layout{1, 2, 2}}) {
    const RunOutcome run = Run(Config(), layout);
    ExpectAllOk(run, layout.Name());
    EXPECT_LE(WorstLossDifference(reference.steps, run.steps, layout.Name()), 1e-5)
        << layout.Name();
    // The step split: pipeline waits only where there is a pipeline, and
    // inside the compute phase.
    for (const auto& [step, r] : ByStep(run.steps)) {
      if (layout.pipeline == 1) {
        EXPECT_EQ(r.pipeline_wait_seconds(), 0) << layout.Name() << " step " << step;
      }
      EXPECT_LE(r.pipeline_wait_seconds(), r.compute_seconds())
          << layout.Name() << " step " << step;
      EXPECT_GE(r.pipeline_wait_seconds(), 0) << layout.Name() << " step " << step;
    }
  }
}

// A Llama-family model (RMSNorm, SwiGLU with its own width, rotary
// positions, grouped-query attention, untied head, no biases) under tensor,
// pipeline and ZeRO layouts trains as on one rank (the same initial weights
// and the same steps), and a checkpoint of one layout resumes under another.
TEST_F(LayoutTrainerTest, LlamaTrainsUnderEveryLayoutLikeOneRank) {
  TrainerConfig config = Config();
  config.model.rms_norm = true;
  config.model.gated_mlp = true;
  config.model.ffn_hidden = 88;
  config.model.rotary = true;
  config.model.n_kv_head = 2;
  config.model.tied_embeddings = false;
  config.model.bias = false;
  const RunOutcome reference = Run(config, Layout{1, 1, 1, 0, /*replicated=*/true});
  ExpectAllOk(reference, "reference");
  ASSERT_EQ(ByStep(reference.steps).size(), 10u);
  EXPECT_LT(ByStep(reference.steps).at(10).loss(), ByStep(reference.steps).at(1).loss());
  for (const Layout& layout : {Layout{2, 1, 1}, Layout{1, 2, 1}, Layout{2, 2, 1},
                               Layout{1, 1, 2, 1}, Layout{2, 1, 2, 2}, Layout{1, 2, 2}}) {
    const RunOutcome run = Run(config, layout);
    ExpectAllOk(run, layout.Name());
    EXPECT_LE(WorstLossDifference(reference.steps, run.steps, "Llama " + layout.Name()), 1e-5)
        << layout.Name();
  }
  // TP2 x PP2 writes a checkpoint; one rank resumes it.
  TrainerConfig first = config;
  first.checkpoint_dir = dir_ + "/llama";
  first.checkpoint_interval = 5;
  const RunOutcome stopped = Run(first, Layout{2, 2, 1}, /*stop_after=*/5);
  for (const absl::Status& s : stopped.statuses) EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  TrainerConfig resumed = config;
  resumed.checkpoint_dir = first.checkpoint_dir;
  const RunOutcome run = Run(resumed, Layout{1, 1, 1, 0, true});
  ExpectAllOk(run, "resumed on one rank");
  ASSERT_TRUE(run.statuses[0].ok());
  EXPECT_EQ(run.results[0].resumed_from_step, 5);
  EXPECT_LE(WorstLossDifference(reference.steps, run.steps, "Llama TP2xPP2 -> one rank",
                                /*first_step=*/6),
            1e-5);
  // Fewer key/value heads than tensor ranks: each head copied to two
  // ranks, with ZeRO-1 over two replicas; its checkpoint resumes under TP2
  // (heads split) and on one rank.
  const RunOutcome copied = Run(config, Layout{4, 1, 2, 1});
  ExpectAllOk(copied, "TP4xDP2 ZeRO-1");
  EXPECT_LE(WorstLossDifference(reference.steps, copied.steps, "Llama TP4xDP2 ZeRO-1 (copied kv)"),
            1e-5);
  TrainerConfig four = config;
  four.checkpoint_dir = dir_ + "/llama-copied";
  four.checkpoint_interval = 5;
  const RunOutcome stopped_four = Run(four, Layout{4, 1, 1}, /*stop_after=*/5);
  for (const absl::Status& s : stopped_four.statuses) {
    EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  }
  for (const Layout& then : {Layout{2, 1, 1}, Layout{1, 1, 1, 0, true}}) {
    const std::string copy = dir_ + "/llama-copied-" + std::to_string(then.tensor);
    fs::copy(four.checkpoint_dir, copy, fs::copy_options::recursive);
    TrainerConfig again = config;
    again.checkpoint_dir = copy;
    const RunOutcome continued = Run(again, then);
    ExpectAllOk(continued, "TP4 -> " + then.Name());
    ASSERT_TRUE(continued.statuses[0].ok());
    EXPECT_EQ(continued.results[0].resumed_from_step, 5);
    EXPECT_LE(WorstLossDifference(reference.steps, continued.steps, "Llama TP4 -> " + then.Name(),
                                  /*first_step=*/6),
              1e-5);
  }
}

// Trains 5 of 10 steps under `first` (a checkpoint at step 5), then resumes
// a copy of the checkpoints under each of `then`: the losses of steps 6-10
// must be those of the uninterrupted single-rank run.
TEST_F(LayoutTrainerTest, CheckpointsResumeUnderEveryOtherLayout) {
  const RunOutcome reference = Run(Config(), Layout{1, 1, 1, 0, true});
  ExpectAllOk(reference, "reference");
  const struct {
    Layout first;
    std::vector<Layout> then;
  } cases[] = {
      {Layout{2, 2, 1}, {Layout{1, 1, 4, 0, true}, Layout{1, 4, 1}, Layout{2, 1, 2, 1}}},
      {Layout{1, 1, 2, 0, true}, {Layout{2, 1, 1}}},
      {Layout{1, 1, 2, 2}, {Layout{1, 2, 1}}},
  };
  for (const auto& c : cases) {
    TrainerConfig config = Config();
    config.checkpoint_dir = dir_ + "/first";
    config.checkpoint_interval = 5;
    const RunOutcome first = Run(config, c.first, /*stop_after=*/5);
    for (const absl::Status& s : first.statuses) {
      EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << c.first.Name() << ": " << s;
    }
    for (const Layout& then : c.then) {
      const std::string copy = dir_ + "/resume";
      fs::remove_all(copy);
      fs::copy(config.checkpoint_dir, copy, fs::copy_options::recursive);
      TrainerConfig resumed = Config();
      resumed.checkpoint_dir = copy;
      const RunOutcome run = Run(resumed, then);
      ExpectAllOk(run, then.Name());
      ASSERT_TRUE(run.statuses[0].ok());
      EXPECT_EQ(run.results[0].resumed_from_step, 5) << then.Name();
      const std::string what = c.first.Name() + " -> " + then.Name();
      EXPECT_LE(WorstLossDifference(reference.steps, run.steps, what, /*first_step=*/6), 1e-5)
          << what;
    }
    fs::remove_all(config.checkpoint_dir);
  }
}

// init_from: a new run starts from another run's checkpoint, under any
// layout, at its own step 0. Its initial validation loss is the source's at
// that step (the same weights), and every layout trains it alike.
TEST_F(LayoutTrainerTest, InitFromAnotherRunsCheckpointUnderAnyLayout) {
  TrainerConfig source = Config();
  source.checkpoint_dir = dir_ + "/source";
  source.checkpoint_interval = 5;
  source.keep_checkpoints = 0;
  const RunOutcome first = Run(source, Layout{2, 1, 1});  // a sharded checkpoint
  ExpectAllOk(first, "source");
  const auto source_steps = ByStep(first.steps);
  ASSERT_TRUE(source_steps.count(5) && source_steps.at(5).has_val_loss());
  const double source_val = source_steps.at(5).val_loss();

  auto initial_val = [](const RunOutcome& run) {
    for (const loom::v1::StepMetrics& r : run.steps) {
      if (r.step() == 0 && r.has_val_loss()) return r.val_loss();
    }
    return -1.0;
  };
  std::map<bool, std::vector<loom::v1::StepMetrics>> first_layout;
  for (bool with_optimizer : {false, true}) {
    std::vector<loom::v1::StepMetrics>& reference = first_layout[with_optimizer];
    for (const Layout& layout : {Layout{1, 1, 1, 0, true}, Layout{1, 2, 1}, Layout{1, 1, 2, 1}}) {
      TrainerConfig config = Config();
      config.checkpoint_dir = dir_ + "/init-" + layout.Name() + (with_optimizer ? "-opt" : "");
      config.init_from = CheckpointPath(source.checkpoint_dir, 5);
      config.init_optimizer = with_optimizer;
      config.schedule.total_steps = 4;
      const RunOutcome run = Run(config, layout);
      const std::string what = layout.Name() + (with_optimizer ? " with optimizer" : "");
      ExpectAllOk(run, what);
      ASSERT_TRUE(run.statuses[0].ok());
      EXPECT_EQ(run.results[0].resumed_from_step, 0) << what << ": a new run, not a resume";
      EXPECT_NEAR(initial_val(run), source_val, 1e-5 * source_val) << what;
      if (reference.empty()) {
        reference = run.steps;
      } else {
        EXPECT_LE(WorstLossDifference(reference, run.steps, what), 1e-5) << what;
      }
    }
  }

  // The moments matter: the runs with and without them part after step 1.
  const auto fresh = ByStep(first_layout[false]), kept = ByStep(first_layout[true]);
  ASSERT_TRUE(fresh.count(1) && kept.count(1) && fresh.count(3) && kept.count(3));
  EXPECT_NEAR(fresh.at(1).loss(), kept.at(1).loss(), 1e-6 * fresh.at(1).loss()) << "same weights";
  EXPECT_GT(std::abs(fresh.at(3).loss() - kept.at(3).loss()), 1e-5) << "but not the same updates";

  // What cannot be used fails with IsNoGoodCheckpoint (no restart helps).
  TrainerConfig missing = Config();
  missing.init_from = dir_ + "/no-such-checkpoint";
  const RunOutcome none = Run(missing, Layout{1, 1, 1, 0, true});
  EXPECT_TRUE(IsNoGoodCheckpoint(none.statuses[0])) << none.statuses[0];
  EXPECT_THAT(std::string(none.statuses[0].message()), ::testing::HasSubstr("init_from"));
  TrainerConfig other = Config();
  other.model.n_layer = 2;
  other.init_from = CheckpointPath(source.checkpoint_dir, 5);
  const RunOutcome mismatch = Run(other, Layout{1, 1, 1, 0, true});
  EXPECT_TRUE(IsNoGoodCheckpoint(mismatch.statuses[0])) << mismatch.statuses[0];
  EXPECT_THAT(std::string(mismatch.statuses[0].message()), ::testing::HasSubstr("is for model"));
}

TEST_F(LayoutTrainerTest, ResumeUnderTheSameLayoutIsBitExact) {
  TrainerConfig config = Config();
  const Layout layout{2, 2, 1};
  const RunOutcome uninterrupted = Run(config, layout);
  ExpectAllOk(uninterrupted, "uninterrupted");
  config.checkpoint_dir = dir_ + "/ckpt";
  config.checkpoint_interval = 5;
  const RunOutcome stopped = Run(config, layout, /*stop_after=*/5);
  EXPECT_EQ(stopped.statuses[0].code(), absl::StatusCode::kCancelled) << stopped.statuses[0];
  const RunOutcome resumed = Run(config, layout);
  ExpectAllOk(resumed, "resumed");
  const auto want = ByStep(uninterrupted.steps), got = ByStep(resumed.steps);
  for (int64_t step = 6; step <= 10; ++step) {
    ASSERT_TRUE(got.count(step)) << step;
    EXPECT_EQ(got.at(step).loss(), want.at(step).loss()) << "step " << step;
    EXPECT_EQ(got.at(step).grad_norm(), want.at(step).grad_norm()) << "step " << step;
  }
  EXPECT_EQ(got.at(10).val_loss(), want.at(10).val_loss());
}

// Sharded checkpoints: every rank writes its own shard, and together they
// hold every weight and moment element exactly once (no rank 0 gather).
TEST_F(LayoutTrainerTest, EveryRankWritesItsShardAndEachElementOnce) {
  TrainerConfig config = Config();
  config.checkpoint_dir = dir_ + "/ckpt";
  config.checkpoint_interval = 5;
  const Layout layout{2, 2, 2, 1};
  const RunOutcome run = Run(config, layout, /*stop_after=*/5);
  for (const absl::Status& s : run.statuses) {
    EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  }
  ASSERT_EQ(run.results.size(), 8u);
  const std::string path = CheckpointPath(config.checkpoint_dir, 5);
  absl::StatusOr<VerifiedCheckpoint> verified = VerifyCheckpoint({5, path, 0, false});
  ASSERT_TRUE(verified.ok()) << verified.status();
  const CheckpointManifest& manifest = verified->manifest;
  EXPECT_EQ(manifest.layout, "sharded");
  EXPECT_EQ(manifest.data_parallel, 2);
  EXPECT_EQ(manifest.pipeline_parallel, 2);
  EXPECT_EQ(manifest.tensor_parallel, 2);
  EXPECT_EQ(manifest.zero_stage, 1);
  ASSERT_EQ(manifest.files.size(), 8u);
  int64_t elements = 0, rng_pieces = 0;
  for (const ManifestFile& file : manifest.files) {
    std::ifstream in(path + "/" + file.name, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_EQ(bytes.size(), file.bytes) << file.name;
    absl::StatusOr<ShardView> shard = ParseShard(bytes);
    ASSERT_TRUE(shard.ok()) << file.name << ": " << shard.status();
    for (const ShardTensor& t : shard->header.tensors) {
      if (t.name == "rng/cpu") {
        ++rng_pieces;
        EXPECT_EQ(file.rank, 0);
        continue;
      }
      EXPECT_GE(t.begin, 0) << file.name << " " << t.name;
      elements += t.shape[0];
    }
  }
  int64_t parameters = 0;
  for (const auto& [name, shape] : GptParameterShapes(config.model)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    parameters += n;
  }
  EXPECT_EQ(rng_pieces, 1);
  EXPECT_EQ(elements, 3 * parameters) << "weights and two moments, each element once";
  // And they read back whole.
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(path, config.model);
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (const auto& [name, shape] : GptParameterShapes(config.model)) {
    EXPECT_TRUE(reader->Whole("model/" + name, shape).ok()) << name;
    EXPECT_TRUE(reader->Whole("optimizer/" + name + "/exp_avg_sq", shape).ok()) << name;
    EXPECT_EQ(reader->StepOf(name), 5) << name;
  }
  // The same weights in the replicated format digest alike: a replicated
  // run that resumes it under a new generation rewrites step 5 first.
  absl::StatusOr<ModelDigest> sharded = DigestCheckpointModel(path);
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  EXPECT_EQ(sharded->parameters, parameters);
  TrainerConfig rewrite = config;
  rewrite.generation = 1;
  const RunOutcome replicated = Run(rewrite, Layout{1, 1, 1, 0, true}, /*stop_after=*/1);
  EXPECT_EQ(replicated.statuses[0].code(), absl::StatusCode::kCancelled) << replicated.statuses[0];
  absl::StatusOr<VerifiedCheckpoint> rewritten = VerifyCheckpoint({5, path, 1, false});
  ASSERT_TRUE(rewritten.ok()) << rewritten.status();
  EXPECT_EQ(rewritten->manifest.layout, "replicated");
  absl::StatusOr<ModelDigest> whole = DigestCheckpointModel(path);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->sha256, sharded->sha256);
}

// A rank that cannot write its shard: the checkpoint commits for no rank,
// every rank stops with an error, and the next run starts over (the
// temporary directory is removed, nothing half-written is read).
TEST_F(LayoutTrainerTest, AShardThatFailsCommitsNothing) {
  TrainerConfig config = Config();
  config.checkpoint_dir = dir_ + "/ckpt";
  config.checkpoint_interval = 5;
  const Layout layout{2, 1, 1};
  // After step 3, the file rank 1 will write at step 5 is in the way (a
  // directory with an entry: removing it fails, creating the shard fails).
  const std::string blocker = CheckpointPath(config.checkpoint_dir, 5) + ".tmp-" +
                              std::to_string(::getpid()) + "/" + ShardFileName(1);
  const RunOutcome run = Run(config, layout, 0, [&](const loom::v1::StepMetrics& r) {
    if (r.step() == 3) fs::create_directories(blocker + "/in-the-way");
  });
  EXPECT_EQ(run.statuses[1].code(), absl::StatusCode::kInternal) << run.statuses[1];
  EXPECT_THAT(std::string(run.statuses[1].message()), ::testing::HasSubstr("checkpoint at step 5"));
  EXPECT_FALSE(run.statuses[0].ok());
  EXPECT_FALSE(fs::exists(CheckpointPath(config.checkpoint_dir, 5)));
  EXPECT_TRUE(ListCheckpoints(config.checkpoint_dir).empty());
  const RunOutcome again = Run(config, layout);
  ExpectAllOk(again, "again");
  ASSERT_TRUE(again.statuses[0].ok());
  EXPECT_EQ(again.results[0].resumed_from_step, 0);
  EXPECT_FALSE(fs::exists(blocker));
  EXPECT_TRUE(fs::exists(CheckpointPath(config.checkpoint_dir, 10)));
}

// Fencing under a sharded layout: a newer attempt claims the directory
// mid-run; at the next save point every rank stops as fenced, and nothing
// of that save is written.
TEST_F(LayoutTrainerTest, AStaleAttemptStopsAsFencedOnEveryRank) {
  TrainerConfig config = Config();
  config.checkpoint_dir = dir_ + "/ckpt";
  config.checkpoint_interval = 5;
  config.job_id = "job-3";
  config.generation = 0;
  const Layout layout{2, 1, 1};
  const RunOutcome run = Run(config, layout, 0, [&](const loom::v1::StepMetrics& r) {
    if (r.step() == 3) ASSERT_TRUE(ClaimCheckpointDir(config.checkpoint_dir, {"job-3", 1}).ok());
  });
  for (const absl::Status& s : run.statuses) {
    EXPECT_TRUE(IsCheckpointFenced(s)) << s;
  }
  // The save after step 5 fails at once on every rank; sharded saves are
  // agreed on at the following step boundaries, so training stops within
  // two steps of it.
  EXPECT_GE(run.steps.size(), 5u);
  EXPECT_LE(run.steps.size(), 7u);
  EXPECT_TRUE(ListCheckpoints(config.checkpoint_dir).empty());
  for (const auto& entry : fs::directory_iterator(config.checkpoint_dir)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos)
        << entry.path();
  }
}

TEST_F(LayoutTrainerTest, RefusesWhatALayoutCannotRun) {
  TrainerConfig config = Config();
  config.tensor_parallel = 2;
  // Train() is the replicated engine's door.
  absl::StatusOr<TrainResult> replicated = Train(config, nullptr, {});
  EXPECT_EQ(replicated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(replicated.status().message()), ::testing::HasSubstr("TrainWithGroups"));

  auto refused = [&](TrainerConfig c, const Layout& layout, const std::string& field) {
    const RunOutcome out = Run(c, layout);
    for (const absl::Status& s : out.statuses) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << layout.Name() << ": " << s;
      EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(field)) << s;
    }
  };
  TrainerConfig dropout = Config();
  dropout.model.dropout = 0.1;
  refused(dropout, Layout{2, 1, 1}, "model.dropout");
  TrainerConfig heads = Config();
  heads.model.n_head = 2;
  refused(heads, Layout{4, 1, 1}, "model.n_head");
  TrainerConfig zero3 = Config();
  refused(zero3, Layout{1, 1, 2, 3}, "zero_stage");
  TrainerConfig batch = Config();
  batch.global_batch = 6;  // not a multiple of data 2 x micro_batch 2
  refused(batch, Layout{1, 1, 2, 1}, "global_batch");
}

// CUDA ranks are accepted (deciding needs no GPU); other devices are not.
TEST_F(LayoutTrainerTest, LayoutsRunOnCpuAndCudaDevices) {
  const ParallelLayout tp2{1, 2, 1};
  for (const char* device : {"cpu", "cuda", "cuda:0", "cuda:3"}) {
    TrainerConfig c = Config();
    c.device = device;
    EXPECT_TRUE(ValidateLayoutConfig(c, tp2).ok()) << device << ": "
                                                    << ValidateLayoutConfig(c, tp2);
  }
  for (const char* device : {"mps", "xpu:0", "cudax"}) {
    TrainerConfig c = Config();
    c.device = device;
    const absl::Status s = ValidateLayoutConfig(c, tp2);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << device;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("device: ")) << s;
  }
}

}  // namespace
}  // namespace loom::engine
