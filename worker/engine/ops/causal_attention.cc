#include "worker/engine/ops/causal_attention.h"

#include <dlfcn.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include <torch/autograd.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "worker/engine/ops/cpu_features.h"
#include "worker/engine/ops/simd_exp.h"

#if defined(__FAST_MATH__) || (defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__)
#error "causal_attention.cc propagates inf/NaN; build it without -ffast-math / -ffinite-math-only"
#endif

// Fortran BLAS (column-major); gfortran-style hidden CHARACTER lengths last.
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n,
                       const int* k, const float* alpha, const float* a, const int* lda,
                       const float* b, const int* ldb, const float* beta, float* c,
                       const int* ldc, size_t transa_len, size_t transb_len);

namespace loom::engine {
namespace {

// Row-major C[m×n] = alpha·op(A)[m×k]·op(B)[k×n] + beta·C, through the
// column-major sgemm as Cᵀ = op(B)ᵀ·op(A)ᵀ.
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc) {
  const char ta = trans_b ? 'T' : 'N', tb = trans_a ? 'T' : 'N';
  const int im = static_cast<int>(n), in = static_cast<int>(m), ik = static_cast<int>(k);
  const int ilda = static_cast<int>(ldb), ildb = static_cast<int>(lda),
            ildc = static_cast<int>(ldc);
  sgemm_(&ta, &tb, &im, &in, &ik, &alpha, b, &ilda, a, &ildb, &beta, c, &ildc, 1, 1);
}

// Keeps the BLAS on one thread per call while it lives. Each OpenMP thread
// here makes its own small products; OpenBLAS's pthreads build (the
// libopenblas.so.0 Debian's LibTorch links) would otherwise start its own
// threads inside every call and oversubscribe the cores (measured: 4x
// slower than the unfused path instead of 4x faster). The setting is
// process-wide; only the training thread runs LibTorch compute meanwhile.
// Other BLAS libraries lack the symbols and are left alone.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() {
    using GetFn = int (*)();
    static const auto get =
        reinterpret_cast<GetFn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
    if (Set() == nullptr || get == nullptr) return;
    previous_ = get();
    if (previous_ != 1) Set()(1);
  }
  ~SingleThreadedBlas() {
    if (previous_ > 1) Set()(previous_);
  }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  using SetFn = void (*)(int);
  static SetFn Set() {
    static const auto set =
        reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
    return set;
  }
  int previous_ = 0;
};

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Softmax of s[0, visible) in place; zeros s[visible, width). A NaN or an
// infinity among the visible entries makes the whole row NaN.
void SoftmaxRowScalar(float* s, int64_t visible, int64_t width) {
  float max = -std::numeric_limits<float>::infinity();
  bool bad = false;
  for (int64_t j = 0; j < visible; ++j) {
    bad |= !std::isfinite(s[j]);
    max = std::max(max, s[j]);
  }
  if (bad) {
    std::fill(s, s + visible, kNaN);
  } else {
    float sum = 0;
    for (int64_t j = 0; j < visible; ++j) {
      s[j] = std::exp(s[j] - max);
      sum += s[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < visible; ++j) s[j] *= inv;
  }
  std::fill(s + visible, s + width, 0.0f);
}

// ds[j] = p[j]·(dp[j] − Σ_k p[k]·dp[k]) over the visible entries (ds may be
// dp); zeros ds[visible, width).
void SoftmaxBackwardRowScalar(const float* p, float* dp, int64_t visible, int64_t width) {
  float dot = 0;
  for (int64_t j = 0; j < visible; ++j) dot += p[j] * dp[j];
  for (int64_t j = 0; j < visible; ++j) dp[j] = p[j] * (dp[j] - dot);
  std::fill(dp + visible, dp + width, 0.0f);
}

__attribute__((target("avx512f"))) void SoftmaxRowAvx512(float* s, int64_t visible,
                                                         int64_t width) {
  const int64_t full = visible - visible % 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (visible % 16)) - 1);
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 vmax = ninf;
  // x − x is 0 for finite x and NaN for NaN or ±inf: one test for both.
  __m512 bad = _mm512_setzero_ps();
  for (int64_t j = 0; j < full; j += 16) {
    const __m512 v = _mm512_loadu_ps(s + j);
    vmax = _mm512_max_ps(vmax, v);
    bad = _mm512_add_ps(bad, _mm512_sub_ps(v, v));
  }
  if (tail) {
    const __m512 v = _mm512_mask_loadu_ps(ninf, tail, s + full);
    vmax = _mm512_max_ps(vmax, v);
    const __m512 z = _mm512_maskz_loadu_ps(tail, s + full);
    bad = _mm512_add_ps(bad, _mm512_sub_ps(z, z));
  }
  const float max = _mm512_reduce_max_ps(vmax);
  if (!std::isfinite(_mm512_reduce_add_ps(bad)) || !std::isfinite(max)) {
    std::fill(s, s + visible, kNaN);
  } else {
    const __m512 vm = _mm512_set1_ps(max);
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t j = 0; j < full; j += 16) {
      const __m512 e = simd::Exp512(_mm512_sub_ps(_mm512_loadu_ps(s + j), vm));
      vsum = _mm512_add_ps(vsum, e);
      _mm512_storeu_ps(s + j, e);
    }
    if (tail) {
      const __m512 e =
          simd::Exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + full), vm));
      vsum = _mm512_mask_add_ps(vsum, tail, vsum, e);
      _mm512_mask_storeu_ps(s + full, tail, e);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum));
    for (int64_t j = 0; j < full; j += 16) {
      _mm512_storeu_ps(s + j, _mm512_mul_ps(_mm512_loadu_ps(s + j), inv));
    }
    if (tail) {
      _mm512_mask_storeu_ps(s + full, tail,
                            _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, s + full), inv));
    }
  }
  std::fill(s + visible, s + width, 0.0f);
}

