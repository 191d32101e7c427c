#include "worker/engine/ops/fused_adamw.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace loom::engine {
namespace {

// Owns the four arrays of each tensor; views() hands out AdamWTensors.
class TensorSet {
 public:
  // One tensor per entry of `sizes`; weight decay alternates 0.1 / 0.
  TensorSet(const std::vector<int64_t>& sizes, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> positive(0.0f, 0.01f);
    for (size_t k = 0; k < sizes.size(); ++k) {
      Arrays a;
      for (int64_t i = 0; i < sizes[k]; ++i) {
        a.param.push_back(0.02f * normal(rng));
        a.grad.push_back(normal(rng));
        a.exp_avg.push_back(0.1f * normal(rng));
        a.exp_avg_sq.push_back(positive(rng));
      }
      a.weight_decay = k % 2 == 0 ? 0.1 : 0.0;
      a.step = 1 + static_cast<int64_t>(k % 3);
      arrays_.push_back(std::move(a));
    }
  }

  std::vector<AdamWTensor> views() {
    std::vector<AdamWTensor> out;
    for (Arrays& a : arrays_) {
      AdamWTensor t;
      t.param = a.param.data();
      t.grad = a.grad.data();
      t.exp_avg = a.exp_avg.data();
      t.exp_avg_sq = a.exp_avg_sq.data();
      t.size = static_cast<int64_t>(a.param.size());
      t.weight_decay = a.weight_decay;
      t.step = a.step;
      out.push_back(t);
    }
    return out;
  }

  std::vector<float>& grad(size_t k) { return arrays_[k].grad; }
  std::vector<float>& param(size_t k) { return arrays_[k].param; }
  size_t count() const { return arrays_.size(); }

  // Bitwise equality of param, exp_avg and exp_avg_sq (NaN-safe).
  bool BitEqual(const TensorSet& other) const {
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      // (memcmp of empty vectors' null pointers is undefined: UBSan.)
      return a.size() == b.size() &&
             (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    };
    for (size_t k = 0; k < arrays_.size(); ++k) {
      const Arrays& a = arrays_[k];
      const Arrays& b = other.arrays_[k];
      if (!same(a.param, b.param) || !same(a.exp_avg, b.exp_avg) ||
          !same(a.exp_avg_sq, b.exp_avg_sq) || !same(a.grad, b.grad)) {
        return false;
      }
    }
    return true;
  }

  // The documented per-element formula, written out independently of the
  // kernel, in fp32 in the documented order.
  void ReferenceUpdate(const AdamWHyperparams& h, double grad_scale) {
    for (Arrays& a : arrays_) {
      const double bc1 = 1 - std::pow(h.beta1, static_cast<double>(a.step));
      const double bc2 = 1 - std::pow(h.beta2, static_cast<double>(a.step));
      const float scale = static_cast<float>(grad_scale);
      const float decay = static_cast<float>(1 - h.lr * a.weight_decay);
      const float b1 = static_cast<float>(h.beta1), omb1 = static_cast<float>(1 - h.beta1);
      const float b2 = static_cast<float>(h.beta2), omb2 = static_cast<float>(1 - h.beta2);
      const float sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
      const float eps = static_cast<float>(h.eps);
      const float neg_step = static_cast<float>(-h.lr / bc1);
      for (size_t i = 0; i < a.param.size(); ++i) {
        const float g = a.grad[i] * scale;
        const float p = a.param[i] * decay;
        const float m = std::fma(g, omb1, a.exp_avg[i] * b1);
        const float v = std::fma(omb2 * g, g, a.exp_avg_sq[i] * b2);
        volatile float root = std::sqrt(v) / sqrt_bc2;  // volatile: no contraction
        const float denom = root + eps;
        volatile float update = (neg_step * m) / denom;
        a.param[i] = p + update;
        a.exp_avg[i] = m;
        a.exp_avg_sq[i] = v;
      }
    }
  }

  double ReferenceSumSquares() const {
    double sum = 0;
    for (const Arrays& a : arrays_) {
      for (float g : a.grad) sum += static_cast<double>(g) * g;
    }
    return sum;
  }

