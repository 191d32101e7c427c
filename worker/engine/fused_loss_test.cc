#include "worker/engine/fused_loss.h"

#include <cmath>
#include <limits>
#include <vector>

#include <torch/nn/functional/loss.h>
#include <torch/torch.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::engine {
namespace {

// Largest |a - b| relative to the largest |b| (a scale-free error).
double RelativeError(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-30);
  return (a - b).abs().max().item<double>() / scale;
}

struct Case {
  int64_t rows;
  int64_t vocab;
  int64_t d;
};

struct Reference {
  torch::Tensor loss, grad_hidden, grad_weight;
};

// The unfused loss through LibTorch's own cross_entropy, in double, and its
// gradients, scaled by `upstream`.
Reference UnfusedReference(const torch::Tensor& hidden, const torch::Tensor& weight,
                           const torch::Tensor& targets, double upstream) {
  torch::Tensor h = hidden.to(torch::kDouble).detach().requires_grad_(true);
  torch::Tensor w = weight.to(torch::kDouble).detach().requires_grad_(true);
  torch::Tensor logits = torch::matmul(h, w.t());
  torch::Tensor loss = torch::nn::functional::cross_entropy(
      logits.reshape({-1, w.size(0)}), targets.reshape({-1}));
  (loss * upstream).backward();
  return {loss.detach(), h.grad(), w.grad()};
}

class FusedLossTest : public ::testing::TestWithParam<int64_t /*chunk_rows*/> {};

TEST_P(FusedLossTest, MatchesUnfusedLossAndGradients) {
  torch::manual_seed(7);
  for (const Case& c : {Case{37, 1003, 24}, Case{64, 256, 16}, Case{5, 50304, 32}}) {
    SCOPED_TRACE(testing::Message() << "rows " << c.rows << " vocab " << c.vocab);
    // Logits of realistic spread (|z| up to ~10), as in training.
    torch::Tensor hidden = torch::randn({c.rows, c.d}).requires_grad_(true);
    torch::Tensor weight = (torch::randn({c.vocab, c.d}) * 0.5).requires_grad_(true);
    torch::Tensor targets = torch::randint(c.vocab, {c.rows}, torch::kLong);
    const double upstream = 0.25;  // as after dividing by accumulation steps
    FusedLossOptions options;
    options.chunk_rows = GetParam();
    torch::Tensor loss = FusedLinearCrossEntropy(hidden, weight, targets, options);
    (loss * upstream).backward();
    const Reference ref = UnfusedReference(hidden, weight, targets, upstream);
    EXPECT_NEAR(loss.item<double>(), ref.loss.item<double>(), 1e-5 * ref.loss.item<double>());
    EXPECT_LT(RelativeError(hidden.grad().to(torch::kDouble), ref.grad_hidden), 1e-5);
    EXPECT_LT(RelativeError(weight.grad().to(torch::kDouble), ref.grad_weight), 1e-5);
  }
}

// 0 = automatic chunking (one chunk for these sizes); 1 = row by row; 7
// leaves a ragged last chunk.
INSTANTIATE_TEST_SUITE_P(ChunkRows, FusedLossTest, ::testing::Values(0, 1, 7));

TEST(FusedLoss, LeadingDimensionsAreFlattenedAndGradientsKeepTheirShape) {
  torch::manual_seed(3);
  torch::Tensor hidden = torch::randn({2, 5, 8}).requires_grad_(true);
  torch::Tensor weight = torch::randn({40, 8}).requires_grad_(true);
  torch::Tensor targets = torch::randint(40, {2, 5}, torch::kLong);
  torch::Tensor loss = FusedLinearCrossEntropy(hidden, weight, targets);
  loss.backward();
  EXPECT_EQ(hidden.grad().sizes(), hidden.sizes());
  const Reference ref = UnfusedReference(hidden, weight, targets, 1.0);
  EXPECT_NEAR(loss.item<double>(), ref.loss.item<double>(), 1e-5);
  EXPECT_LT(RelativeError(hidden.grad().to(torch::kDouble), ref.grad_hidden), 1e-5);
}

TEST(FusedLoss, GradientAccumulatesWithOtherUsesOfTheWeight) {
  // Tied embeddings: the same weight also feeds an embedding lookup.
  torch::manual_seed(5);
  torch::Tensor weight = torch::randn({30, 6}).requires_grad_(true);
  torch::Tensor ids = torch::randint(30, {12}, torch::kLong);
  torch::Tensor targets = torch::randint(30, {12}, torch::kLong);
  torch::Tensor hidden = torch::tanh(weight.index_select(0, ids));
  FusedLossOptions options;
  options.chunk_rows = 5;
  FusedLinearCrossEntropy(hidden, weight, targets, options).backward();
  const torch::Tensor fused_grad = weight.grad().clone();

  torch::Tensor w = weight.detach().to(torch::kDouble).requires_grad_(true);
  torch::Tensor h = torch::tanh(w.index_select(0, ids));
  torch::nn::functional::cross_entropy(torch::matmul(h, w.t()), targets).backward();
  EXPECT_LT(RelativeError(fused_grad.to(torch::kDouble), w.grad()), 1e-5);
}

