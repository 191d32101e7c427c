// Mixed precision and activation checkpointing through the training loop
// (issue 6): bf16 trains like fp32, fp16 is refused on CPU, checkpointing
// changes no parameter.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "gtest/gtest.h"
#include "common/formats/data.h"
#include "worker/engine/gpt.h"
#include "worker/engine/trainer.h"

namespace loom::engine {
namespace {

namespace fs = std::filesystem;

// Byte-level text of short random sentences: learnable structure, so the
// loss falls within a few dozen steps.
std::vector<uint16_t> MakeText(uint32_t seed, size_t bytes) {
  static const std::vector<std::string> kWords = {"the cat ", "a dog ",   "sees ",
                                                  "likes ",   "the moon ", "a letter. "};
  std::mt19937 rng(seed);
  std::string text;
  while (text.size() < bytes) {
    text += kWords[std::uniform_int_distribution<size_t>(0, kWords.size() - 1)(rng)];
  }
  return std::vector<uint16_t>(text.begin(), text.begin() + bytes);
}

struct Outcome {
  absl::StatusOr<TrainResult> result = absl::UnknownError("not run");
  std::vector<loom::v1::StepMetrics> steps;
  std::vector<torch::Tensor> parameters;
};

class PrecisionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    char pattern[] = "/tmp/loom_precision_testXXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    ASSERT_TRUE(WriteShard(dir_ + "/train_000000.bin", MakeText(1, 40000)).ok());
  }
  void TearDown() override { fs::remove_all(dir_); }

  TrainerConfig SmallConfig() const {
    TrainerConfig c;
    c.model.n_layer = 2;
    c.model.n_head = 2;
    c.model.d_model = 32;
    c.model.seq_len = 32;
    c.model.vocab_size = 256;
    c.optimizer.lr = 3e-3;
    c.schedule.total_steps = 30;
    c.schedule.warmup_steps = 2;
    c.global_batch = 8;
    c.micro_batch = 4;
    c.seed = 1234;
    c.train_shards = {dir_ + "/train_000000.bin"};
    return c;
  }

  static Outcome RunTraining(const TrainerConfig& config) {
    Outcome out;
    TrainerCallbacks callbacks;
    callbacks.on_step = [&out](const loom::v1::StepMetrics& r) { out.steps.push_back(r); };
    callbacks.on_finish = [&out](const torch::nn::Module& model) {
      for (const torch::Tensor& p : model.parameters()) out.parameters.push_back(p.clone());
    };
    out.result = Train(config, nullptr, callbacks);
    return out;
  }

  std::string dir_;
};

TEST_F(PrecisionTest, Bf16ConvergesAndStartsWhereFp32Does) {
  TrainerConfig config = SmallConfig();
  const Outcome fp32 = RunTraining(config);
  config.model.precision = Precision::kBf16;
  const Outcome bf16 = RunTraining(config);
  ASSERT_TRUE(fp32.result.ok()) << fp32.result.status();
  ASSERT_TRUE(bf16.result.ok()) << bf16.result.status();
  ASSERT_EQ(bf16.steps.size(), 30u);
  // Same weights, same batch: the first loss differs only by bf16 rounding
  // inside the blocks (8 mantissa bits, ~0.4% per product, averaged out).
  const double first32 = fp32.steps.front().loss(), first16 = bf16.steps.front().loss();
  EXPECT_NEAR(first16, first32, 0.01 * first32);
  // And it is not silently fp32: the rounding shows.
  EXPECT_NE(first16, first32);
  // It trains: by the end the loss has fallen as far as fp32's, within 5%.
  const double last32 = fp32.steps.back().loss(), last16 = bf16.steps.back().loss();
  std::cout << "first-step loss fp32 " << first32 << " bf16 " << first16 << "; step 30 fp32 "
            << last32 << " bf16 " << last16 << std::endl;
  EXPECT_LT(last16, 0.6 * first16);
  EXPECT_NEAR(last16, last32, 0.05 * last32);
  for (const loom::v1::StepMetrics& r : bf16.steps) {
    EXPECT_TRUE(std::isfinite(r.loss()));
    EXPECT_EQ(r.loss_scale(), 1.0);
  }
  // Master weights stay fp32.
  for (const torch::Tensor& p : bf16.parameters) EXPECT_EQ(p.scalar_type(), torch::kFloat);
}

TEST_F(PrecisionTest, Fp16IsRefusedOnCpu) {
  TrainerConfig config = SmallConfig();
  config.model.precision = Precision::kFp16;
  const Outcome out = RunTraining(config);
  ASSERT_FALSE(out.result.ok());
  EXPECT_EQ(out.result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out.result.status().message().find("precision: fp16 needs a GPU"), std::string::npos)
      << out.result.status();
}

TEST_F(PrecisionTest, BadCheckpointingSettingIsRefused) {
  TrainerConfig config = SmallConfig();
  config.model.activation_checkpointing = -2;
  const Outcome out = RunTraining(config);
  ASSERT_FALSE(out.result.ok());
  EXPECT_EQ(out.result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out.result.status().message().find("activation_checkpointing"), std::string::npos);
}

// With dropout on (the trainer reseeds the generator every step), a run with
// checkpointing reaches the same parameters, bit for bit, as one without.
TEST_F(PrecisionTest, CheckpointingChangesNoParameter) {
  TrainerConfig config = SmallConfig();
  config.schedule.total_steps = 6;
  config.model.n_layer = 3;
  config.model.dropout = 0.1;
  const Outcome plain = RunTraining(config);
  config.model.activation_checkpointing = kActivationCheckpointingSqrt;
  const Outcome ckpt = RunTraining(config);
  ASSERT_TRUE(plain.result.ok()) << plain.result.status();
  ASSERT_TRUE(ckpt.result.ok()) << ckpt.result.status();
  ASSERT_EQ(plain.parameters.size(), ckpt.parameters.size());
  for (size_t i = 0; i < plain.parameters.size(); ++i) {
    EXPECT_TRUE(torch::equal(plain.parameters[i], ckpt.parameters[i])) << "parameter " << i;
  }
  ASSERT_EQ(plain.steps.size(), ckpt.steps.size());
  for (size_t i = 0; i < plain.steps.size(); ++i) {
    EXPECT_EQ(plain.steps[i].loss(), ckpt.steps[i].loss()) << "step " << i + 1;
  }
}

}  // namespace
}  // namespace loom::engine