__attribute__((target("avx512f"))) void SoftmaxBackwardRowAvx512(const float* p, float* dp,
                                                                 int64_t visible,
                                                                 int64_t width) {
  const int64_t full = visible - visible % 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (visible % 16)) - 1);
  __m512 vdot = _mm512_setzero_ps();
  for (int64_t j = 0; j < full; j += 16) {
    vdot = _mm512_fmadd_ps(_mm512_loadu_ps(p + j), _mm512_loadu_ps(dp + j), vdot);
  }
  if (tail) {
    vdot = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, p + full),
                           _mm512_maskz_loadu_ps(tail, dp + full), vdot);
  }
  const __m512 dot = _mm512_set1_ps(_mm512_reduce_add_ps(vdot));
  for (int64_t j = 0; j < full; j += 16) {
    const __m512 pv = _mm512_loadu_ps(p + j);
    _mm512_storeu_ps(dp + j, _mm512_mul_ps(pv, _mm512_sub_ps(_mm512_loadu_ps(dp + j), dot)));
  }
  if (tail) {
    const __m512 pv = _mm512_maskz_loadu_ps(tail, p + full);
    _mm512_mask_storeu_ps(
        dp + full, tail,
        _mm512_mul_ps(pv, _mm512_sub_ps(_mm512_maskz_loadu_ps(tail, dp + full), dot)));
  }
  std::fill(dp + visible, dp + width, 0.0f);
}

using SoftmaxRowFn = void (*)(float*, int64_t, int64_t);
using SoftmaxBackwardRowFn = void (*)(const float*, float*, int64_t, int64_t);

struct RowKernels {
  SoftmaxRowFn forward;
  SoftmaxBackwardRowFn backward;
};

RowKernels PickRowKernels() {
  if (BestSimdLevel() >= SimdLevel::kAvx512) {
    return {SoftmaxRowAvx512, SoftmaxBackwardRowAvx512};
  }
  return {SoftmaxRowScalar, SoftmaxBackwardRowScalar};
}

