#include "worker/engine/ops/rms_norm.h"

#include <torch/torch.h>

#include "gtest/gtest.h"

namespace loom::engine {
namespace {

double MaxRelative(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item<double>();
}

TEST(RmsNormTest, FusedMatchesTheLibTorchExpressionForwardAndBackward) {
  torch::manual_seed(5);
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{3, 7, 32}, {1, 1, 5}, {257, 96}, {4, 128, 256}}) {
    const int64_t d = shape.back();
    torch::Tensor x = (torch::randn(shape) * 3).requires_grad_();
    torch::Tensor w = (torch::randn({d}) + 1).requires_grad_();
    torch::Tensor dy = torch::randn(shape);
    torch::Tensor y = RmsNorm(x, w, 1e-5);
    auto grads = torch::autograd::grad({y}, {x, w}, {dy});
    torch::Tensor x2 = x.detach().clone().requires_grad_(), w2 = w.detach().clone().requires_grad_();
    torch::Tensor y2 = RmsNormReference(x2, w2, 1e-5);
    auto grads2 = torch::autograd::grad({y2}, {x2, w2}, {dy});
    EXPECT_LT(MaxRelative(y, y2), 1e-6) << shape.size();
    EXPECT_LT(MaxRelative(grads[0], grads2[0]), 1e-5);
    EXPECT_LT(MaxRelative(grads[1], grads2[1]), 1e-5);
  }
}

TEST(RmsNormTest, NonFloatInputsUseTheExpressionAndAZeroRowStaysFinite) {
  torch::Tensor x = torch::randn({4, 16}, torch::kDouble);
  torch::Tensor w = torch::ones({16}, torch::kDouble);
  EXPECT_TRUE(torch::allclose(RmsNorm(x, w, 1e-5), RmsNormReference(x, w, 1e-5)));
  torch::Tensor zero = torch::zeros({2, 8}).requires_grad_();
  torch::Tensor y = RmsNorm(zero, torch::ones({8}), 1e-5);
  EXPECT_TRUE(torch::isfinite(y).all().item<bool>());
  y.sum().backward();
  EXPECT_TRUE(torch::isfinite(zero.grad()).all().item<bool>());
}

}  // namespace
}  // namespace loom::engine
