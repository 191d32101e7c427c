#include "worker/engine/ops/swiglu.h"

#include <torch/torch.h>

#include "gtest/gtest.h"

namespace loom::engine {
namespace {

double MaxRelative(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item<double>();
}

TEST(SwiGluTest, FusedMatchesTheLibTorchExpressionForwardAndBackward) {
  torch::manual_seed(11);
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{3, 7, 88}, {1, 1, 1}, {257, 96}, {4, 128, 704}}) {
    torch::Tensor g = (torch::randn(shape) * 4).requires_grad_();
    torch::Tensor u = torch::randn(shape).requires_grad_();
    torch::Tensor dh = torch::randn(shape);
    torch::Tensor h = SwiGlu(g, u);
    auto grads = torch::autograd::grad({h}, {g, u}, {dh});
    torch::Tensor g2 = g.detach().clone().requires_grad_(), u2 = u.detach().clone().requires_grad_();
    torch::Tensor h2 = SwiGluReference(g2, u2);
    auto grads2 = torch::autograd::grad({h2}, {g2, u2}, {dh});
    EXPECT_LT(MaxRelative(h, h2), 1e-6) << shape.size();
    EXPECT_LT(MaxRelative(grads[0], grads2[0]), 1e-5);
    EXPECT_LT(MaxRelative(grads[1], grads2[1]), 1e-5);
  }
}

TEST(SwiGluTest, ExtremeGatesStayFiniteAndOtherInputsUseTheExpression) {
  torch::Tensor g = torch::tensor({-1000.0f, -50.0f, 0.0f, 50.0f, 1000.0f}).requires_grad_();
  torch::Tensor u = torch::ones({5}).requires_grad_();
  torch::Tensor h = SwiGlu(g, u);
  EXPECT_TRUE(torch::isfinite(h).all().item<bool>());
  h.sum().backward();
  EXPECT_TRUE(torch::isfinite(g.grad()).all().item<bool>());
  EXPECT_TRUE(torch::isfinite(u.grad()).all().item<bool>());
  EXPECT_NEAR(h[4].item<float>(), 1000.0f, 1e-3);
  EXPECT_NEAR(h[0].item<float>(), 0.0f, 1e-6);
  torch::Tensor gd = torch::randn({4, 8}, torch::kDouble), ud = torch::randn({4, 8}, torch::kDouble);
  EXPECT_TRUE(torch::allclose(SwiGlu(gd, ud), SwiGluReference(gd, ud)));
  torch::Tensor gb = torch::randn({4, 8}).to(torch::kBFloat16);
  EXPECT_EQ(SwiGlu(gb, gb).scalar_type(), torch::kBFloat16);
}

}  // namespace
}  // namespace loom::engine
