#include "worker/engine/ops/rms_norm.h"

#include <omp.h>

#include <cmath>
#include <vector>

#include <torch/autograd.h>
#include <torch/torch.h>

namespace loom::engine {
namespace {

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x_in,
                               torch::Tensor w_in, double eps) {
    const torch::Tensor x = x_in.contiguous(), w = w_in.contiguous();
    const int64_t d = x.size(-1), rows = x.numel() / d;
    torch::Tensor y = torch::empty_like(x);
    torch::Tensor r = torch::empty({rows}, x.options());
    const float* xp = x.data_ptr<float>();
    const float* wp = w.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    float* rp = r.data_ptr<float>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      const float* xi = xp + i * d;
      float* yi = yp + i * d;
      double ss = 0;
      for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(xi[j]) * xi[j];
      const float ri = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
      rp[i] = ri;
      for (int64_t j = 0; j < d; ++j) yi[j] = xi[j] * ri * wp[j];
    }
    ctx->save_for_backward({x, w, r});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor x = saved[0], w = saved[1], r = saved[2];
    const torch::Tensor dy = grad_outputs[0].contiguous();
    const int64_t d = x.size(-1), rows = x.numel() / d;
    torch::Tensor dx = torch::empty_like(x);
    const float* xp = x.data_ptr<float>();
    const float* wp = w.data_ptr<float>();
    const float* rp = r.data_ptr<float>();
    const float* dyp = dy.data_ptr<float>();
    float* dxp = dx.data_ptr<float>();
    const int threads = omp_get_max_threads();
    // Per-thread partial sums of dw, added in thread order.
    std::vector<double> partial(static_cast<size_t>(threads) * d, 0.0);
#pragma omp parallel num_threads(threads)
    {
      double* dw = partial.data() + static_cast<size_t>(omp_get_thread_num()) * d;
#pragma omp for schedule(static)
      for (int64_t i = 0; i < rows; ++i) {
        const float* xi = xp + i * d;
        const float* dyi = dyp + i * d;
        float* dxi = dxp + i * d;
        const float ri = rp[i];
        double dot = 0;  // Σ dy·w·x
        for (int64_t j = 0; j < d; ++j) {
          dot += static_cast<double>(dyi[j]) * wp[j] * xi[j];
          dw[j] += static_cast<double>(dyi[j]) * xi[j] * ri;
        }
        const float c = static_cast<float>(dot / static_cast<double>(d)) * ri * ri;
        for (int64_t j = 0; j < d; ++j) dxi[j] = ri * (dyi[j] * wp[j] - xi[j] * c);
      }
    }
    torch::Tensor dw = torch::zeros({d}, torch::kDouble);
    double* dwp = dw.data_ptr<double>();
    for (int t = 0; t < threads; ++t) {
      for (int64_t j = 0; j < d; ++j) dwp[j] += partial[static_cast<size_t>(t) * d + j];
    }
    return {dx, dw.to(torch::kFloat), torch::Tensor()};
  }
};

bool UseKernel(const torch::Tensor& x, const torch::Tensor& w) {
  return x.device().is_cpu() && w.device().is_cpu() && x.scalar_type() == torch::kFloat &&
         w.scalar_type() == torch::kFloat && x.dim() >= 1 && x.size(-1) == w.numel() &&
         x.numel() > 0;
}

}  // namespace

torch::Tensor RmsNormReference(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const torch::Tensor xf = x.to(torch::kFloat);
  const torch::Tensor normed = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (normed * weight).to(x.scalar_type());
}

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  if (!UseKernel(x, weight)) return RmsNormReference(x, weight, eps);
  return RmsNormFunction::apply(x, weight, eps);
}

}  // namespace loom::engine