// Shapes of one call, in elements. Row layout of qkv: the n_head query
// heads, then the n_kv key heads, then the n_kv value heads, hd columns
// each; query head h uses key/value head h / group.
struct Geometry {
  int64_t batch, time, n_head, n_kv, hd;
  bool rotary;
  int64_t group() const { return n_head / n_kv; }
  int64_t qkv_ld() const { return (n_head + 2 * n_kv) * hd; }
  int64_t y_ld() const { return n_head * hd; }
  // Offsets of head h's (or key/value head g's) columns in a row.
  int64_t q_col(int64_t h) const { return h * hd; }
  int64_t k_col(int64_t g) const { return (n_head + g) * hd; }
  int64_t v_col(int64_t g) const { return (n_head + n_kv + g) * hd; }
};

Geometry GeometryOf(const torch::Tensor& qkv, int64_t n_head, int64_t n_kv, bool rotary) {
  Geometry g;
  g.batch = qkv.size(0);
  g.time = qkv.size(1);
  g.n_head = n_head;
  g.n_kv = n_kv;
  g.hd = qkv.size(2) / (n_head + 2 * n_kv);
  g.rotary = rotary;
  return g;
}

// Rotary embedding of `rows` rows of one head (half-split form, gpt.h):
// out[r] = x[r]·cos[r] + rotate_half(x[r])·sin[r], with x read at stride
// ldx and out [rows, hd] contiguous. cos/sin: [T, hd], rows from 0.
void RotateRows(const float* x, int64_t ldx, const float* cos, const float* sin, int64_t rows,
                int64_t hd, float* out) {
  const int64_t half = hd / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    const float* c = cos + r * hd;
    const float* sn = sin + r * hd;
    float* o = out + r * hd;
    for (int64_t i = 0; i < half; ++i) o[i] = xr[i] * c[i] - xr[i + half] * sn[i];
    for (int64_t i = half; i < hd; ++i) o[i] = xr[i] * c[i] + xr[i - half] * sn[i];
  }
}

// The gradient through RotateRows: dx[r] = Rᵀ·dy[r], with dy [rows, hd]
// contiguous and dx at stride lddx (overwritten).
void RotateRowsBack(const float* dy, const float* cos, const float* sin, int64_t rows,
                    int64_t hd, float* dx, int64_t lddx) {
  const int64_t half = hd / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const float* d = dy + r * hd;
    const float* c = cos + r * hd;
    const float* sn = sin + r * hd;
    float* o = dx + r * lddx;
    for (int64_t i = 0; i < half; ++i) o[i] = d[i] * c[i] + d[i + half] * sn[i + half];
    for (int64_t i = half; i < hd; ++i) o[i] = d[i] * c[i] - d[i - half] * sn[i - half];
  }
}

// Where one (batch, head) reads its queries and keys: in place in qkv, or
// rotated into the caller's scratch ([T, hd] each).
struct HeadInputs {
  const float* q;
  int64_t ldq;
  const float* k;
  int64_t ldk;
  const float* v;
};

HeadInputs InputsOf(const Geometry& g, const float* qkv, const float* cos, const float* sin,
                    int64_t b, int64_t h, float* q_scratch, float* k_scratch) {
  const int64_t t = g.time, ld = g.qkv_ld(), kv = h / g.group();
  const float* row0 = qkv + b * t * ld;
  HeadInputs in{row0 + g.q_col(h), ld, row0 + g.k_col(kv), ld, row0 + g.v_col(kv)};
  if (g.rotary) {
    RotateRows(in.q, ld, cos, sin, t, g.hd, q_scratch);
    RotateRows(in.k, ld, cos, sin, t, g.hd, k_scratch);
    in.q = q_scratch;
    in.k = k_scratch;
    in.ldq = in.ldk = g.hd;
  }
  return in;
}

