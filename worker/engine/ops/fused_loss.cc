#include "worker/engine/ops/fused_loss.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>
#include <torch/torch.h>

#include "worker/engine/ops/cpu_features.h"
#include "worker/engine/ops/simd_exp.h"

#if defined(__FAST_MATH__) || (defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__)
#error "fused_loss.cc propagates inf/NaN; build it without -ffast-math / -ffinite-math-only"
#endif

namespace loom::engine {
namespace {

using simd::Exp256;
using simd::Exp512;

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

// One call's inputs, checked and flattened.
struct Inputs {
  torch::Tensor h;  // [N, d], contiguous
  torch::Tensor w;  // [V, d], contiguous
  torch::Tensor t;  // [N] int64, contiguous
  int64_t n = 0;
  int64_t vocab = 0;
  int64_t d = 0;
  int64_t chunk = 0;  // rows per chunk, in [1, N]
  // The products' dtype: the inputs' own, or bf16/fp16 for fp32 inputs.
  c10::ScalarType matmul_dtype = c10::ScalarType::Float;
};

Inputs CheckInputs(const torch::Tensor& hidden, const torch::Tensor& weight,
                   const torch::Tensor& targets, const FusedLossOptions& options) {
  const c10::ScalarType dtype = hidden.scalar_type();
  TORCH_CHECK(weight.scalar_type() == dtype &&
                  (dtype == torch::kFloat || dtype == torch::kBFloat16 || dtype == torch::kHalf),
              "FusedLinearCrossEntropy: hidden and weight must both be fp32, bf16 or fp16, got ",
              hidden.scalar_type(), " and ", weight.scalar_type());
  TORCH_CHECK(weight.device() == hidden.device() && targets.device() == hidden.device(),
              "FusedLinearCrossEntropy: hidden, weight and targets must be on one device, got ",
              hidden.device(), ", ", weight.device(), " and ", targets.device());
  TORCH_CHECK(weight.dim() == 2, "FusedLinearCrossEntropy: weight must be [V, d], got ",
              weight.sizes());
  Inputs in;
  in.vocab = weight.size(0);
  in.d = weight.size(1);
  TORCH_CHECK(hidden.dim() >= 1 && hidden.size(-1) == in.d, "FusedLinearCrossEntropy: hidden ",
              hidden.sizes(), " does not end in d = ", in.d);
  TORCH_CHECK(targets.scalar_type() == torch::kLong, "FusedLinearCrossEntropy: targets must be int64");
  in.matmul_dtype = dtype;
  if (options.matmul_dtype != c10::ScalarType::Undefined && options.matmul_dtype != dtype) {
    TORCH_CHECK(dtype == torch::kFloat && (options.matmul_dtype == torch::kBFloat16 ||
                                           options.matmul_dtype == torch::kHalf),
                "FusedLinearCrossEntropy: matmul_dtype must be bf16 or fp16 with fp32 inputs "
                "(or the inputs' own dtype), got ",
                options.matmul_dtype, " with ", dtype, " inputs");
    in.matmul_dtype = options.matmul_dtype;
  }
  in.h = hidden.reshape({-1, in.d}).contiguous();
  in.w = weight.contiguous();
  in.t = targets.reshape({-1}).contiguous();
  in.n = in.h.size(0);
  TORCH_CHECK(in.t.numel() == in.n, "FusedLinearCrossEntropy: ", in.t.numel(), " targets for ",
              in.n, " rows");
  TORCH_CHECK(in.n > 0, "FusedLinearCrossEntropy: no rows");
  // The chunk is fp32 whatever the inputs' dtype.
  const int64_t chunk =
      options.chunk_rows > 0
          ? options.chunk_rows
          : options.chunk_bytes / (in.vocab * static_cast<int64_t>(sizeof(float)));
  in.chunk = std::clamp<int64_t>(chunk, 1, in.n);
  return in;
}

// fp32 CPU tensors: the row kernel above between the matrix products.
LossAndGrads ComputeCpuKernel(const Inputs& in, bool want_hidden, bool want_weight) {
  const torch::Tensor& h = in.h;
  const torch::Tensor& w = in.w;
  const int64_t n = in.n, vocab = in.vocab, d = in.d, chunk = in.chunk;
  const int64_t* target = in.t.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(target[i] >= 0 && target[i] < vocab, "FusedLinearCrossEntropy: target ",
                target[i], " at row ", i, " outside [0, ", vocab, ")");
  }

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
  return out;
}

// Any device, fp32/bf16/fp16: the same chunked algorithm in LibTorch
// operations, which never read a tensor on the host except for one check of
// the targets. Per chunk: Z = h_c @ W^T in the products' dtype (fp32
// accumulation, as cuBLAS and LibTorch's CPU kernels do for bf16/fp16),
// taken to fp32; lse = logsumexp(Z) and loss = lse − Z[t] in fp32, summed in
// double. With fp32 products: G = (exp(Z − lse) − onehot) / N in fp32,
// overwriting Z, for grad_hidden_c = G @ W and grad_W += G^T @ h_c, every
// step fp32 as in the CPU kernel. With bf16/fp16 products: exp(Z − lse) −
// onehot is rounded to that dtype unscaled, and the two products are taken
// to fp32 and multiplied by 1/N there; grad_W is summed over chunks in fp32,
// and both gradients are rounded to the inputs' dtype once at the end (not
// at all for fp32 inputs). Non-finite logits give a non-finite loss and
// gradients (logsumexp propagates NaN and inf).
LossAndGrads ComputeGeneric(const Inputs& in, bool want_hidden, bool want_weight) {
  const torch::Tensor& h = in.h;
  const torch::Tensor& w = in.w;
  const int64_t n = in.n, vocab = in.vocab, d = in.d, chunk = in.chunk;
  const c10::ScalarType dtype = h.scalar_type();
  const c10::ScalarType mm_dtype = in.matmul_dtype;
  const bool fp32 = mm_dtype == torch::kFloat;
  const torch::TensorOptions f32 = h.options().dtype(torch::kFloat);
  // The products' operands: the inputs themselves, or one lower-precision
  // copy of each for the whole call (to() returns the tensor itself when it
  // has the dtype already).
  const torch::Tensor hm = h.to(mm_dtype);
  const torch::Tensor wm = w.to(mm_dtype);
  const torch::Tensor bad = in.t.lt(0).logical_or(in.t.ge(vocab));
  if (bad.any().item<bool>()) {
    const int64_t row = bad.nonzero()[0][0].item<int64_t>();
    TORCH_CHECK(false, "FusedLinearCrossEntropy: target ", in.t[row].item<int64_t>(), " at row ",
                row, " outside [0, ", vocab, ")");
  }

  const bool want_grad = want_hidden || want_weight;
  const double scale = 1.0 / static_cast<double>(n);
  LossAndGrads out;
  torch::Tensor grad_hidden;  // fp32 unless the products are the inputs' lower dtype
  if (want_hidden) grad_hidden = torch::empty({n, d}, fp32 ? h.options() : f32);
  torch::Tensor grad_weight;  // fp32, summed over chunks
  if (want_weight) grad_weight = torch::empty({vocab, d}, f32);
  torch::Tensor z = torch::empty({chunk, vocab}, f32);
  const torch::Tensor minus_one = torch::full({chunk, 1}, -1.0, f32);
  torch::Tensor loss_sum = torch::zeros({}, h.options().dtype(torch::kDouble));
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t rows = std::min(chunk, n - start);
    torch::Tensor zc = z.narrow(0, 0, rows);
    const torch::Tensor hc = hm.narrow(0, start, rows);
    const torch::Tensor tc = in.t.narrow(0, start, rows).unsqueeze(1);  // [rows, 1]
    if (fp32) {
      torch::mm_out(zc, hc, wm.t());
    } else {
      zc.copy_(torch::mm(hc, wm.t()));
    }
    const torch::Tensor lse = torch::logsumexp(zc, /*dim=*/1, /*keepdim=*/true);  // [rows, 1]
    loss_sum.add_((lse - zc.gather(1, tc)).sum(torch::kDouble));
    if (!want_grad) continue;
    zc.sub_(lse).exp_();  // softmax
    zc.scatter_add_(1, tc, minus_one.narrow(0, 0, rows));
    if (fp32) {
      zc.mul_(scale);
      if (want_hidden) {
        torch::Tensor gh = grad_hidden.narrow(0, start, rows);
        torch::mm_out(gh, zc, wm);
      }
      if (want_weight) {
        if (start == 0) {
          torch::mm_out(grad_weight, zc.t(), hc);
        } else {
          grad_weight.addmm_(zc.t(), hc);
        }
      }
      continue;
    }
    const torch::Tensor g = zc.to(mm_dtype);  // softmax − onehot, unscaled
    if (want_hidden) {
      grad_hidden.narrow(0, start, rows).copy_(torch::mm(g, wm)).mul_(scale);
    }
    if (want_weight) {
      if (start == 0) {
        grad_weight.copy_(torch::mm(g.t(), hc));
      } else {
        grad_weight.add_(torch::mm(g.t(), hc));
      }
    }
  }
  out.loss = loss_sum.div(static_cast<double>(n)).to(torch::kFloat);
  if (want_weight && !fp32) grad_weight.mul_(scale);
  if (want_hidden) out.grad_hidden = grad_hidden.to(dtype);
  if (want_weight) out.grad_weight = grad_weight.to(dtype);
  return out;
}

