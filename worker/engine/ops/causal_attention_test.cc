#include "worker/engine/ops/causal_attention.h"

#include <cmath>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

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

struct GroupedShape {
  int64_t batch, time, n_head, n_kv, hd;
  bool rotary;
};

// Half-split rotary tables [T, hd] in fp32 (as gpt.h's MakeRotaryTables).
std::pair<torch::Tensor, torch::Tensor> Tables(int64_t time, int64_t hd) {
  const torch::Tensor inv_freq =
      torch::pow(10000.0, -torch::arange(0, hd, 2, torch::kDouble) / static_cast<double>(hd))
          .to(torch::kFloat);
  const torch::Tensor freqs = torch::outer(torch::arange(time, torch::kFloat), inv_freq);
  const torch::Tensor angles = torch::cat({freqs, freqs}, -1);
  return {angles.cos(), angles.sin()};
}

// The plain LibTorch expression: rotate queries and keys, repeat each
// key/value head for its query heads, then the unfused attention.
torch::Tensor GroupedReference(const torch::Tensor& qkv, const GroupedShape& s,
                               const torch::Tensor& cos, const torch::Tensor& sin) {
  std::vector<torch::Tensor> parts =
      qkv.split_with_sizes({s.n_head * s.hd, s.n_kv * s.hd, s.n_kv * s.hd}, -1);
  torch::Tensor q = parts[0].view({s.batch, s.time, s.n_head, s.hd});
  torch::Tensor k = parts[1].view({s.batch, s.time, s.n_kv, s.hd});
  torch::Tensor v = parts[2].view({s.batch, s.time, s.n_kv, s.hd});
  if (s.rotary) {
    const torch::Tensor c = cos.to(qkv.scalar_type()).view({s.time, 1, s.hd});
    const torch::Tensor sn = sin.to(qkv.scalar_type()).view({s.time, 1, s.hd});
    auto rotate = [&](const torch::Tensor& x) {
      const std::vector<torch::Tensor> halves = x.chunk(2, -1);
      return x * c + torch::cat({-halves[1], halves[0]}, -1) * sn;
    };
    q = rotate(q);
    k = rotate(k);
  }
  k = k.repeat_interleave(s.n_head / s.n_kv, 2);
  v = v.repeat_interleave(s.n_head / s.n_kv, 2);
  return CausalSelfAttentionReference(torch::cat({q.reshape({s.batch, s.time, -1}),
                                                  k.reshape({s.batch, s.time, -1}),
                                                  v.reshape({s.batch, s.time, -1})},
                                                 -1),
                                      s.n_head);
}

class GroupedAttentionShapes : public ::testing::TestWithParam<GroupedShape> {};

