#include "worker/engine/fused_loss.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <torch/autograd.h>
#include <torch/torch.h>

#include "worker/engine/fused_adamw.h"  // BestSimdLevel

#if defined(__FAST_MATH__) || (defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__)
#error "fused_loss.cc propagates inf/NaN; build it without -ffast-math / -ffinite-math-only"
#endif

namespace loom::engine {
namespace {

// ---------------------------------------------------------------------------
// exp(x) for fp32 lanes, after Cephes' expf (S. L. Moshier): x = n·ln2 + r
// with n = round(x·log2 e) and |r| <= ln2/2 (ln2 split into a high part exact
// in fp32 and a low correction), exp(r) by a degree-7 polynomial
// (1 + r + r²·P5(r)), then scaled by 2^n. Relative error ~1e-7 over the
// range used here (x <= 0: arguments are z − max(z)). Inputs are clamped to
// [-87.3, 88.3] so 2^n stays a normal fp32 number: exp of anything below
// -87.3 comes out as ~1e-38 instead of smaller, which changes no sum of a
// softmax row (its largest term is 1).
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f,
                kP3 = 4.1665795894e-2f, kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;
constexpr float kExpLo = -87.3f, kExpHi = 88.3f;

__attribute__((target("avx512f"))) inline __m512 Exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kExpLo)), _mm512_set1_ps(kExpHi));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kP0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP5));
  const __m512 r2 = _mm512_mul_ps(r, r);
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}

__attribute__((target("avx2,fma"))) inline __m256 Exp256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpLo)), _mm256_set1_ps(kExpHi));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kP0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP5));
  const __m256 r2 = _mm256_mul_ps(r, r);
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0f));
  // 2^n through the exponent field; n is in [-126, 128) after the clamp.
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// One row: returns the cross-entropy against `target` and, if scale != 0,
// leaves scale·(softmax − onehot) in z. A row holding NaN or ±inf gives a
// NaN loss (and NaN gradients), so that the caller's non-finite checks see
// it.
double FinishRow(float* z, int64_t vocab, double scale, float max, double sum,
                 float target_logit, bool bad) {
  if (bad || !std::isfinite(max)) {
    if (scale != 0) std::fill(z, z + vocab, std::numeric_limits<float>::quiet_NaN());
    return std::numeric_limits<double>::quiet_NaN();
  }
  const double lse = static_cast<double>(max) + std::log(sum);
  return lse - static_cast<double>(target_logit);
}

double RowScalar(float* z, int64_t vocab, int64_t target, double scale) {
  float max = -std::numeric_limits<float>::infinity();
  bool bad = false;
  for (int64_t j = 0; j < vocab; ++j) {
    bad |= std::isnan(z[j]);
    max = std::max(max, z[j]);
  }
  const float target_logit = z[target];
  double sum = 0;
  if (!bad && std::isfinite(max)) {
    for (int64_t j = 0; j < vocab; ++j) {
      const float e = std::exp(z[j] - max);
      sum += e;
      if (scale != 0) z[j] = e;
    }
  }
  const double loss = FinishRow(z, vocab, scale, max, sum, target_logit, bad);
  if (scale != 0 && std::isfinite(loss)) {
    const float f = static_cast<float>(scale / sum);
    for (int64_t j = 0; j < vocab; ++j) z[j] *= f;
    z[target] -= static_cast<float>(scale);
  }
  return loss;
}

__attribute__((target("avx512f"))) double RowAvx512(float* z, int64_t vocab, int64_t target,
                                                    double scale) {
  const int64_t vec_end = vocab - vocab % 16;
  __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __mmask16 nan_mask = 0;
  for (int64_t j = 0; j < vec_end; j += 16) {
    const __m512 v = _mm512_loadu_ps(z + j);
    nan_mask |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    vmax = _mm512_max_ps(vmax, v);
  }
  float max = _mm512_reduce_max_ps(vmax);
  bool bad = nan_mask != 0;
  for (int64_t j = vec_end; j < vocab; ++j) {
    bad |= std::isnan(z[j]);
    max = std::max(max, z[j]);
  }
  const float target_logit = z[target];
  double sum = 0;
  if (!bad && std::isfinite(max)) {
    const __m512 vm = _mm512_set1_ps(max);
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t j = 0; j < vec_end; j += 16) {
      const __m512 e = Exp512(_mm512_sub_ps(_mm512_loadu_ps(z + j), vm));
      vsum = _mm512_add_ps(vsum, e);
      if (scale != 0) _mm512_storeu_ps(z + j, e);
    }
    sum = _mm512_reduce_add_ps(vsum);
    for (int64_t j = vec_end; j < vocab; ++j) {
      const float e = std::exp(z[j] - max);
      sum += e;
      if (scale != 0) z[j] = e;
    }
  }
  const double loss = FinishRow(z, vocab, scale, max, sum, target_logit, bad);
  if (scale != 0 && std::isfinite(loss)) {
    const float f = static_cast<float>(scale / sum);
    const __m512 vf = _mm512_set1_ps(f);
    for (int64_t j = 0; j < vec_end; j += 16) {
      _mm512_storeu_ps(z + j, _mm512_mul_ps(_mm512_loadu_ps(z + j), vf));
    }
    for (int64_t j = vec_end; j < vocab; ++j) z[j] *= f;
    z[target] -= static_cast<float>(scale);
  }
  return loss;
}

