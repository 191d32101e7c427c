#include "worker/engine/causal_attention.h"

#include <cmath>
#include <limits>
#include <tuple>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace loom::engine {
namespace {

struct Shape {
  int64_t batch, time, d, n_head;
};

class CausalAttentionShapes : public ::testing::TestWithParam<Shape> {};

// Output and gradients with respect to every element of qkv equal the
// unfused softmax(mask(QKᵀ/√hd))·V, including T that is not a multiple of
// the row block, T = 1, and one head.
TEST_P(CausalAttentionShapes, MatchesTheUnfusedExpressionAndItsGradients) {
  const Shape s = GetParam();
  torch::manual_seed(7);
  const torch::Tensor base = torch::randn({s.batch, s.time, 3 * s.d});
  const torch::Tensor upstream = torch::randn({s.batch, s.time, s.d});

  torch::Tensor qkv = base.clone().requires_grad_(true);
  torch::Tensor y = CausalSelfAttention(qkv, s.n_head);
  (y * upstream).sum().backward();

  torch::Tensor qkv_ref = base.to(torch::kDouble).requires_grad_(true);
  torch::Tensor y_ref = CausalSelfAttentionReference(qkv_ref, s.n_head);
  (y_ref * upstream.to(torch::kDouble)).sum().backward();

  ASSERT_EQ(y.sizes(), y_ref.sizes());
  const double out_err = (y.to(torch::kDouble) - y_ref).abs().max().item<double>();
  const double grad_err =
      (qkv.grad().to(torch::kDouble) - qkv_ref.grad()).abs().max().item<double>();
  const double grad_scale = qkv_ref.grad().abs().max().item<double>();
  EXPECT_LT(out_err, 1e-5) << "output";
  EXPECT_LT(grad_err, 1e-5 * std::max(1.0, grad_scale)) << "gradient";
  EXPECT_GT(grad_scale, 0.0);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CausalAttentionShapes,
    ::testing::Values(Shape{2, 256, 64, 4}, Shape{1, 100, 48, 3}, Shape{3, 1, 32, 2},
                      Shape{2, 65, 16, 1}, Shape{1, 130, 96, 6}, Shape{2, 17, 40, 5}),
    [](const ::testing::TestParamInfo<Shape>& info) {
      const Shape& s = info.param;
      return "B" + std::to_string(s.batch) + "_T" + std::to_string(s.time) + "_d" +
             std::to_string(s.d) + "_h" + std::to_string(s.n_head);
    });

// Causality: changing the keys, values or queries of later positions leaves
// every earlier output bit for bit unchanged.
TEST(CausalAttention, LaterPositionsDoNotChangeEarlierOutputs) {
  torch::manual_seed(3);
  const int64_t time = 150, d = 32, cut = 77;
  const torch::Tensor a = torch::randn({2, time, 3 * d});
  torch::Tensor b = a.clone();
  b.narrow(1, cut, time - cut).normal_();
  torch::NoGradGuard no_grad;
  const torch::Tensor ya = CausalSelfAttention(a, 4), yb = CausalSelfAttention(b, 4);
  EXPECT_TRUE(torch::equal(ya.narrow(1, 0, cut), yb.narrow(1, 0, cut)));
  EXPECT_FALSE(torch::equal(ya.narrow(1, cut, time - cut), yb.narrow(1, cut, time - cut)));
}

// The first position attends only to itself: its output is its own value.
TEST(CausalAttention, FirstPositionOutputsItsOwnValue) {
  torch::manual_seed(5);
  const int64_t d = 24;
  const torch::Tensor qkv = torch::randn({3, 9, 3 * d});
  torch::NoGradGuard no_grad;
  const torch::Tensor y = CausalSelfAttention(qkv, 3);
  EXPECT_TRUE(torch::allclose(y.select(1, 0), qkv.select(1, 0).narrow(-1, 2 * d, d), 1e-6,
                              1e-6));
}

// A strided view (a slice of a larger projection) is read correctly.
TEST(CausalAttention, AcceptsANonContiguousInput) {
  torch::manual_seed(11);
  const torch::Tensor wide = torch::randn({2, 40, 3 * 32 + 5});
  const torch::Tensor qkv = wide.narrow(2, 5, 3 * 32);
  ASSERT_FALSE(qkv.is_contiguous());
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::allclose(CausalSelfAttention(qkv, 2), CausalSelfAttentionReference(qkv, 2),
                              1e-5, 1e-5));
}

// A NaN in a visible score reaches the output (and is not clamped away by
// the vectorised exp), so the trainer's non-finite checks see it; rows that
// cannot see the NaN stay finite.
TEST(CausalAttention, NonFiniteInputsPropagate) {
  const int64_t d = 32, time = 40, poisoned = 20;
  torch::manual_seed(13);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    torch::Tensor qkv = torch::randn({1, time, 3 * d});
    qkv[0][poisoned][d + 1] = bad;  // a key at position 20
    torch::NoGradGuard no_grad;
    const torch::Tensor y = CausalSelfAttention(qkv, 2);
    EXPECT_TRUE(torch::isfinite(y.narrow(1, 0, poisoned)).all().item<bool>()) << bad;
    EXPECT_TRUE(torch::isnan(y.narrow(1, poisoned, time - poisoned)).any().item<bool>())
        << bad;
  }
}

// What the model calls (SDPA on LibTorch 2.x, the blocked kernel on 1.13, the
// reference for other dtypes) has a correct causal mask: it equals the
// reference, fp32 and bf16.
TEST(CausalAttention, DispatchMatchesTheReference) {
  torch::manual_seed(17);
  const torch::Tensor qkv = torch::randn({2, 70, 3 * 48});
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::allclose(CausalAttention(qkv, 3), CausalSelfAttentionReference(qkv, 3), 1e-5,
                              1e-5));
  const torch::Tensor half = qkv.to(torch::kBFloat16);
  EXPECT_TRUE(torch::allclose(CausalAttention(half, 3).to(torch::kFloat),
                              CausalSelfAttentionReference(half, 3).to(torch::kFloat), 2e-2, 2e-2));
}

TEST(CausalAttention, SupportsOnlyCpuFp32WithHeadsDividingD) {
  EXPECT_TRUE(CausalSelfAttentionSupports(torch::zeros({1, 4, 12}), 2));
  EXPECT_FALSE(CausalSelfAttentionSupports(torch::zeros({1, 4, 12}), 5));
  EXPECT_FALSE(CausalSelfAttentionSupports(torch::zeros({1, 4, 13}), 1));
  EXPECT_FALSE(CausalSelfAttentionSupports(torch::zeros({1, 4, 12}, torch::kBFloat16), 2));
  EXPECT_FALSE(CausalSelfAttentionSupports(torch::zeros({4, 12}), 2));
  EXPECT_THROW(CausalSelfAttention(torch::zeros({1, 4, 12}, torch::kDouble), 2), c10::Error);
}

}  // namespace
}  // namespace loom::engine