// Forward of one (batch, head): fills p [T, T] (rows' visible probabilities,
// zeros to the end of each row's block) and the head's columns of y.
void ForwardHead(const Geometry& g, const RowKernels& k, const HeadInputs& in, float* p,
                 float* y, int64_t b, int64_t h) {
  const int64_t t = g.time, ld = g.qkv_ld(), yld = g.y_ld();
  const float scale = 1.0f / std::sqrt(static_cast<float>(g.hd));
  float* out = y + b * t * yld + h * g.hd;
  for (int64_t r0 = 0; r0 < t; r0 += kCausalAttentionRowBlock) {
    const int64_t r1 = std::min(t, r0 + kCausalAttentionRowBlock), rows = r1 - r0;
    float* s = p + r0 * t;
    // S[r0:r1, 0:r1] = scale · Q[r0:r1] · K[0:r1]ᵀ
    Gemm(false, true, rows, r1, g.hd, scale, in.q + r0 * in.ldq, in.ldq, in.k, in.ldk, 0.0f, s,
         t);
    for (int64_t i = 0; i < rows; ++i) k.forward(s + i * t, r0 + i + 1, r1);
    // Y[r0:r1] = P[r0:r1, 0:r1] · V[0:r1]
    Gemm(false, false, rows, g.hd, r1, 1.0f, s, t, in.v, ld, 0.0f, out + r0 * yld, yld);
  }
}

// Where one (batch, head) writes its gradients: dQ overwritten, dK and dV
// accumulated (zero on entry), each at its own stride; dQ and dK in the
// rotated space when the inputs were rotated.
struct HeadGradients {
  float* dq;
  int64_t lddq;
  float* dk;
  int64_t lddk;
  float* dv;
  int64_t lddv;
};

// Backward of one (batch, head), using `scratch` [T, T] for dP / dS.
void BackwardHead(const Geometry& g, const RowKernels& k, const HeadInputs& in, const float* p,
                  const float* dy, const HeadGradients& out, float* scratch, int64_t b,
                  int64_t h) {
  const int64_t t = g.time, ld = g.qkv_ld(), yld = g.y_ld();
  const float scale = 1.0f / std::sqrt(static_cast<float>(g.hd));
  const float* dout = dy + b * t * yld + h * g.hd;
  for (int64_t r0 = 0; r0 < t; r0 += kCausalAttentionRowBlock) {
    const int64_t r1 = std::min(t, r0 + kCausalAttentionRowBlock), rows = r1 - r0;
    const float* pb = p + r0 * t;
    float* ds = scratch + r0 * t;
    // dV[0:r1] += P[r0:r1, 0:r1]ᵀ · dY[r0:r1]
    Gemm(true, false, r1, g.hd, rows, 1.0f, pb, t, dout + r0 * yld, yld, 1.0f, out.dv,
         out.lddv);
    // dP[r0:r1, 0:r1] = dY[r0:r1] · V[0:r1]ᵀ, then dS in place.
    Gemm(false, true, rows, r1, g.hd, 1.0f, dout + r0 * yld, yld, in.v, ld, 0.0f, ds, t);
    for (int64_t i = 0; i < rows; ++i) k.backward(pb + i * t, ds + i * t, r0 + i + 1, r1);
    // dQ[r0:r1] = scale · dS[r0:r1, 0:r1] · K[0:r1]
    Gemm(false, false, rows, g.hd, r1, scale, ds, t, in.k, in.ldk, 0.0f,
         out.dq + r0 * out.lddq, out.lddq);
    // dK[0:r1] += scale · dS[r0:r1, 0:r1]ᵀ · Q[r0:r1]
    Gemm(true, false, r1, g.hd, rows, scale, ds, t, in.q + r0 * in.ldq, in.ldq, 1.0f, out.dk,
         out.lddk);
  }
}

void CheckSupported(const torch::Tensor& qkv, int64_t n_head, int64_t n_kv_head,
                    const torch::Tensor& cos, const torch::Tensor& sin) {
  TORCH_CHECK(GroupedCausalSelfAttentionSupports(qkv, n_head, n_kv_head, cos, sin),
              "CausalSelfAttention: needs a CPU fp32 qkv [B, T, (n_head + 2 n_kv_head) hd] with "
              "n_kv_head dividing n_head and, for rotary positions, fp32 CPU cos/sin of "
              "[T, hd] with hd even; got qkv ",
              qkv.sizes(), " ", qkv.dtype(), " on ", qkv.device(), ", n_head ", n_head,
              ", n_kv_head ", n_kv_head, cos.defined() ? ", cos " : "",
              cos.defined() ? cos.sizes() : c10::IntArrayRef{});
}