TEST(FusedLoss, WithoutGradModeComputesOnlyTheLoss) {
  torch::manual_seed(9);
  torch::Tensor hidden = torch::randn({16, 8}).requires_grad_(true);
  torch::Tensor weight = torch::randn({100, 8}).requires_grad_(true);
  torch::Tensor targets = torch::randint(100, {16}, torch::kLong);
  torch::Tensor loss;
  {
    torch::NoGradGuard no_grad;
    loss = FusedLinearCrossEntropy(hidden, weight, targets);
  }
  EXPECT_FALSE(loss.requires_grad());
  EXPECT_NEAR(loss.item<double>(), UnfusedReference(hidden, weight, targets, 1).loss.item<double>(),
              1e-5);
}

TEST(FusedLoss, NonFiniteInputGivesNonFiniteLossAndGradient) {
  torch::Tensor hidden = torch::randn({4, 8});
  hidden[2][3] = std::numeric_limits<float>::quiet_NaN();
  hidden.requires_grad_(true);
  torch::Tensor weight = torch::randn({50, 8}).requires_grad_(true);
  torch::Tensor targets = torch::randint(50, {4}, torch::kLong);
  torch::Tensor loss = FusedLinearCrossEntropy(hidden, weight, targets);
  EXPECT_TRUE(std::isnan(loss.item<double>()));
  loss.backward();
  EXPECT_FALSE(torch::isfinite(weight.grad()).all().item<bool>());

  torch::Tensor inf_hidden = torch::randn({4, 8});
  inf_hidden[0][0] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(std::isfinite(FusedLinearCrossEntropy(inf_hidden, weight.detach(), targets)
                                 .item<double>()));
}

TEST(FusedLoss, RejectsTargetsOutsideTheVocabularyAndBadShapes) {
  torch::Tensor hidden = torch::randn({3, 4});
  torch::Tensor weight = torch::randn({10, 4});
  EXPECT_THROW(FusedLinearCrossEntropy(hidden, weight, torch::tensor({0, 10, 1}, torch::kLong)),
               c10::Error);
  EXPECT_THROW(FusedLinearCrossEntropy(hidden, weight, torch::tensor({0, -1, 1}, torch::kLong)),
               c10::Error);
  EXPECT_THROW(FusedLinearCrossEntropy(hidden, weight, torch::tensor({0, 1}, torch::kLong)),
               c10::Error);
  EXPECT_THROW(FusedLinearCrossEntropy(torch::randn({3, 5}), weight,
                                       torch::tensor({0, 1, 2}, torch::kLong)),
               c10::Error);
}

// Every SIMD level of the row kernel agrees with a double-precision
// softmax, for a vocabulary that is not a multiple of any vector width.
TEST(SoftmaxCrossEntropyRows, EverySimdLevelMatchesDoublePrecision) {
  const int64_t rows = 6, vocab = 1013;
  torch::manual_seed(11);
  const torch::Tensor logits = torch::randn({rows, vocab}) * 8;
  std::vector<int64_t> targets = {0, 1012, 500, 17, 3, 999};
  const torch::Tensor t = torch::tensor(targets, torch::kLong);
  const torch::Tensor z = logits.to(torch::kDouble);
  const torch::Tensor log_p = torch::log_softmax(z, 1);
  const torch::Tensor ref_loss = -log_p.gather(1, t.unsqueeze(1)).squeeze(1);
  const double scale = 1.0 / rows;
  const torch::Tensor ref_grad =
      (log_p.exp() - torch::one_hot(t, vocab).to(torch::kDouble)) * scale;
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    SCOPED_TRACE(static_cast<int>(level));
    torch::Tensor work = logits.clone();
    std::vector<double> loss(rows);
    SoftmaxCrossEntropyRows(work.data_ptr<float>(), rows, vocab, targets.data(), scale,
                            loss.data(), level);
    for (int64_t i = 0; i < rows; ++i) {
      EXPECT_NEAR(loss[i], ref_loss[i].item<double>(), 1e-5 * ref_loss[i].item<double>());
    }
    EXPECT_LT(RelativeError(work.to(torch::kDouble), ref_grad), 1e-5);
    // Loss only: the logits stay as they were.
    torch::Tensor untouched = logits.clone();
    SoftmaxCrossEntropyRows(untouched.data_ptr<float>(), rows, vocab, targets.data(), 0.0,
                            loss.data(), level);
    EXPECT_TRUE(torch::equal(untouched, logits));
    EXPECT_NEAR(loss[2], ref_loss[2].item<double>(), 1e-5 * ref_loss[2].item<double>());
  }
}

}  // namespace
}  // namespace loom::engine
