#include "worker/engine/ops/fused_loss.h"

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include <torch/nn/functional/loss.h>
#include <torch/torch.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/autocast.h"

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

// (chunk_rows, force_generic): both implementations against the reference.
class FusedLossTest : public ::testing::TestWithParam<std::tuple<int64_t, bool>> {};

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
    options.chunk_rows = std::get<0>(GetParam());
    options.force_generic = std::get<1>(GetParam());
    torch::Tensor loss = FusedLinearCrossEntropy(hidden, weight, targets, options);
    (loss * upstream).backward();
    const Reference ref = UnfusedReference(hidden, weight, targets, upstream);
    EXPECT_NEAR(loss.item<double>(), ref.loss.item<double>(), 1e-5 * ref.loss.item<double>());
    EXPECT_LT(RelativeError(hidden.grad().to(torch::kDouble), ref.grad_hidden), 1e-5);
    EXPECT_LT(RelativeError(weight.grad().to(torch::kDouble), ref.grad_weight), 1e-5);
  }
}

// 0 = automatic chunking (one chunk for these sizes); 1 = row by row; 7
// leaves a ragged last chunk. false = the CPU row kernel, true = the
// LibTorch-operations path that GPUs run.
INSTANTIATE_TEST_SUITE_P(ChunkRowsAndPath, FusedLossTest,
                         ::testing::Combine(::testing::Values(0, 1, 7), ::testing::Bool()));

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

// The LibTorch-operations path (what a GPU runs), on CPU tensors.
FusedLossOptions Generic(int64_t chunk_rows = 0) {
  FusedLossOptions options;
  options.chunk_rows = chunk_rows;
  options.force_generic = true;
  return options;
}

TEST(FusedLossGeneric, IsASeparateImplementationThatAgreesWithTheRowKernel) {
  // Same inputs through both paths: equal to 1e-5, but not bit for bit (the
  // exponentials and sums are computed differently), which shows that
  // force_generic really switches the implementation.
  torch::manual_seed(21);
  torch::Tensor hidden = torch::randn({33, 16});
  torch::Tensor weight = torch::randn({2000, 16}) * 0.5;
  torch::Tensor targets = torch::randint(2000, {33}, torch::kLong);
  auto run = [&](const FusedLossOptions& options) {
    torch::Tensor h = hidden.clone().requires_grad_(true);
    torch::Tensor w = weight.clone().requires_grad_(true);
    torch::Tensor loss = FusedLinearCrossEntropy(h, w, targets, options);
    loss.backward();
    return std::make_tuple(loss.detach(), h.grad(), w.grad());
  };
  FusedLossOptions kernel;
  kernel.chunk_rows = 8;
  const auto [kernel_loss, kernel_gh, kernel_gw] = run(kernel);
  const auto [generic_loss, generic_gh, generic_gw] = run(Generic(8));
  EXPECT_EQ(generic_loss.scalar_type(), torch::kFloat);
  EXPECT_NEAR(generic_loss.item<double>(), kernel_loss.item<double>(),
              1e-5 * kernel_loss.item<double>());
  EXPECT_LT(RelativeError(generic_gh.to(torch::kDouble), kernel_gh.to(torch::kDouble)), 1e-5);
  EXPECT_LT(RelativeError(generic_gw.to(torch::kDouble), kernel_gw.to(torch::kDouble)), 1e-5);
  EXPECT_FALSE(torch::equal(generic_gw, kernel_gw));
}

TEST(FusedLossGeneric, LeadingDimensionsTiedWeightsAndNoGradMode) {
  torch::manual_seed(23);
  torch::Tensor weight = torch::randn({30, 6}).requires_grad_(true);
  torch::Tensor ids = torch::randint(30, {2, 6}, torch::kLong);
  torch::Tensor targets = torch::randint(30, {2, 6}, torch::kLong);
  torch::Tensor hidden = torch::tanh(torch::embedding(weight, ids));  // [2, 6, 6]
  FusedLinearCrossEntropy(hidden, weight, targets, Generic(5)).backward();
  torch::Tensor w = weight.detach().to(torch::kDouble).requires_grad_(true);
  torch::Tensor h = torch::tanh(torch::embedding(w, ids));
  torch::Tensor ref = torch::nn::functional::cross_entropy(
      torch::matmul(h, w.t()).reshape({-1, 30}), targets.reshape({-1}));
  ref.backward();
  EXPECT_LT(RelativeError(weight.grad().to(torch::kDouble), w.grad()), 1e-5);

  torch::NoGradGuard no_grad;
  const torch::Tensor loss = FusedLinearCrossEntropy(hidden, weight, targets, Generic());
  EXPECT_FALSE(loss.requires_grad());
  EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-5);
}