class CausalSelfAttentionFunction
    : public torch::autograd::Function<CausalSelfAttentionFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor qkv_in,
                               int64_t n_head, int64_t n_kv_head, torch::Tensor cos_in,
                               torch::Tensor sin_in) {
    // No rotation: empty tables (autograd's apply takes no undefined input).
    const bool rotary = cos_in.numel() > 0;
    CheckSupported(qkv_in, n_head, n_kv_head, rotary ? cos_in : torch::Tensor(),
                   rotary ? sin_in : torch::Tensor());
    const torch::Tensor qkv = qkv_in.contiguous();
    const torch::Tensor cos = rotary ? cos_in.reshape({qkv.size(1), -1}).contiguous() : cos_in;
    const torch::Tensor sin = rotary ? sin_in.reshape({qkv.size(1), -1}).contiguous() : sin_in;
    const Geometry g = GeometryOf(qkv, n_head, n_kv_head, rotary);
    torch::Tensor y = torch::empty({g.batch, g.time, g.y_ld()}, qkv.options());
    torch::Tensor p = torch::empty({g.batch, g.n_head, g.time, g.time}, qkv.options());
    const RowKernels k = PickRowKernels();
    const float* qkv_ptr = qkv.data_ptr<float>();
    const float* cos_ptr = rotary ? cos.data_ptr<float>() : nullptr;
    const float* sin_ptr = rotary ? sin.data_ptr<float>() : nullptr;
    float* p_ptr = p.data_ptr<float>();
    float* y_ptr = y.data_ptr<float>();
    const int64_t items = g.batch * g.n_head;
    SingleThreadedBlas single_threaded_blas;
#pragma omp parallel
    {
      std::vector<float> rotated(rotary ? static_cast<size_t>(2 * g.time * g.hd) : 0);
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < items; ++i) {
        const int64_t b = i / g.n_head, h = i % g.n_head;
        const HeadInputs in = InputsOf(g, qkv_ptr, cos_ptr, sin_ptr, b, h, rotated.data(),
                                       rotated.data() + g.time * g.hd);
        ForwardHead(g, k, in, p_ptr + i * g.time * g.time, y_ptr, b, h);
      }
    }
    ctx->save_for_backward({qkv, p, cos, sin});
    ctx->saved_data["n_head"] = n_head;
    ctx->saved_data["n_kv_head"] = n_kv_head;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& qkv = saved[0];
    const torch::Tensor& p = saved[1];
    const torch::Tensor& cos = saved[2];
    const torch::Tensor& sin = saved[3];
    const int64_t n_head = ctx->saved_data["n_head"].toInt();
    const int64_t n_kv_head = ctx->saved_data["n_kv_head"].toInt();
    const torch::Tensor dy = grad_outputs[0].contiguous();
    const bool rotary = cos.numel() > 0;
    const Geometry g = GeometryOf(qkv, n_head, n_kv_head, rotary);
    const int64_t t = g.time, hd = g.hd, ld = g.qkv_ld();
    torch::Tensor dqkv = torch::zeros_like(qkv);
    const RowKernels k = PickRowKernels();
    const float* qkv_ptr = qkv.data_ptr<float>();
    const float* cos_ptr = rotary ? cos.data_ptr<float>() : nullptr;
    const float* sin_ptr = rotary ? sin.data_ptr<float>() : nullptr;
    const float* p_ptr = p.data_ptr<float>();
    const float* dy_ptr = dy.data_ptr<float>();
    float* dqkv_ptr = dqkv.data_ptr<float>();
    // Key/value heads shared by several query heads: each head's dK and dV
    // go to a partial [T, hd] of its own (no two threads write one), summed
    // over the group in a fixed order afterwards. dK is also kept apart
    // when rotated, to rotate it back once.
    const bool partials = g.group() > 1 || rotary;
    torch::Tensor dk_part, dv_part;
    if (partials) {
      dk_part = torch::zeros({g.batch, g.n_head, t, hd}, qkv.options());
      if (g.group() > 1) dv_part = torch::zeros({g.batch, g.n_head, t, hd}, qkv.options());
    }
    const int64_t items = g.batch * g.n_head;
    SingleThreadedBlas single_threaded_blas;