 private:
  struct Arrays {
    std::vector<float> param, grad, exp_avg, exp_avg_sq;
    double weight_decay = 0;
    int64_t step = 1;
  };
  std::vector<Arrays> arrays_;
};

// Sizes that exercise empty tensors, scalar tails, and ranges split between
// threads in the middle of a tensor.
const std::vector<int64_t> kSizes = {0, 1, 7, 16, 33, 1000, 70001, 3, 150017};

std::vector<SimdLevel> SupportedLevels() {
  std::vector<SimdLevel> levels = {SimdLevel::kScalar};
  if (static_cast<int>(BestSimdLevel()) >= static_cast<int>(SimdLevel::kAvx2)) {
    levels.push_back(SimdLevel::kAvx2);
  }
  if (BestSimdLevel() == SimdLevel::kAvx512) levels.push_back(SimdLevel::kAvx512);
  return levels;
}

AdamWHyperparams Hyper() {
  AdamWHyperparams h;
  h.lr = 3e-3;
  h.beta1 = 0.9;
  h.beta2 = 0.95;
  h.eps = 1e-8;
  return h;
}

TEST(FusedAdamWTest, UpdateMatchesReferenceBitForBitAtEveryLevelAndThreadCount) {
  TensorSet expected(kSizes, 1);
  expected.ReferenceUpdate(Hyper(), 0.75);
  for (SimdLevel level : SupportedLevels()) {
    for (int threads : {1, 2, 3}) {
      SCOPED_TRACE(testing::Message()
                   << "level " << static_cast<int>(level) << " threads " << threads);
      TensorSet actual(kSizes, 1);
      std::vector<AdamWGroup> groups = {{Hyper(), actual.views()}};
      AdamWUpdate(groups, 0.75, {threads, level});
      EXPECT_TRUE(actual.BitEqual(expected));
    }
  }
}

TEST(FusedAdamWTest, GroupsUseTheirOwnHyperparameters) {
  // Tensors 0..4 in a group with lr 3e-3, the rest with lr 1e-4 and beta2
  // 0.999; the reference applies each group's hyperparameters to its own.
  const std::vector<int64_t> first(kSizes.begin(), kSizes.begin() + 5);
  const std::vector<int64_t> second(kSizes.begin() + 5, kSizes.end());
  AdamWHyperparams other = Hyper();
  other.lr = 1e-4;
  other.beta2 = 0.999;
  TensorSet expected_a(first, 2), expected_b(second, 3);
  expected_a.ReferenceUpdate(Hyper(), 1.0);
  expected_b.ReferenceUpdate(other, 1.0);
  TensorSet a(first, 2), b(second, 3);
  std::vector<AdamWGroup> groups = {{Hyper(), a.views()}, {other, b.views()}};
  AdamWUpdate(groups, 1.0, {2, SimdLevel::kAuto});
  EXPECT_TRUE(a.BitEqual(expected_a));
  EXPECT_TRUE(b.BitEqual(expected_b));
}

TEST(FusedAdamWTest, FirstStepMovesEachParameterByLrAgainstItsGradientSign) {
  // At step 1, m_hat = g and v_hat = g^2, so the update is -lr * sign(g)
  // (up to eps / |g|) after the decay factor (Loshchilov & Hutter, Alg. 2).
  float param[4] = {1.0f, -2.0f, 0.5f, 0.0f};
  const float grad[4] = {0.3f, -5.0f, 2.0f, -1e-3f};
  float exp_avg[4] = {}, exp_avg_sq[4] = {};
  AdamWTensor t{param, grad, exp_avg, exp_avg_sq, 4, /*weight_decay=*/0.1, /*step=*/1};
  AdamWHyperparams h;
  h.lr = 0.01;
  std::vector<AdamWGroup> groups = {{h, {t}}};
  AdamWUpdate(groups, 1.0);
  const float before[4] = {1.0f, -2.0f, 0.5f, 0.0f};
  for (int i = 0; i < 4; ++i) {
    const double expected = before[i] * (1 - 0.01 * 0.1) - 0.01 * (grad[i] > 0 ? 1 : -1);
    EXPECT_NEAR(param[i], expected, 1e-6) << i;
    EXPECT_FLOAT_EQ(exp_avg[i], 0.1f * grad[i]) << i;
  }
}

TEST(FusedAdamWTest, GradSquaredNormMatchesDoubleSum) {
  TensorSet set(kSizes, 4);
  const double expected = set.ReferenceSumSquares();
  std::vector<AdamWGroup> groups = {{Hyper(), set.views()}};
  for (SimdLevel level : SupportedLevels()) {
    for (int threads : {1, 2, 3}) {
      EXPECT_NEAR(GradSquaredNorm(groups, {threads, level}), expected, 1e-12 * expected)
          << static_cast<int>(level) << " " << threads;
    }
  }
}

TEST(FusedAdamWTest, StepWithoutClippingEqualsPlainUpdate) {
  TensorSet expected(kSizes, 5);
  expected.ReferenceUpdate(Hyper(), 1.0);
  TensorSet actual(kSizes, 5);
  const double norm = std::sqrt(actual.ReferenceSumSquares());
  std::vector<AdamWGroup> groups = {{Hyper(), actual.views()}};
  AdamWStepOptions step;
  step.max_grad_norm = 2 * norm;  // above the norm: no clipping
  const AdamWStepResult result = FusedAdamWStep(groups, step);
  EXPECT_TRUE(result.applied);
  EXPECT_NEAR(result.grad_norm, norm, 1e-9 * norm);
  EXPECT_EQ(result.clip_coef, 1.0);
  EXPECT_TRUE(actual.BitEqual(expected));
}

TEST(FusedAdamWTest, StepClipsToMaxNorm) {
  TensorSet actual(kSizes, 6);
  const double norm = std::sqrt(actual.ReferenceSumSquares());
  std::vector<AdamWGroup> groups = {{Hyper(), actual.views()}};
  AdamWStepOptions step;
  step.max_grad_norm = 1.0;
  const AdamWStepResult result = FusedAdamWStep(groups, step);
  ASSERT_TRUE(result.applied);
  EXPECT_NEAR(result.grad_norm, norm, 1e-9 * norm);
  EXPECT_NEAR(result.clip_coef, 1.0 / (norm + 1e-6), 1e-15);
  TensorSet expected(kSizes, 6);
  expected.ReferenceUpdate(Hyper(), result.clip_coef);
  EXPECT_TRUE(actual.BitEqual(expected));
}

TEST(FusedAdamWTest, UnscaleByPowerOfTwoIsExact) {
  // Gradients scaled by 1024 (a loss scale) with inv_scale 1/1024 give the
  // same step as the unscaled gradients: both multiplications are exact.
  TensorSet expected(kSizes, 7), actual(kSizes, 7);
  for (size_t k = 0; k < actual.count(); ++k) {
    for (float& g : actual.grad(k)) g *= 1024.0f;
  }
  AdamWStepOptions step;
  step.max_grad_norm = 1.0;
  std::vector<AdamWGroup> expected_groups = {{Hyper(), expected.views()}};
  const AdamWStepResult expected_result = FusedAdamWStep(expected_groups, step);
  step.inv_scale = 1.0 / 1024;
  std::vector<AdamWGroup> groups = {{Hyper(), actual.views()}};
  const AdamWStepResult result = FusedAdamWStep(groups, step);
  ASSERT_TRUE(result.applied);
  EXPECT_DOUBLE_EQ(result.grad_norm, expected_result.grad_norm);
  for (size_t k = 0; k < actual.count(); ++k) {
    ASSERT_EQ(actual.param(k).size(), expected.param(k).size()) << k;
    if (actual.param(k).empty()) continue;  // (memcmp of null pointers is undefined)
    EXPECT_EQ(std::memcmp(actual.param(k).data(), expected.param(k).data(),
                          actual.param(k).size() * sizeof(float)),
              0)
        << k;
  }
}

class NonFiniteGradTest : public testing::TestWithParam<float> {};

TEST_P(NonFiniteGradTest, SkipsTheStepAndChangesNothing) {
  // The bad value sits in the last, largest tensor, past the first thread's
  // range, at an index handled by the vector loop and then by the scalar tail.
  for (size_t index : {size_t{80000}, size_t{150016}}) {
    for (SimdLevel level : SupportedLevels()) {
      TensorSet untouched(kSizes, 8), actual(kSizes, 8);
      const size_t last = kSizes.size() - 1;
      untouched.grad(last)[index] = GetParam();
      actual.grad(last)[index] = GetParam();
      std::vector<AdamWGroup> groups = {{Hyper(), actual.views()}};
      AdamWStepOptions step;
      step.max_grad_norm = 1.0;
      const AdamWStepResult result = FusedAdamWStep(groups, step, {2, level});
      EXPECT_FALSE(result.applied);
      EXPECT_FALSE(std::isfinite(result.grad_norm));
      EXPECT_EQ(result.clip_coef, 0.0);
      EXPECT_TRUE(actual.BitEqual(untouched)) << index << " " << static_cast<int>(level);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(NanAndInf, NonFiniteGradTest,
                         testing::Values(std::numeric_limits<float>::quiet_NaN(),
                                         std::numeric_limits<float>::infinity(),
                                         -std::numeric_limits<float>::infinity()));

TEST(FusedAdamWTest, EmptyGroupsAreANoOp) {
  std::vector<AdamWGroup> groups = {{Hyper(), {}}, {Hyper(), {}}};
  EXPECT_EQ(GradSquaredNorm(groups), 0.0);
  const AdamWStepResult result = FusedAdamWStep(groups);
  EXPECT_TRUE(result.applied);
  EXPECT_EQ(result.grad_norm, 0.0);
}

}  // namespace
}  // namespace loom::engine
