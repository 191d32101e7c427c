#include "worker/engine/optimizer.h"

#include <cmath>
#include <vector>

#include <torch/torch.h>

#include "gtest/gtest.h"
#include "worker/engine/gpt.h"

namespace loom::engine {
namespace {

// A module with one decayed (2-D) and one non-decayed (1-D) parameter.
struct TwoParams : torch::nn::Module {
  TwoParams() {
    weight = register_parameter("weight", torch::tensor({{1.0f, -2.0f}, {0.5f, 3.0f}}));
    bias = register_parameter("bias", torch::tensor({0.25f, -1.0f}));
  }
  torch::Tensor weight, bias;
};

// Reference AdamW (Loshchilov & Hutter 2019, Algorithm 2, in PyTorch's
// formulation) on one scalar, in double precision.
struct ScalarAdamW {
  double lr, beta1, beta2, eps, weight_decay;
  double m = 0, v = 0;
  int t = 0;
  double Step(double p, double g) {
    ++t;
    p *= 1 - lr * weight_decay;
    m = beta1 * m + (1 - beta1) * g;
    v = beta2 * v + (1 - beta2) * g * g;
    const double m_hat = m / (1 - std::pow(beta1, t));
    const double v_hat = v / (1 - std::pow(beta2, t));
    return p - lr * m_hat / (std::sqrt(v_hat) + eps);
  }
};

OptimizerConfig TestConfig() {
  OptimizerConfig c;
  c.lr = 0.1;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.eps = 1e-8;
  c.weight_decay = 0.1;
  return c;
}

TEST(AdamWTest, TwoStepsMatchHandComputedReference) {
  TwoParams module;
  const OptimizerConfig config = TestConfig();
  auto optimizer = MakeAdamW(module, config);
  const std::vector<std::vector<float>> weight_grads = {{0.5f, -1.0f, 2.0f, 0.1f},
                                                        {-0.3f, 0.2f, 1.0f, -4.0f}};
  const std::vector<std::vector<float>> bias_grads = {{1.0f, -0.5f}, {0.25f, 0.75f}};
  std::vector<double> weight_ref = {1.0, -2.0, 0.5, 3.0}, bias_ref = {0.25, -1.0};
  std::vector<ScalarAdamW> weight_opt(4, {config.lr, config.beta1, config.beta2, config.eps,
                                         config.weight_decay});
  std::vector<ScalarAdamW> bias_opt(2, {config.lr, config.beta1, config.beta2, config.eps, 0.0});
  for (int step = 0; step < 2; ++step) {
    module.weight.mutable_grad() = torch::tensor(weight_grads[step]).view({2, 2});
    module.bias.mutable_grad() = torch::tensor(bias_grads[step]);
    optimizer->step();
    for (int i = 0; i < 4; ++i) weight_ref[i] = weight_opt[i].Step(weight_ref[i], weight_grads[step][i]);
    for (int i = 0; i < 2; ++i) bias_ref[i] = bias_opt[i].Step(bias_ref[i], bias_grads[step][i]);
    torch::Tensor w = module.weight.view({-1});
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(w[i].item<double>(), weight_ref[i], 1e-6) << step;
    for (int i = 0; i < 2; ++i) EXPECT_NEAR(module.bias[i].item<double>(), bias_ref[i], 1e-6);
  }
  // First step, by hand: with m_hat = g and v_hat = g^2 the update is
  // lr * sign(g), so weight[0] = 1 * (1 - 0.1 * 0.1) - 0.1 = 0.89 before the
  // second step; the reference above agrees, this pins the arithmetic.
  ScalarAdamW one{0.1, 0.9, 0.95, 1e-8, 0.1};
  EXPECT_NEAR(one.Step(1.0, 0.5), 0.89, 1e-7);
}

TEST(AdamWTest, WeightDecayOnlyOnDecayGroup) {
  TwoParams module;
  auto optimizer = MakeAdamW(module, TestConfig());
  ASSERT_EQ(optimizer->param_groups().size(), 2u);
  ASSERT_EQ(optimizer->param_groups()[0].params().size(), 1u);
  EXPECT_TRUE(optimizer->param_groups()[0].params()[0].is_same(module.weight));
  EXPECT_TRUE(optimizer->param_groups()[1].params()[0].is_same(module.bias));
  // With zero gradients the Adam term is 0: only decay moves the weights.
  const torch::Tensor weight_before = module.weight.detach().clone();
  const torch::Tensor bias_before = module.bias.detach().clone();
  module.weight.mutable_grad() = torch::zeros_like(module.weight);
  module.bias.mutable_grad() = torch::zeros_like(module.bias);
  optimizer->step();
  EXPECT_TRUE(torch::allclose(module.weight, weight_before * (1 - 0.1 * 0.1)));
  EXPECT_TRUE(torch::equal(module.bias, bias_before));
}

TEST(AdamWTest, GptGroupsSplitMatricesFromVectors) {
  torch::manual_seed(0);
  GptConfig c;
  c.n_layer = 2;
  c.d_model = 16;
  c.n_head = 2;
  c.seq_len = 8;
  c.vocab_size = 32;
  Gpt model(c);
  auto optimizer = MakeAdamW(*model, TestConfig());
  const auto& groups = optimizer->param_groups();
  ASSERT_EQ(groups.size(), 2u);
  int64_t decay = 0, no_decay = 0;
  for (const auto& p : groups[0].params()) {
    EXPECT_EQ(p.dim(), 2);
    decay += p.numel();
  }
  for (const auto& p : groups[1].params()) {
    EXPECT_EQ(p.dim(), 1);
    no_decay += p.numel();
  }
  const int64_t d = c.d_model;
  // wte, wpe, and per block c_attn 3d^2, attn c_proj d^2, c_fc 4d^2, mlp c_proj 4d^2.
  EXPECT_EQ(decay, c.vocab_size * d + c.seq_len * d + c.n_layer * 12 * d * d);
  EXPECT_EQ(decay + no_decay, GptParameterCount(c));
  EXPECT_DOUBLE_EQ(static_cast<const torch::optim::AdamWOptions&>(groups[0].options()).weight_decay(), 0.1);
  EXPECT_DOUBLE_EQ(static_cast<const torch::optim::AdamWOptions&>(groups[1].options()).weight_decay(), 0.0);
}

TEST(AdamWTest, SetLearningRateAppliesToAllGroups) {
  TwoParams module;
  auto optimizer = MakeAdamW(module, TestConfig());
  SetLearningRate(*optimizer, 0.0125);
  for (auto& group : optimizer->param_groups()) EXPECT_DOUBLE_EQ(group.options().get_lr(), 0.0125);
}

TEST(LearningRateTest, WarmupThenCosine) {
  ScheduleConfig s;
  s.total_steps = 110;
  s.warmup_steps = 10;
  s.min_lr_ratio = 0.1;
  const double max_lr = 1.0;
  EXPECT_DOUBLE_EQ(LearningRateAt(s, max_lr, 0), 0.1);   // warmup start: 1/10
  EXPECT_DOUBLE_EQ(LearningRateAt(s, max_lr, 4), 0.5);   // warmup middle: 5/10
  EXPECT_DOUBLE_EQ(LearningRateAt(s, max_lr, 9), 1.0);   // warmup end
  EXPECT_DOUBLE_EQ(LearningRateAt(s, max_lr, 10), 1.0);  // decay start
  EXPECT_NEAR(LearningRateAt(s, max_lr, 60), 0.55, 1e-12);  // cosine midpoint
  EXPECT_NEAR(LearningRateAt(s, max_lr, 35), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI / 4)), 1e-12);
  EXPECT_DOUBLE_EQ(LearningRateAt(s, max_lr, 110), 0.1);  // final
  EXPECT_DOUBLE_EQ(LearningRateAt(s, max_lr, 1000), 0.1);
  for (int64_t step = 10; step < 110; ++step) {
    EXPECT_GE(LearningRateAt(s, max_lr, step), LearningRateAt(s, max_lr, step + 1));
  }
}