#pragma omp parallel
    {
      std::vector<float> scratch(static_cast<size_t>(t * t));
      // Rotated Q and K, and dQ in the rotated space.
      std::vector<float> rotated(rotary ? static_cast<size_t>(3 * t * hd) : 0);
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < items; ++i) {
        const int64_t b = i / g.n_head, h = i % g.n_head, kv = h / g.group();
        const HeadInputs in = InputsOf(g, qkv_ptr, cos_ptr, sin_ptr, b, h, rotated.data(),
                                       rotated.data() + t * hd);
        float* row0 = dqkv_ptr + b * t * ld;
        HeadGradients out{row0 + g.q_col(h), ld, row0 + g.k_col(kv), ld, row0 + g.v_col(kv), ld};
        if (rotary) {
          out.dq = rotated.data() + 2 * t * hd;
          out.lddq = hd;
        }
        if (partials) {
          out.dk = dk_part.data_ptr<float>() + i * t * hd;
          out.lddk = hd;
        }
        if (g.group() > 1) {
          out.dv = dv_part.data_ptr<float>() + i * t * hd;
          out.lddv = hd;
        }
        BackwardHead(g, k, in, p_ptr + i * t * t, dy_ptr, out, scratch.data(), b, h);
        if (rotary) {
          RotateRowsBack(out.dq, cos_ptr, sin_ptr, t, hd, row0 + g.q_col(h), ld);
        }
      }
    }
    if (partials) {
      // Per (batch, key/value head): the group's sum, rotated back.
      const int64_t kv_items = g.batch * g.n_kv;
#pragma omp parallel
      {
        std::vector<float> sum(static_cast<size_t>(t * hd));
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < kv_items; ++i) {
          const int64_t b = i / g.n_kv, kv = i % g.n_kv;
          float* row0 = dqkv_ptr + b * t * ld;
          const int64_t first = b * g.n_head + kv * g.group();
          for (const auto& [part, col, rotate] :
               {std::make_tuple(&dk_part, g.k_col(kv), rotary),
                std::make_tuple(&dv_part, g.v_col(kv), false)}) {
            if (!part->defined()) continue;  // dV written in place (group 1)
            const float* src = part->data_ptr<float>() + first * t * hd;
            std::copy(src, src + t * hd, sum.begin());
            for (int64_t m = 1; m < g.group(); ++m) {
              const float* more = src + m * t * hd;
              for (int64_t e = 0; e < t * hd; ++e) sum[e] += more[e];
            }
            if (rotate) {
              RotateRowsBack(sum.data(), cos_ptr, sin_ptr, t, hd, row0 + col, ld);
            } else {
              for (int64_t r = 0; r < t; ++r) {
                std::copy(sum.begin() + r * hd, sum.begin() + (r + 1) * hd, row0 + col + r * ld);
              }
            }
          }
        }
      }
    }
    return {dqkv, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool GroupedCausalSelfAttentionSupports(const torch::Tensor& qkv, int64_t n_head,
                                        int64_t n_kv_head, const torch::Tensor& cos,
                                        const torch::Tensor& sin) {
  if (!(qkv.defined() && qkv.device().is_cpu() && qkv.scalar_type() == torch::kFloat &&
        qkv.dim() == 3 && n_head > 0 && n_kv_head > 0 && n_head % n_kv_head == 0 &&
        qkv.size(0) > 0 && qkv.size(1) > 0 && qkv.size(2) > 0 &&
        qkv.size(2) % (n_head + 2 * n_kv_head) == 0 &&
        // BLAS dimensions are 32-bit.
        qkv.size(1) <= std::numeric_limits<int>::max() / 4 &&
        qkv.size(2) <= std::numeric_limits<int>::max() / 4)) {
    return false;
  }
  if (cos.defined() != sin.defined()) return false;
  if (!cos.defined()) return true;
  const int64_t hd = qkv.size(2) / (n_head + 2 * n_kv_head);
  for (const torch::Tensor& table : {cos, sin}) {
    if (!table.device().is_cpu() || table.scalar_type() != torch::kFloat ||
        table.numel() != qkv.size(1) * hd) {
      return false;
    }
  }
  return hd % 2 == 0;
}

bool CausalSelfAttentionSupports(const torch::Tensor& qkv, int64_t n_head) {
  return GroupedCausalSelfAttentionSupports(qkv, n_head, n_head, {}, {});
}

torch::Tensor GroupedCausalSelfAttention(const torch::Tensor& qkv, int64_t n_head,
                                         int64_t n_kv_head, const torch::Tensor& cos,
                                         const torch::Tensor& sin) {
  if (!cos.defined() || !sin.defined()) {
    TORCH_CHECK(!cos.defined() && !sin.defined(),
                "GroupedCausalSelfAttention: cos and sin go together");
    const torch::Tensor none = torch::empty({0}, qkv.options().dtype(torch::kFloat));
    return CausalSelfAttentionFunction::apply(qkv, n_head, n_kv_head, none, none);
  }
  return CausalSelfAttentionFunction::apply(qkv, n_head, n_kv_head, cos, sin);
}

torch::Tensor CausalSelfAttention(const torch::Tensor& qkv, int64_t n_head) {
  return GroupedCausalSelfAttention(qkv, n_head, n_head, {}, {});
}

torch::Tensor CausalAttention(const torch::Tensor& qkv, int64_t n_head, double dropout) {
#if TORCH_VERSION_MAJOR >= 2
  TORCH_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0 && (qkv.size(2) / 3) % n_head == 0,
              "CausalAttention: bad qkv ", qkv.sizes(), " for n_head ", n_head);
  const int64_t batch = qkv.size(0), time = qkv.size(1), d = qkv.size(2) / 3;
  std::vector<torch::Tensor> parts = qkv.split(d, /*dim=*/2);
  auto heads = [&](const torch::Tensor& t) {
    return t.view({batch, time, n_head, d / n_head}).transpose(1, 2);
  };
  return torch::scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]),
                                             /*attn_mask=*/{}, dropout, /*is_causal=*/true)
      .transpose(1, 2)
      .contiguous()
      .view({batch, time, d});
