#include "worker/engine/ops/gelu.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include <torch/autograd.h>
#include <torch/torch.h>

#include "worker/engine/ops/cpu_features.h"
#include "worker/engine/ops/simd_exp.h"

#if defined(__FAST_MATH__) || (defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__)
#error "gelu.cc propagates inf/NaN; build it without -ffast-math / -ffinite-math-only"
#endif

namespace loom::engine {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
// Elements per OpenMP work item (a multiple of 16).
constexpr int64_t kGrain = 16384;

// ½·(1 + tanh(u)) = σ(2u) = 1/(1 + e^{−2u}): no cancellation where
// tanh(u) → −1 (1 + tanh(u) computed directly loses all digits there, ~4e-5
// relative at x = −3). The exp's clamp keeps e^{−2u} finite, so σ
// saturates to 0 or 1.
__attribute__((target("avx512f"))) inline __m512 Sigmoid2u512(__m512 u) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 e = simd::Exp512(_mm512_mul_ps(_mm512_set1_ps(-2.0f), u));
  return _mm512_div_ps(one, _mm512_add_ps(one, e));
}

__attribute__((target("avx512f"))) inline __m512 Inner512(__m512 x) {
  // u = √(2/π)·(x + 0.044715·x³) = √(2/π)·x·(1 + 0.044715·x²)
  const __m512 x2 = _mm512_mul_ps(x, x);
  const __m512 poly = _mm512_fmadd_ps(_mm512_set1_ps(kCubic), x2, _mm512_set1_ps(1.0f));
  return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(kSqrt2OverPi), x), poly);
}

// gelu(x) = x·σ(2u)
__attribute__((target("avx512f"))) void ForwardAvx512(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(v, Sigmoid2u512(Inner512(v))));
  }
}

// gelu'(x) = s + 2·x·s·(1 − s)·du/dx with s = σ(2u) (½(1 + t) = s and
// ½(1 − t²) = 2·s·(1 − s)), du/dx = √(2/π)·(1 + 3·0.044715·x²).
__attribute__((target("avx512f"))) void BackwardAvx512(const float* x, const float* dy,
                                                       float* dx, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f), two = _mm512_set1_ps(2.0f);
  const __m512 c = _mm512_set1_ps(kSqrt2OverPi), c3 = _mm512_set1_ps(3.0f * kCubic);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    // s = 1/(1 + e) and 1 − s = e·s, which keeps its digits where s → 1.
    const __m512 e = simd::Exp512(_mm512_mul_ps(_mm512_set1_ps(-2.0f), Inner512(v)));
    const __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, e));
    const __m512 du = _mm512_mul_ps(c, _mm512_fmadd_ps(c3, _mm512_mul_ps(v, v), one));
    const __m512 tail = _mm512_mul_ps(_mm512_mul_ps(two, v),
                                      _mm512_mul_ps(_mm512_mul_ps(s, _mm512_mul_ps(e, s)), du));
    const __m512 grad = _mm512_add_ps(s, tail);
    _mm512_mask_storeu_ps(dx + i, m, _mm512_mul_ps(grad, _mm512_maskz_loadu_ps(m, dy + i)));
  }
}

bool UseKernel(const torch::Tensor& x) {
  static const bool avx512 = BestSimdLevel() >= SimdLevel::kAvx512;
  return avx512 && x.device().is_cpu() && x.scalar_type() == torch::kFloat && x.numel() > 0;
}

class GeluTanhFunction : public torch::autograd::Function<GeluTanhFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x_in) {
    const torch::Tensor x = x_in.contiguous();
    torch::Tensor y = torch::empty_like(x);
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const int64_t n = x.numel();
#pragma omp parallel for schedule(static)
    for (int64_t start = 0; start < n; start += kGrain) {
      ForwardAvx512(xp + start, yp + start, std::min(kGrain, n - start));
    }
    ctx->save_for_backward({x});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const torch::Tensor x = ctx->get_saved_variables()[0];
    const torch::Tensor dy = grad_outputs[0].contiguous();
    torch::Tensor dx = torch::empty_like(x);
    const float* xp = x.data_ptr<float>();
    const float* dyp = dy.data_ptr<float>();
    float* dxp = dx.data_ptr<float>();
    const int64_t n = x.numel();
#pragma omp parallel for schedule(static)
    for (int64_t start = 0; start < n; start += kGrain) {
      BackwardAvx512(xp + start, dyp + start, dxp + start, std::min(kGrain, n - start));
    }
    return {dx};
  }
};

}  // namespace

torch::Tensor GeluTanh(const torch::Tensor& x) {
  if (!UseKernel(x)) return torch::gelu(x, /*approximate=*/"tanh");
  return GeluTanhFunction::apply(x);
}

}  // namespace loom::engine