TEST(LearningRateTest, NoWarmupStartsAtMax) {
  ScheduleConfig s;
  s.total_steps = 4;
  s.warmup_steps = 0;
  s.min_lr_ratio = 0.0;
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 2.0, 0), 2.0);
  EXPECT_NEAR(LearningRateAt(s, 2.0, 2), 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 2.0, 4), 0.0);
}

TEST(ClipGradNormTest, ScalesToMaxNormAndReturnsPreClipNorm) {
  torch::Tensor a = torch::zeros({1}, torch::requires_grad());
  torch::Tensor b = torch::zeros({1}, torch::requires_grad());
  torch::Tensor c = torch::zeros({1}, torch::requires_grad());  // no grad
  a.mutable_grad() = torch::tensor({3.0f});
  b.mutable_grad() = torch::tensor({4.0f});
  EXPECT_NEAR(ClipGradNorm({a, b, c}, 1.0), 5.0, 1e-6);
  EXPECT_NEAR(a.grad().item<double>(), 0.6, 1e-6);
  EXPECT_NEAR(b.grad().item<double>(), 0.8, 1e-6);
  EXPECT_FALSE(c.grad().defined());
  // Below the threshold, or with clipping disabled, nothing changes.
  EXPECT_NEAR(ClipGradNorm({a, b}, 10.0), 1.0, 1e-6);
  EXPECT_NEAR(a.grad().item<double>(), 0.6, 1e-6);
  a.mutable_grad() = torch::tensor({30.0f});
  EXPECT_NEAR(ClipGradNorm({a, b}, 0.0), std::sqrt(900.0 + 0.64), 1e-4);
  EXPECT_NEAR(a.grad().item<double>(), 30.0, 1e-6);
}

}  // namespace
}  // namespace loom::engine