TEST(FusedLossGeneric, NonFiniteInputGivesNonFiniteLossAndGradient) {
  torch::manual_seed(25);
  torch::Tensor hidden = torch::randn({4, 8});
  hidden[2][3] = std::numeric_limits<float>::quiet_NaN();
  hidden.requires_grad_(true);
  torch::Tensor weight = torch::randn({50, 8}).requires_grad_(true);
  torch::Tensor targets = torch::randint(50, {4}, torch::kLong);
  torch::Tensor loss = FusedLinearCrossEntropy(hidden, weight, targets, Generic(2));
  EXPECT_TRUE(std::isnan(loss.item<double>()));
  loss.backward();
  EXPECT_FALSE(torch::isfinite(weight.grad()).all().item<bool>());
  EXPECT_FALSE(torch::isfinite(hidden.grad()[2]).all().item<bool>());

  torch::Tensor inf_hidden = torch::randn({4, 8});
  inf_hidden[0][0] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(std::isfinite(
      FusedLinearCrossEntropy(inf_hidden, weight.detach(), targets, Generic()).item<double>()));
}

TEST(FusedLossGeneric, RejectsTargetsOutsideTheVocabularyNamingTheRow) {
  torch::Tensor hidden = torch::randn({3, 4});
  torch::Tensor weight = torch::randn({10, 4});
  try {
    FusedLinearCrossEntropy(hidden, weight, torch::tensor({0, 1, 10}, torch::kLong), Generic());
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what_without_backtrace(), testing::HasSubstr("target 10 at row 2 outside [0, 10)"));
  }
  EXPECT_THROW(
      FusedLinearCrossEntropy(hidden, weight, torch::tensor({-1, 0, 1}, torch::kLong), Generic()),
      c10::Error);
  // Mixed dtypes are refused on either path.
  EXPECT_THROW(FusedLinearCrossEntropy(hidden.to(torch::kBFloat16), weight,
                                       torch::tensor({0, 1, 2}, torch::kLong)),
               c10::Error);
}

// bf16 hidden and weight (as a GPU would hand them over) go through the
// generic path: gradients come back in bf16, and the values are those of the
// unfused loss on the same bf16 inputs to within bf16 rounding of the logits.
TEST(FusedLossGeneric, Bf16InputsGiveBf16GradientsCloseToTheReference) {
  torch::manual_seed(27);
  torch::Tensor hidden = torch::randn({24, 32}).to(torch::kBFloat16).requires_grad_(true);
  torch::Tensor weight = (torch::randn({300, 32}) * 0.3).to(torch::kBFloat16).requires_grad_(true);
  torch::Tensor targets = torch::randint(300, {24}, torch::kLong);
  torch::Tensor loss = FusedLinearCrossEntropy(hidden, weight, targets, Generic(7));
  EXPECT_EQ(loss.scalar_type(), torch::kFloat);
  loss.backward();
  ASSERT_EQ(hidden.grad().scalar_type(), torch::kBFloat16);
  ASSERT_EQ(weight.grad().scalar_type(), torch::kBFloat16);
  const Reference ref = UnfusedReference(hidden.to(torch::kFloat), weight.to(torch::kFloat),
                                         targets, 1.0);
  EXPECT_NEAR(loss.item<double>(), ref.loss.item<double>(), 2e-2 * ref.loss.item<double>());
  EXPECT_LT(RelativeError(hidden.grad().to(torch::kDouble), ref.grad_hidden), 3e-2);
  EXPECT_LT(RelativeError(weight.grad().to(torch::kDouble), ref.grad_weight), 3e-2);
  // The same without force_generic: bf16 never reaches the fp32 row kernel.
  torch::Tensor again = FusedLinearCrossEntropy(hidden.detach(), weight.detach(), targets);
  EXPECT_NEAR(again.item<double>(), loss.item<double>(), 1e-6);
}