// Grouped-query heads and rotary positions inside the kernel: output and
// every gradient equal rotate-expand-attend in LibTorch ops (in double).
TEST_P(GroupedAttentionShapes, MatchesRotateExpandAttendAndItsGradients) {
  const GroupedShape s = GetParam();
  torch::manual_seed(11);
  const int64_t width = (s.n_head + 2 * s.n_kv) * s.hd;
  const torch::Tensor base = torch::randn({s.batch, s.time, width});
  const torch::Tensor upstream = torch::randn({s.batch, s.time, s.n_head * s.hd});
  torch::Tensor cos, sin;
  if (s.rotary) std::tie(cos, sin) = Tables(s.time, s.hd);
  ASSERT_TRUE(GroupedCausalSelfAttentionSupports(base, s.n_head, s.n_kv, cos, sin));

  torch::Tensor qkv = base.clone().requires_grad_(true);
  torch::Tensor y = GroupedCausalSelfAttention(qkv, s.n_head, s.n_kv, cos, sin);
  (y * upstream).sum().backward();

  torch::Tensor qkv_ref = base.to(torch::kDouble).requires_grad_(true);
  torch::Tensor y_ref = GroupedReference(qkv_ref, s, cos, sin);
  (y_ref * upstream.to(torch::kDouble)).sum().backward();

  ASSERT_EQ(y.sizes(), y_ref.sizes());
  const double out_err = (y.to(torch::kDouble) - y_ref).abs().max().item<double>();
  const torch::Tensor grad_diff = (qkv.grad().to(torch::kDouble) - qkv_ref.grad()).abs();
  const double grad_scale = qkv_ref.grad().abs().max().item<double>();
  EXPECT_LT(out_err, 1e-5) << "output";
  // Queries, keys and values each.
  const std::vector<torch::Tensor> parts =
      grad_diff.split_with_sizes({s.n_head * s.hd, s.n_kv * s.hd, s.n_kv * s.hd}, -1);
  const char* names[] = {"dQ", "dK", "dV"};
  for (int i = 0; i < 3; ++i) {
    EXPECT_LT(parts[i].max().item<double>(), 1e-5 * std::max(1.0, grad_scale)) << names[i];
  }
  EXPECT_GT(grad_scale, 0.0);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GroupedAttentionShapes,
    ::testing::Values(GroupedShape{2, 100, 4, 2, 16, true}, GroupedShape{1, 130, 6, 1, 8, true},
                      GroupedShape{2, 65, 4, 4, 16, true}, GroupedShape{2, 70, 8, 2, 8, false},
                      GroupedShape{3, 1, 2, 1, 4, true}, GroupedShape{1, 64, 4, 4, 8, false}),
    [](const ::testing::TestParamInfo<GroupedShape>& info) {
      const GroupedShape& s = info.param;
      return "B" + std::to_string(s.batch) + "_T" + std::to_string(s.time) + "_h" +
             std::to_string(s.n_head) + "_kv" + std::to_string(s.n_kv) + "_hd" +
             std::to_string(s.hd) + (s.rotary ? "_rotary" : "");
    });

// Equal heads and no tables: the same kernel as CausalSelfAttention, bit
// for bit.
TEST(CausalAttention, GroupedWithEqualHeadsIsTheUngroupedKernel) {
  torch::manual_seed(5);
  const torch::Tensor base = torch::randn({2, 90, 3 * 32});
  torch::Tensor a = base.clone().requires_grad_(true), b = base.clone().requires_grad_(true);
  const torch::Tensor up = torch::randn({2, 90, 32});
  const torch::Tensor ya = CausalSelfAttention(a, 4);
  const torch::Tensor yb = GroupedCausalSelfAttention(b, 4, 4, {}, {});
  (ya * up).sum().backward();
  (yb * up).sum().backward();
  EXPECT_TRUE(torch::equal(ya, yb));
  EXPECT_TRUE(torch::equal(a.grad(), b.grad()));
}

TEST(CausalAttention, GroupedRefusesWhatItCannotRun) {
  const torch::Tensor qkv = torch::zeros({1, 8, (4 + 2 * 2) * 6});
  const auto [cos, sin] = Tables(8, 6);
  EXPECT_TRUE(GroupedCausalSelfAttentionSupports(qkv, 4, 2, cos, sin));
  EXPECT_FALSE(GroupedCausalSelfAttentionSupports(qkv, 4, 3, {}, {}));      // 3 does not divide 4
  EXPECT_FALSE(GroupedCausalSelfAttentionSupports(qkv, 4, 2, cos, {}));     // one table
  EXPECT_FALSE(GroupedCausalSelfAttentionSupports(qkv, 4, 2, cos.narrow(0, 0, 4),
                                                  sin.narrow(0, 0, 4)));  // too few positions
  EXPECT_FALSE(GroupedCausalSelfAttentionSupports(qkv.to(torch::kDouble), 4, 2, {}, {}));
  const torch::Tensor odd = torch::zeros({1, 8, (2 + 2) * 5});  // hd 5
  const auto [cos5, sin5] = Tables(8, 6);
  EXPECT_FALSE(GroupedCausalSelfAttentionSupports(odd, 2, 1, cos5.narrow(1, 0, 5).contiguous(),
                                                  sin5.narrow(1, 0, 5).contiguous()));
  EXPECT_THROW(GroupedCausalSelfAttention(qkv, 4, 3, {}, {}), c10::Error);
}

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
