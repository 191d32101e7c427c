#include "worker/engine/gpt.h"

#include <cmath>
#include <string>

#include <torch/torch.h>

#include "gtest/gtest.h"
#include "worker/engine/autocast.h"

namespace loom::engine {
namespace {

GptConfig TinyConfig() {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 32;
  c.seq_len = 16;
  c.vocab_size = 64;
  c.dropout = 0.0;
  return c;
}

int64_t CountParameters(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const torch::Tensor& p : module.parameters()) n += p.numel();
  return n;
}

class GptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    torch::manual_seed(7);
  }
};

TEST_F(GptTest, ForwardShapes) {
  Gpt model(TinyConfig());
  torch::Tensor idx = torch::randint(0, 64, {3, 5}, torch::kLong);
  torch::Tensor logits = model->forward(idx);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 5, 64}));
  EXPECT_EQ(logits.scalar_type(), torch::kFloat);
  torch::Tensor full = model->forward(torch::randint(0, 64, {2, 16}, torch::kLong));
  EXPECT_EQ(full.sizes(), (std::vector<int64_t>{2, 16, 64}));
  EXPECT_THROW(model->forward(torch::zeros({1, 17}, torch::kLong)), c10::Error);
}

TEST_F(GptTest, ParameterCountMatchesClosedForm) {
  for (const auto& [layers, heads, d, seq, vocab] :
       std::vector<std::tuple<int, int, int, int, int>>{
           {2, 2, 32, 16, 64}, {1, 1, 8, 4, 10}, {3, 4, 48, 32, 256}}) {
    GptConfig c;
    c.n_layer = layers;
    c.n_head = heads;
    c.d_model = d;
    c.seq_len = seq;
    c.vocab_size = vocab;
    Gpt model(c);
    EXPECT_EQ(CountParameters(*model), GptParameterCount(c))
        << "L=" << layers << " d=" << d << " s=" << seq << " V=" << vocab;
  }
}

TEST_F(GptTest, ClosedFormMatchesGpt2Small) {
  // GPT-2 small (124M): nanoGPT reports 123.65M parameters excluding the
  // 1024 x 768 position embedding, i.e. 124,439,808 in total.
  GptConfig c;
  c.n_layer = 12;
  c.n_head = 12;
  c.d_model = 768;
  c.seq_len = 1024;
  c.vocab_size = 50257;
  EXPECT_EQ(GptParameterCount(c), 124'439'808);
}

TEST_F(GptTest, HeadIsTiedToTokenEmbedding) {
  Gpt model(TinyConfig());
  for (const auto& item : model->named_parameters()) {
    EXPECT_EQ(item.key().find("head"), std::string::npos) << item.key();
  }
  // The logits are linear in wte through the head: its gradient gets a
  // contribution even for tokens that never occur in the input.
  torch::Tensor idx = torch::zeros({1, 4}, torch::kLong);
  model->forward(idx).select(2, 5).sum().backward();
  torch::Tensor wte_grad = model->named_parameters()["wte.weight"].grad();
  EXPECT_GT(wte_grad[5].abs().sum().item<float>(), 0.0f);
}

TEST_F(GptTest, IsCausal) {
  Gpt model(TinyConfig());
  model->eval();
  torch::Tensor idx = torch::randint(0, 64, {2, 16}, torch::kLong);
  torch::Tensor changed = idx.clone();
  const int64_t t = 6;
  changed.index_put_({torch::indexing::Slice(), t},
                     (idx.index({torch::indexing::Slice(), t}) + 1) % 64);
  torch::NoGradGuard no_grad;
  torch::Tensor a = model->forward(idx);
  torch::Tensor b = model->forward(changed);
  using torch::indexing::Slice;
  const float before = (a.index({Slice(), Slice(0, t)}) - b.index({Slice(), Slice(0, t)}))
                           .abs().max().item<float>();
  EXPECT_LE(before, 1e-6f);
  // Position t itself sees the change.
  EXPECT_GE((a.index({Slice(), t}) - b.index({Slice(), t})).abs().max().item<float>(), 1e-4f);
}

TEST_F(GptTest, InitialisationFollowsGpt2) {
  GptConfig c;
  c.n_layer = 4;
  c.n_head = 4;
  c.d_model = 128;
  c.seq_len = 64;
  c.vocab_size = 512;
  Gpt model(c);
  const double residual_std = 0.02 / std::sqrt(2.0 * c.n_layer);
  for (const auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    const torch::Tensor& p = item.value();
    if (name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0) {
      EXPECT_EQ(p.abs().max().item<float>(), 0.0f) << name;
    } else if (name.find("c_proj.weight") != std::string::npos) {
      EXPECT_NEAR(p.std().item<double>(), residual_std, 0.1 * residual_std) << name;
    } else if (p.dim() >= 2) {
      EXPECT_NEAR(p.std().item<double>(), 0.02, 0.002) << name;
      EXPECT_NEAR(p.mean().item<double>(), 0.0, 0.002) << name;
    } else {
      EXPECT_EQ((p - 1).abs().max().item<float>(), 0.0f) << name;  // LayerNorm gains
    }
  }
}