// fp32 hidden and weight with bf16 products (what the model asks for on a GPU
// under bf16 training): the gradients come back in fp32, and everything is
// within bf16 rounding of the fp32 reference. bf16 keeps 8 significant bits
// (relative rounding up to 2^-9 ~ 0.2% per operand); the logits, sums of d
// such products, carry a relative error of a few 1e-3 at most, and so do the
// gradients: 1e-2 below leaves room for that and catches any wrong scale or
// dtype (those are off by orders of magnitude).
TEST(FusedLossLowerPrecision, Bf16ProductsOfFp32InputsGiveFp32GradientsCloseToTheReference) {
  torch::manual_seed(31);
  torch::Tensor hidden = torch::randn({40, 32}).requires_grad_(true);
  torch::Tensor weight = (torch::randn({1003, 32}) * 0.3).requires_grad_(true);
  torch::Tensor targets = torch::randint(1003, {40}, torch::kLong);
  const Reference ref = UnfusedReference(hidden, weight, targets, 0.5);
  for (int64_t chunk_rows : {0, 7}) {
    SCOPED_TRACE(testing::Message() << "chunk_rows " << chunk_rows);
    hidden.mutable_grad() = torch::Tensor();
    weight.mutable_grad() = torch::Tensor();
    FusedLossOptions options;
    options.chunk_rows = chunk_rows;
    options.matmul_dtype = torch::kBFloat16;
    torch::Tensor loss = FusedLinearCrossEntropy(hidden, weight, targets, options);
    EXPECT_EQ(loss.scalar_type(), torch::kFloat);
    (loss * 0.5).backward();
    ASSERT_EQ(hidden.grad().scalar_type(), torch::kFloat);
    ASSERT_EQ(weight.grad().scalar_type(), torch::kFloat);
    EXPECT_NEAR(loss.item<double>(), ref.loss.item<double>(), 1e-2 * ref.loss.item<double>());
    EXPECT_LT(RelativeError(hidden.grad().to(torch::kDouble), ref.grad_hidden), 1e-2);
    EXPECT_LT(RelativeError(weight.grad().to(torch::kDouble), ref.grad_weight), 1e-2);
    // And the products really were bf16: fp32 ones agree with the reference
    // to ~1e-6, bf16 ones cannot.
    EXPECT_GT(std::abs(loss.item<double>() - ref.loss.item<double>()), 1e-6);
  }
  // Without grad mode (validation) the same loss.
  torch::NoGradGuard no_grad;
  FusedLossOptions options;
  options.matmul_dtype = torch::kBFloat16;
  const double eval = FusedLinearCrossEntropy(hidden, weight, targets, options).item<double>();
  EXPECT_NEAR(eval, ref.loss.item<double>(), 1e-2 * ref.loss.item<double>());
}

// matmul_dtype fp32 (or the inputs' own dtype) changes nothing; anything
// but bf16/fp16 below fp32 inputs is refused with the reason.
TEST(FusedLossLowerPrecision, TheInputsOwnDtypeChangesNothingAndOthersAreRefused) {
  torch::manual_seed(37);
  torch::Tensor hidden = torch::randn({12, 16});
  torch::Tensor weight = torch::randn({300, 16}) * 0.3;
  torch::Tensor targets = torch::randint(300, {12}, torch::kLong);
  FusedLossOptions fp32;
  fp32.matmul_dtype = torch::kFloat;
  EXPECT_EQ(FusedLinearCrossEntropy(hidden, weight, targets, fp32).item<double>(),
            FusedLinearCrossEntropy(hidden, weight, targets).item<double>());
  FusedLossOptions dbl;
  dbl.matmul_dtype = torch::kDouble;
  try {
    FusedLinearCrossEntropy(hidden, weight, targets, dbl);
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what_without_backtrace(), testing::HasSubstr("matmul_dtype must be bf16 or fp16"));
  }
  // bf16 inputs cannot be "lowered" to fp16.
  FusedLossOptions half;
  half.matmul_dtype = torch::kHalf;
  EXPECT_THROW(FusedLinearCrossEntropy(hidden.to(torch::kBFloat16), weight.to(torch::kBFloat16),
                                       targets, half),
               c10::Error);
}

// The loss decides its own precision: an enclosing autocast region (as the
// trainer's fp16/bf16 regions around the model would be) must not turn its
// fp32 products into bf16 ones.
TEST(FusedLossGeneric, IgnoresAnEnclosingAutocastRegion) {
  torch::manual_seed(29);
  torch::Tensor hidden = torch::randn({16, 32});
  torch::Tensor weight = torch::randn({400, 32}) * 0.5;
  torch::Tensor targets = torch::randint(400, {16}, torch::kLong);
  const double plain = FusedLinearCrossEntropy(hidden, weight, targets, Generic()).item<double>();
  double inside = 0;
  {
    AutocastGuard autocast(c10::kCPU, AutocastState{true, torch::kBFloat16});
    // Sanity: autocast is on, so a plain product comes out in bf16.
    ASSERT_EQ(torch::mm(hidden, weight.t()).scalar_type(), torch::kBFloat16);
    inside = FusedLinearCrossEntropy(hidden, weight, targets, Generic()).item<double>();
  }
  EXPECT_EQ(inside, plain);
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