LossAndGrads Compute(const torch::Tensor& hidden, const torch::Tensor& weight,
                     const torch::Tensor& targets, const FusedLossOptions& options,
                     bool want_hidden, bool want_weight) {
  // The products run in the inputs' dtype: an enclosing autocast region
  // must not recast them (a no-op when autocast is off).
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const Inputs in = CheckInputs(hidden, weight, targets, options);
  const bool cpu_kernel = !options.force_generic && in.h.device().is_cpu() &&
                          in.h.scalar_type() == torch::kFloat &&
                          in.matmul_dtype == torch::kFloat;
  LossAndGrads out = cpu_kernel ? ComputeCpuKernel(in, want_hidden, want_weight)
                                : ComputeGeneric(in, want_hidden, want_weight);
  if (want_hidden) out.grad_hidden = out.grad_hidden.view(hidden.sizes());
  return out;
}

class FusedLinearCrossEntropyFunction
    : public torch::autograd::Function<FusedLinearCrossEntropyFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor hidden,
                               torch::Tensor weight, torch::Tensor targets, int64_t chunk_rows,
                               int64_t chunk_bytes, bool force_generic, int64_t matmul_dtype,
                               bool want_hidden, bool want_weight) {
    FusedLossOptions options;
    options.chunk_rows = chunk_rows;
    options.chunk_bytes = chunk_bytes;
    options.force_generic = force_generic;
    options.matmul_dtype = static_cast<c10::ScalarType>(matmul_dtype);
    LossAndGrads r = Compute(hidden, weight, targets, options, want_hidden, want_weight);
    ctx->saved_data["grad_hidden"] = r.grad_hidden;
    ctx->saved_data["grad_weight"] = r.grad_weight;
    return r.loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const torch::Tensor g = grad_outputs[0];
    // The usual incoming gradient is exactly 1 (loss.backward(), or a
    // micro-batch mean divided by 1): hand the stored gradients over as they
    // are, releasing the context's reference so that autograd may accumulate
    // into them in place (the tied embedding's gradient is added to
    // grad_weight without a copy). Otherwise scale them. On a GPU reading g
    // would wait for the stream, so there they are scaled in place (the
    // context held the only reference to them).
    const bool on_cpu = g.device().is_cpu();
    const bool unit = on_cpu && g.numel() == 1 && g.item<double>() == 1.0;
    auto take = [&](const char* key) -> torch::Tensor {
      auto it = ctx->saved_data.find(key);
      TORCH_CHECK(it != ctx->saved_data.end(),
                  "FusedLinearCrossEntropy: backward called twice (its gradients are computed "
                  "once, in forward)");
      const c10::IValue saved = std::move(it->second);
      ctx->saved_data.erase(it);
      if (!saved.isTensor()) return torch::Tensor();
      torch::Tensor t = saved.toTensor();
      if (!t.defined() || unit) return t;
      if (!on_cpu) return t.mul_(g);
      return t * g;
    };
    torch::Tensor grad_hidden = take("grad_hidden");
    torch::Tensor grad_weight = take("grad_weight");
    // One entry per forward argument: hidden, weight, then none for targets
    // and the six options.
    return {grad_hidden,     grad_weight,     torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
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
  return FusedLinearCrossEntropyFunction::apply(
      hidden, weight, targets, options.chunk_rows, options.chunk_bytes, options.force_generic,
      static_cast<int64_t>(options.matmul_dtype), want_hidden, want_weight);
}

}  // namespace loom::engine
