// Mixed precision and activation checkpointing through the training loop:
// bf16 trains like fp32, fp16 is refused on CPU, checkpointing
// changes no parameter.
#include <unistd.h>

#include <algorithm>
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

// The LM head's products in the blocks' precision: where HeadMatmulDtype
// sends each setting.
TEST(HeadPrecision, MatmulDtypeFollowsThePrecisionOnTheGpuAndStaysFp32OnTheCpu) {
  GptConfig c;
  c.precision = Precision::kBf16;
  EXPECT_EQ(HeadMatmulDtype(c, /*on_cuda=*/true), torch::kBFloat16);
  EXPECT_EQ(HeadMatmulDtype(c, /*on_cuda=*/false), torch::kFloat);
  c.precision = Precision::kFp16;
  EXPECT_EQ(HeadMatmulDtype(c, true), torch::kHalf);
  c.precision = Precision::kFp32;
  EXPECT_EQ(HeadMatmulDtype(c, true), torch::kFloat);
  c.precision = Precision::kBf16;
  c.head_precision = HeadPrecision::kFp32;
  EXPECT_EQ(HeadMatmulDtype(c, true), torch::kFloat);
  c.head_precision = HeadPrecision::kBlocks;
  EXPECT_EQ(HeadMatmulDtype(c, false), torch::kBFloat16);
  c.precision = Precision::kFp32;
  EXPECT_EQ(HeadMatmulDtype(c, false), torch::kFloat);
}

torch::Tensor Dense(const torch::Tensor& t) { return t.is_sparse() ? t.to_dense() : t; }

// Largest |a - b| relative to the largest |b|.
double RelativeError(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-30);
  return (a - b).to(torch::kDouble).abs().max().item<double>() / scale;
}

// The bf16 head (as a GPU runs it) against the fp32 head, on the CPU: one
// small model (GPT-2 shape, tied head; then Llama's, untied), same weights,
// same batch, bf16 blocks in both. The loss agrees to 5e-3 relative and
// every parameter's gradient to 3e-2 of its largest entry: bf16 keeps 8
// significant bits, so each logit carries up to a few 1e-3 of relative
// rounding, and the head's gradients (the tied embedding's above all) more
// where entries cancel. A wrong dtype, scale or missing term is off by far
// more. On the CPU, kAuto keeps the fp32 head bit for bit.
TEST(HeadPrecision, Bf16HeadMatchesTheFp32HeadOnASmallModel) {
  torch::set_num_threads(1);
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "llama" : "gpt2");
    GptConfig c;
    c.n_layer = 2;
    c.n_head = 4;
    c.d_model = 64;
    c.seq_len = 32;
    c.vocab_size = 512;
    c.precision = Precision::kBf16;
    if (llama) {
      c.n_kv_head = 2;
      c.gated_mlp = true;
      c.bias = false;
      c.rms_norm = true;
      c.rotary = true;
      c.tied_embeddings = false;
    }
    torch::manual_seed(5);
    const torch::Tensor idx = torch::randint(c.vocab_size, {4, c.seq_len}, torch::kLong);
    const torch::Tensor targets = torch::randint(c.vocab_size, {4, c.seq_len}, torch::kLong);
    struct Run {
      double loss;
      std::vector<torch::Tensor> grads;
    };
    auto run = [&](HeadPrecision head) {
      GptConfig config = c;
      config.head_precision = head;
      torch::manual_seed(1234);
      Gpt model(config);
      torch::Tensor loss = model->Loss(idx, targets);
      loss.backward();
      Run r{loss.item<double>(), {}};
      for (const torch::Tensor& p : model->parameters()) r.grads.push_back(p.grad().clone());
      return r;
    };
    const Run fp32 = run(HeadPrecision::kFp32);
    const Run bf16 = run(HeadPrecision::kBlocks);
    const Run automatic = run(HeadPrecision::kAuto);
    std::cout << (llama ? "llama" : "gpt2") << ": loss with the fp32 head " << fp32.loss
              << ", bf16 head " << bf16.loss << std::endl;
    EXPECT_NEAR(bf16.loss, fp32.loss, 5e-3 * fp32.loss);
    EXPECT_NE(bf16.loss, fp32.loss);  // the head really ran in bf16
    ASSERT_EQ(bf16.grads.size(), fp32.grads.size());
    double worst = 0;
    for (size_t i = 0; i < fp32.grads.size(); ++i) {
      EXPECT_EQ(bf16.grads[i].scalar_type(), torch::kFloat);
      const double e = RelativeError(Dense(bf16.grads[i]), Dense(fp32.grads[i]));
      worst = std::max(worst, e);
      EXPECT_LT(e, 3e-2) << "parameter " << i;
    }
    std::cout << "  worst relative gradient difference " << worst << std::endl;
    EXPECT_EQ(automatic.loss, fp32.loss);
    for (size_t i = 0; i < fp32.grads.size(); ++i) {
      EXPECT_TRUE(torch::equal(Dense(automatic.grads[i]), Dense(fp32.grads[i])))
          << "parameter " << i;
    }
  }
}

// And it trains like the fp32 head: 30 steps of the small model with bf16
// blocks, the head in bf16 against the head in fp32, end within 5%.
TEST_F(PrecisionTest, Bf16HeadTrainsLikeTheFp32Head) {
  TrainerConfig config = SmallConfig();
  config.model.precision = Precision::kBf16;
  const Outcome fp32_head = RunTraining(config);
  config.model.head_precision = HeadPrecision::kBlocks;
  const Outcome bf16_head = RunTraining(config);
  ASSERT_TRUE(fp32_head.result.ok()) << fp32_head.result.status();
  ASSERT_TRUE(bf16_head.result.ok()) << bf16_head.result.status();
  ASSERT_EQ(bf16_head.steps.size(), 30u);
  const double first = bf16_head.steps.front().loss(), last = bf16_head.steps.back().loss();
  const double last_fp32 = fp32_head.steps.back().loss();
  std::cout << "step 30 loss: fp32 head " << last_fp32 << ", bf16 head " << last << std::endl;
  EXPECT_LT(last, 0.6 * first);
  EXPECT_NEAR(last, last_fp32, 0.05 * last_fp32);
  for (const torch::Tensor& p : bf16_head.parameters) EXPECT_EQ(p.scalar_type(), torch::kFloat);
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