#else
  if (dropout == 0.0 && CausalSelfAttentionSupports(qkv, n_head)) {
    return CausalSelfAttention(qkv, n_head);
  }
  return CausalSelfAttentionReference(qkv, n_head, dropout);
#endif
}

torch::Tensor CausalSelfAttentionReference(const torch::Tensor& qkv, int64_t n_head,
                                           double dropout) {
  TORCH_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0 && (qkv.size(2) / 3) % n_head == 0,
              "CausalSelfAttentionReference: bad qkv ", qkv.sizes(), " for n_head ", n_head);
  const int64_t batch = qkv.size(0), time = qkv.size(1), d = qkv.size(2) / 3;
  const int64_t hd = d / n_head;
  std::vector<torch::Tensor> parts = qkv.split(d, /*dim=*/2);
  auto heads = [&](const torch::Tensor& t) {
    return t.view({batch, time, n_head, hd}).transpose(1, 2);
  };
  const torch::Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
  torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(hd));
  const torch::Tensor future =
      torch::ones({time, time}, qkv.options().dtype(torch::kBool)).triu(/*diagonal=*/1);
  att = torch::softmax(att.masked_fill(future, -std::numeric_limits<float>::infinity()), -1);
  if (dropout > 0) att = torch::dropout(att, dropout, /*train=*/true);
  return torch::matmul(att, v).transpose(1, 2).contiguous().view({batch, time, d});
}

}  // namespace loom::engine