__attribute__((target("avx2,fma"))) double RowAvx2(float* z, int64_t vocab, int64_t target,
                                                   double scale) {
  const int64_t vec_end = vocab - vocab % 8;
  __m256 vmax = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 nan_acc = _mm256_setzero_ps();
  for (int64_t j = 0; j < vec_end; j += 8) {
    const __m256 v = _mm256_loadu_ps(z + j);
    nan_acc = _mm256_or_ps(nan_acc, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    vmax = _mm256_max_ps(vmax, v);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float max = -std::numeric_limits<float>::infinity();
  for (float l : lanes) max = std::max(max, l);
  bool bad = _mm256_movemask_ps(nan_acc) != 0;
  for (int64_t j = vec_end; j < vocab; ++j) {
    bad |= std::isnan(z[j]);
    max = std::max(max, z[j]);
  }
  const float target_logit = z[target];
  double sum = 0;
  if (!bad && std::isfinite(max)) {
    const __m256 vm = _mm256_set1_ps(max);
    __m256 vsum = _mm256_setzero_ps();
    for (int64_t j = 0; j < vec_end; j += 8) {
      const __m256 e = Exp256(_mm256_sub_ps(_mm256_loadu_ps(z + j), vm));
      vsum = _mm256_add_ps(vsum, e);
      if (scale != 0) _mm256_storeu_ps(z + j, e);
    }
    _mm256_store_ps(lanes, vsum);
    for (float l : lanes) sum += l;
    for (int64_t j = vec_end; j < vocab; ++j) {
      const float e = std::exp(z[j] - max);
      sum += e;
      if (scale != 0) z[j] = e;
    }
  }
  const double loss = FinishRow(z, vocab, scale, max, sum, target_logit, bad);
  if (scale != 0 && std::isfinite(loss)) {
    const __m256 vf = _mm256_set1_ps(static_cast<float>(scale / sum));
    for (int64_t j = 0; j < vec_end; j += 8) {
      _mm256_storeu_ps(z + j, _mm256_mul_ps(_mm256_loadu_ps(z + j), vf));
    }
    for (int64_t j = vec_end; j < vocab; ++j) z[j] *= static_cast<float>(scale / sum);
    z[target] -= static_cast<float>(scale);
  }
  return loss;
}

using RowFn = double (*)(float*, int64_t, int64_t, double);

RowFn RowFnFor(SimdLevel wanted) {
  const SimdLevel best = BestSimdLevel();
  SimdLevel level = wanted == SimdLevel::kAuto ? best : std::min(wanted, best);
  switch (level) {
    case SimdLevel::kAvx512:
      return RowAvx512;
    case SimdLevel::kAvx2:
      return RowAvx2;
    default:
      return RowScalar;
  }
}

// ---------------------------------------------------------------------------

struct LossAndGrads {
  torch::Tensor loss;         // 0-dim fp32
  torch::Tensor grad_hidden;  // [N, d] or undefined
  torch::Tensor grad_weight;  // [V, d] or undefined
};

LossAndGrads Compute(const torch::Tensor& hidden, const torch::Tensor& weight,
                     const torch::Tensor& targets, const FusedLossOptions& options,
                     bool want_hidden, bool want_weight) {
  TORCH_CHECK(hidden.scalar_type() == torch::kFloat && weight.scalar_type() == torch::kFloat,
              "FusedLinearCrossEntropy: hidden and weight must be fp32");
  TORCH_CHECK(hidden.device().is_cpu() && weight.device().is_cpu() && targets.device().is_cpu(),
              "FusedLinearCrossEntropy: CPU tensors only");
  TORCH_CHECK(weight.dim() == 2, "FusedLinearCrossEntropy: weight must be [V, d], got ",
              weight.sizes());
  const int64_t vocab = weight.size(0), d = weight.size(1);
  TORCH_CHECK(hidden.dim() >= 1 && hidden.size(-1) == d, "FusedLinearCrossEntropy: hidden ",
              hidden.sizes(), " does not end in d = ", d);
  TORCH_CHECK(targets.scalar_type() == torch::kLong, "FusedLinearCrossEntropy: targets must be int64");
  const torch::Tensor h = hidden.reshape({-1, d}).contiguous();
  const torch::Tensor w = weight.contiguous();
  const torch::Tensor t = targets.reshape({-1}).contiguous();
  const int64_t n = h.size(0);
  TORCH_CHECK(t.numel() == n, "FusedLinearCrossEntropy: ", t.numel(), " targets for ", n,
              " rows");
  TORCH_CHECK(n > 0, "FusedLinearCrossEntropy: no rows");
  const int64_t* target = t.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(target[i] >= 0 && target[i] < vocab, "FusedLinearCrossEntropy: target ",
                target[i], " at row ", i, " outside [0, ", vocab, ")");
  }
  int64_t chunk = options.chunk_rows > 0
                      ? options.chunk_rows
                      : options.chunk_bytes / (vocab * static_cast<int64_t>(sizeof(float)));
  chunk = std::clamp<int64_t>(chunk, 1, n);

  const bool want_grad = want_hidden || want_weight;
  const double scale = want_grad ? 1.0 / static_cast<double>(n) : 0.0;
  LossAndGrads out;
  if (want_hidden) out.grad_hidden = torch::empty({n, d}, h.options());
  if (want_weight) out.grad_weight = torch::empty({vocab, d}, w.options());
  torch::Tensor z = torch::empty({chunk, vocab}, h.options());
  std::vector<double> row_loss(n);
  const RowFn row_fn = RowFnFor(SimdLevel::kAuto);
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t rows = std::min(chunk, n - start);
    torch::Tensor zc = z.narrow(0, 0, rows);
    const torch::Tensor hc = h.narrow(0, start, rows);
    torch::mm_out(zc, hc, w.t());
    float* zp = zc.data_ptr<float>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      row_loss[start + i] = row_fn(zp + i * vocab, vocab, target[start + i], scale);
    }
    if (want_hidden) {
      torch::Tensor gh = out.grad_hidden.narrow(0, start, rows);
      torch::mm_out(gh, zc, w);
    }
    if (want_weight) {
      if (start == 0) {
        torch::mm_out(out.grad_weight, zc.t(), hc);
      } else {
        out.grad_weight.addmm_(zc.t(), hc);
      }
    }
  }
  double total = 0;
  for (double l : row_loss) total += l;
  out.loss = torch::scalar_tensor(total / static_cast<double>(n), h.options());
  if (want_hidden) out.grad_hidden = out.grad_hidden.view(hidden.sizes());
  return out;
}

