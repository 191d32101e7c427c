#include "worker/engine/ops/swiglu.h"

#include <torch/autograd.h>
#include <torch/torch.h>

namespace loom::engine {
namespace {

class SwiGluFunction : public torch::autograd::Function<SwiGluFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor gate_in,
                               torch::Tensor up_in) {
    const torch::Tensor g = gate_in.contiguous(), u = up_in.contiguous();
    // sigmoid by LibTorch's vectorized kernel (SLEEF's exp), written into
    // h, then the products in place in one more pass.
    torch::Tensor h = torch::sigmoid(g);
    const float* gp = g.data_ptr<float>();
    const float* up = u.data_ptr<float>();
    float* hp = h.data_ptr<float>();
    const int64_t n = g.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) hp[i] = gp[i] * hp[i] * up[i];
    ctx->save_for_backward({g, u});
    return h;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor g = saved[0], u = saved[1];
    const torch::Tensor dh = grad_outputs[0].contiguous();
    // sigmoid again (vectorized, into dg), then both gradients in one pass.
    torch::Tensor dg = torch::sigmoid(g), du = torch::empty_like(u);
    const float* gp = g.data_ptr<float>();
    const float* up = u.data_ptr<float>();
    const float* dhp = dh.data_ptr<float>();
    float* dgp = dg.data_ptr<float>();
    float* dup = du.data_ptr<float>();
    const int64_t n = g.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float s = dgp[i];
      const float silu = gp[i] * s;
      dup[i] = dhp[i] * silu;
      dgp[i] = dhp[i] * up[i] * (s + silu * (1.0f - s));
    }
    return {dg, du};
  }
};

bool UseKernel(const torch::Tensor& gate, const torch::Tensor& up) {
  return gate.device().is_cpu() && up.device().is_cpu() && gate.scalar_type() == torch::kFloat &&
         up.scalar_type() == torch::kFloat && gate.sizes() == up.sizes() && gate.numel() > 0;
}

}  // namespace

torch::Tensor SwiGluReference(const torch::Tensor& gate, const torch::Tensor& up) {
  return torch::silu(gate) * up;
}

torch::Tensor SwiGlu(const torch::Tensor& gate, const torch::Tensor& up) {
  if (!UseKernel(gate, up)) return SwiGluReference(gate, up);
  return SwiGluFunction::apply(gate, up);
}

}  // namespace loom::engine