TEST_F(GptTest, SameSeedSameWeights) {
  torch::manual_seed(3);
  Gpt a(TinyConfig());
  torch::manual_seed(3);
  Gpt b(TinyConfig());
  auto pa = a->parameters(), pb = b->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i]));
}

TEST_F(GptTest, UniformLogitsGiveLogVocabLoss) {
  torch::Tensor logits = torch::zeros({2, 3, 64});
  torch::Tensor targets = torch::randint(0, 64, {2, 3}, torch::kLong);
  EXPECT_NEAR(LanguageModelLoss(logits, targets).item<double>(), std::log(64.0), 1e-6);
}

TEST_F(GptTest, ValidatesConfig) {
  GptConfig c = TinyConfig();
  EXPECT_TRUE(ValidateGptConfig(c).ok());
  c.n_head = 3;  // 32 % 3 != 0
  EXPECT_EQ(ValidateGptConfig(c).code(), absl::StatusCode::kInvalidArgument);
  c = TinyConfig();
  c.vocab_size = 0;
  EXPECT_EQ(ValidateGptConfig(c).code(), absl::StatusCode::kInvalidArgument);
  c = TinyConfig();
  c.dropout = 1.0;
  EXPECT_EQ(ValidateGptConfig(c).code(), absl::StatusCode::kInvalidArgument);
  c = TinyConfig();
  c.activation_checkpointing = -2;
  EXPECT_EQ(ValidateGptConfig(c).code(), absl::StatusCode::kInvalidArgument);
  for (int ok : {kActivationCheckpointingSqrt, 0, 1, 7}) {
    c.activation_checkpointing = ok;
    EXPECT_TRUE(ValidateGptConfig(c).ok()) << ok;
  }
  c = TinyConfig();
  c.precision = Precision::kBf16;
  EXPECT_TRUE(ValidateGptConfig(c).ok());
  c.precision = Precision::kFp16;
  const absl::Status fp16 = ValidateGptConfig(c);
  EXPECT_EQ(fp16.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fp16.message().rfind("precision: fp16 needs a GPU", 0), 0u) << fp16;
}

TEST_F(GptTest, PrecisionNames) {
  EXPECT_STREQ(PrecisionName(Precision::kFp32), "fp32");
  EXPECT_STREQ(PrecisionName(Precision::kBf16), "bf16");
  EXPECT_STREQ(PrecisionName(Precision::kFp16), "fp16");
}

// bf16 runs the blocks in bf16 and leaves everything around them fp32: the
// hidden states are fp32, close to fp32's, but not equal to them; autocast is
// off again afterwards.
TEST_F(GptTest, Bf16HiddenIsFp32AndCloseToFp32) {
  GptConfig c = TinyConfig();
  torch::manual_seed(5);
  Gpt fp32(c);
  c.precision = Precision::kBf16;
  torch::manual_seed(5);
  Gpt bf16(c);
  const torch::Tensor idx = torch::randint(0, 64, {2, 16}, torch::kLong);
  const torch::Tensor h32 = fp32->Hidden(idx), h16 = bf16->Hidden(idx);
  EXPECT_EQ(h16.scalar_type(), torch::kFloat);
  const double diff = (h16 - h32).abs().max().item<double>();
  EXPECT_GT(diff, 0.0);
  EXPECT_LT(diff, 0.05 * h32.abs().max().item<double>());
  EXPECT_FALSE(GetAutocastState(c10::kCPU).enabled);
  // A matmul after the forward is plain fp32 again.
  EXPECT_EQ(torch::matmul(h16, h16.transpose(1, 2)).scalar_type(), torch::kFloat);
}

// Model-level training: the same AdamW steps on one batch from the same
// weights. bf16's first loss is fp32's to within bf16 rounding, and it
// converges as fp32 does; gradients and weights stay fp32.
TEST_F(GptTest, Bf16TrainsLikeFp32) {
  auto train = [](Precision precision) {
    GptConfig c = TinyConfig();
    c.precision = precision;
    torch::manual_seed(5);
    Gpt model(c);
    torch::manual_seed(6);
    const torch::Tensor data = torch::randint(0, 64, {4, 17}, torch::kLong);
    const torch::Tensor x = data.narrow(1, 0, 16), y = data.narrow(1, 1, 16);
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
    std::vector<double> losses;
    for (int step = 0; step < 40; ++step) {
      optimizer.zero_grad();
      torch::Tensor loss = model->Loss(x, y);
      loss.backward();
      for (const torch::Tensor& p : model->parameters()) {
        EXPECT_EQ(p.grad().scalar_type(), torch::kFloat);
      }
      optimizer.step();
      losses.push_back(loss.item<double>());
    }
    return losses;
  };
  const std::vector<double> fp32 = train(Precision::kFp32);
  const std::vector<double> bf16 = train(Precision::kBf16);
  EXPECT_NEAR(bf16[0], fp32[0], 0.005 * fp32[0]);
  EXPECT_NE(bf16[0], fp32[0]);
  EXPECT_LT(bf16.back(), 0.5 * bf16[0]);
  EXPECT_NEAR(bf16.back(), fp32.back(), 0.1 * fp32.back() + 0.05);
}

}  // namespace
}  // namespace loom::engine