class FusedLinearCrossEntropyFunction
    : public torch::autograd::Function<FusedLinearCrossEntropyFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor hidden,
                               torch::Tensor weight, torch::Tensor targets, int64_t chunk_rows,
                               int64_t chunk_bytes, bool want_hidden, bool want_weight) {
    FusedLossOptions options;
    options.chunk_rows = chunk_rows;
    options.chunk_bytes = chunk_bytes;
    LossAndGrads r = Compute(hidden, weight, targets, options, want_hidden, want_weight);
    ctx->saved_data["grad_hidden"] = r.grad_hidden;
    ctx->saved_data["grad_weight"] = r.grad_weight;
    return r.loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const torch::Tensor g = grad_outputs[0];
    auto scaled = [&](const char* key) -> torch::Tensor {
      const c10::IValue& saved = ctx->saved_data[key];
      if (!saved.isTensor()) return torch::Tensor();
      const torch::Tensor t = saved.toTensor();
      if (!t.defined()) return t;
      return t * g;
    };
    return {scaled("grad_hidden"), scaled("grad_weight"), torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

void SoftmaxCrossEntropyRows(float* logits, int64_t rows, int64_t vocab, const int64_t* target,
                             double grad_scale, double* row_loss, SimdLevel simd) {
  const RowFn row_fn = RowFnFor(simd);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    row_loss[i] = row_fn(logits + i * vocab, vocab, target[i], grad_scale);
  }
}

torch::Tensor FusedLinearCrossEntropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                      const torch::Tensor& targets,
                                      const FusedLossOptions& options) {
  const bool grad_mode = torch::GradMode::is_enabled();
  const bool want_hidden = grad_mode && hidden.requires_grad();
  const bool want_weight = grad_mode && weight.requires_grad();
  if (!want_hidden && !want_weight) {
    return Compute(hidden, weight, targets, options, false, false).loss;
  }
  return FusedLinearCrossEntropyFunction::apply(hidden, weight, targets, options.chunk_rows,
                                                options.chunk_bytes, want_hidden, want_weight);
}

}  // namespace loom::engine
