#include "worker/engine/ops/fused_adamw.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LOOM_FUSED_ADAMW_X86 1
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

// The non-finite check compares a sum against infinity; -ffinite-math-only
// (part of -ffast-math) lets the compiler assume that never happens.
#if defined(__FAST_MATH__) || (defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__)
#error "fused_adamw.cc detects inf/NaN: compile it without -ffast-math / -ffinite-math-only"
#endif

namespace loom::engine {
namespace {

// Below this many elements per thread, forking costs more than it saves.
constexpr int64_t kMinElementsPerThread = int64_t{1} << 16;
// Thread ranges start on multiples of this many elements (64 bytes of fp32),
// so no two threads write the same cache line.
constexpr int64_t kRangeAlignElements = 16;
// Software prefetch distances, in elements. The update's divisions and
// square root fill the out-of-order window, so the hardware prefetchers alone
// leave a core short of loads in flight. On the benchmark host (Xeon,
// 2 threads, 100M parameters), prefetching 2 KiB ahead on each array took the
// update from 84 to 73 ms (a plain stream kernel without prefetch: 78 ms),
// and 4 KiB ahead took the norm pass from 27 to 18 ms.
constexpr int64_t kUpdatePrefetchElements = 512;
constexpr int64_t kNormPrefetchElements = 1024;

#ifdef LOOM_FUSED_ADAMW_X86
// A prefetch hint never faults, but forming a pointer far past an array is
// undefined behaviour, so callers check the index first.
inline void Prefetch(const float* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
}
inline void PrefetchUpdate(const AdamWTensor& t, int64_t i) {
  Prefetch(t.param + i);
  Prefetch(t.grad + i);
  Prefetch(t.exp_avg + i);
  Prefetch(t.exp_avg_sq + i);
}
#endif

// A tensor's scalars, rounded to fp32 as LibTorch rounds a double Scalar
// applied to a float tensor.
struct UpdateCoeffs {
  float grad_scale;
  float decay;  // 1 - lr * weight_decay
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float sqrt_bias_correction2;
  float eps;
  float neg_step_size;  // -lr / (1 - beta1^t)
};

UpdateCoeffs MakeCoeffs(const AdamWHyperparams& h, const AdamWTensor& t, double grad_scale) {
  const double step = static_cast<double>(t.step);
  const double bias_correction1 = 1 - std::pow(h.beta1, step);
  const double bias_correction2 = 1 - std::pow(h.beta2, step);
  UpdateCoeffs c;
  c.grad_scale = static_cast<float>(grad_scale);
  c.decay = static_cast<float>(1 - h.lr * t.weight_decay);
  c.beta1 = static_cast<float>(h.beta1);
  c.one_minus_beta1 = static_cast<float>(1 - h.beta1);
  c.beta2 = static_cast<float>(h.beta2);
  c.one_minus_beta2 = static_cast<float>(1 - h.beta2);
  c.sqrt_bias_correction2 = static_cast<float>(std::sqrt(bias_correction2));
  c.eps = static_cast<float>(h.eps);
  c.neg_step_size = static_cast<float>(-h.lr / bias_correction1);
  return c;
}

// ---------------------------------------------------------------------------
// Update kernels over elements [begin, end) of one tensor. All three do the
// same fp32 operations in the same order (see fused_adamw.h): the two FMAs
// are explicit, and the file is compiled with -ffp-contract=off so that no
// other multiply-add becomes one.

void UpdateScalar(const AdamWTensor& t, const UpdateCoeffs& c, int64_t begin, int64_t end) {
  float* __restrict param = t.param;
  const float* __restrict grad = t.grad;
  float* __restrict exp_avg = t.exp_avg;
  float* __restrict exp_avg_sq = t.exp_avg_sq;
  for (int64_t i = begin; i < end; ++i) {
    const float g = grad[i] * c.grad_scale;
    const float p = param[i] * c.decay;
    const float m = std::fma(g, c.one_minus_beta1, exp_avg[i] * c.beta1);
    const float v = std::fma(c.one_minus_beta2 * g, g, exp_avg_sq[i] * c.beta2);
    const float denom = std::sqrt(v) / c.sqrt_bias_correction2 + c.eps;
    param[i] = p + (c.neg_step_size * m) / denom;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
  }
}

#ifdef LOOM_FUSED_ADAMW_X86

__attribute__((target("avx2,fma"))) void UpdateAvx2(const AdamWTensor& t, const UpdateCoeffs& c,
                                                    int64_t begin, int64_t end) {
  const __m256 grad_scale = _mm256_set1_ps(c.grad_scale);
  const __m256 decay = _mm256_set1_ps(c.decay);
  const __m256 beta1 = _mm256_set1_ps(c.beta1);
  const __m256 one_minus_beta1 = _mm256_set1_ps(c.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(c.beta2);
  const __m256 one_minus_beta2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 sqrt_bc2 = _mm256_set1_ps(c.sqrt_bias_correction2);
  const __m256 eps = _mm256_set1_ps(c.eps);
  const __m256 neg_step_size = _mm256_set1_ps(c.neg_step_size);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    // One prefetch per 64-byte line and array.
    if (i % 16 == 0 && i + kUpdatePrefetchElements < end)
      PrefetchUpdate(t, i + kUpdatePrefetchElements);
    const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(t.grad + i), grad_scale);
    const __m256 p = _mm256_mul_ps(_mm256_loadu_ps(t.param + i), decay);
    const __m256 m =
        _mm256_fmadd_ps(g, one_minus_beta1, _mm256_mul_ps(_mm256_loadu_ps(t.exp_avg + i), beta1));
    const __m256 v = _mm256_fmadd_ps(_mm256_mul_ps(one_minus_beta2, g), g,
                                     _mm256_mul_ps(_mm256_loadu_ps(t.exp_avg_sq + i), beta2));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), sqrt_bc2), eps);
    _mm256_storeu_ps(t.param + i,
                     _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(neg_step_size, m), denom)));
    _mm256_storeu_ps(t.exp_avg + i, m);
    _mm256_storeu_ps(t.exp_avg_sq + i, v);
  }
  UpdateScalar(t, c, i, end);
}

__attribute__((target("avx512f"))) void UpdateAvx512(const AdamWTensor& t, const UpdateCoeffs& c,
                                                     int64_t begin, int64_t end) {
  const __m512 grad_scale = _mm512_set1_ps(c.grad_scale);
  const __m512 decay = _mm512_set1_ps(c.decay);
  const __m512 beta1 = _mm512_set1_ps(c.beta1);
  const __m512 one_minus_beta1 = _mm512_set1_ps(c.one_minus_beta1);
  const __m512 beta2 = _mm512_set1_ps(c.beta2);
  const __m512 one_minus_beta2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 sqrt_bc2 = _mm512_set1_ps(c.sqrt_bias_correction2);
  const __m512 eps = _mm512_set1_ps(c.eps);
  const __m512 neg_step_size = _mm512_set1_ps(c.neg_step_size);
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    if (i + kUpdatePrefetchElements < end) PrefetchUpdate(t, i + kUpdatePrefetchElements);
    const __m512 g = _mm512_mul_ps(_mm512_loadu_ps(t.grad + i), grad_scale);
    const __m512 p = _mm512_mul_ps(_mm512_loadu_ps(t.param + i), decay);
    const __m512 m =
        _mm512_fmadd_ps(g, one_minus_beta1, _mm512_mul_ps(_mm512_loadu_ps(t.exp_avg + i), beta1));
    const __m512 v = _mm512_fmadd_ps(_mm512_mul_ps(one_minus_beta2, g), g,
                                     _mm512_mul_ps(_mm512_loadu_ps(t.exp_avg_sq + i), beta2));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), sqrt_bc2), eps);
    _mm512_storeu_ps(t.param + i,
                     _mm512_add_ps(p, _mm512_div_ps(_mm512_mul_ps(neg_step_size, m), denom)));
    _mm512_storeu_ps(t.exp_avg + i, m);
    _mm512_storeu_ps(t.exp_avg_sq + i, v);
  }
  UpdateScalar(t, c, i, end);
}

#endif  // LOOM_FUSED_ADAMW_X86

// ---------------------------------------------------------------------------
// Sum of squares of x[0, n) in double. Several accumulators, so the adds are
// independent; the order therefore differs between levels.

double SumSquaresScalar(const float* x, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const double a = x[i], b = x[i + 1], c = x[i + 2], d = x[i + 3];
    s0 += a * a;
    s1 += b * b;
    s2 += c * c;
    s3 += d * d;
  }
  for (; i < n; ++i) {
    const double a = x[i];
    s0 += a * a;
  }
  return (s0 + s1) + (s2 + s3);
}

#ifdef LOOM_FUSED_ADAMW_X86

__attribute__((target("avx2,fma"))) double SumSquaresAvx2(const float* x, int64_t n) {
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  __m256d s2 = _mm256_setzero_pd(), s3 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {  // one 64-byte line per iteration
    if (i + kNormPrefetchElements < n) Prefetch(x + i + kNormPrefetchElements);
    const __m256d a = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
    const __m256d b = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
    const __m256d c = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 8));
    const __m256d d = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 12));
    s0 = _mm256_fmadd_pd(a, a, s0);
    s1 = _mm256_fmadd_pd(b, b, s1);
    s2 = _mm256_fmadd_pd(c, c, s2);
    s3 = _mm256_fmadd_pd(d, d, s3);
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + SumSquaresScalar(x + i, n - i);
}

__attribute__((target("avx512f"))) double SumSquaresAvx512(const float* x, int64_t n) {
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
  __m512d s2 = _mm512_setzero_pd(), s3 = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {  // two 64-byte lines per iteration
    if (i + kNormPrefetchElements + 16 < n) {
      Prefetch(x + i + kNormPrefetchElements);
      Prefetch(x + i + kNormPrefetchElements + 16);
    }
    const __m512d a = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
    const __m512d b = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
    const __m512d c = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 16));
    const __m512d d = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 24));
    s0 = _mm512_fmadd_pd(a, a, s0);
    s1 = _mm512_fmadd_pd(b, b, s1);
    s2 = _mm512_fmadd_pd(c, c, s2);
    s3 = _mm512_fmadd_pd(d, d, s3);
  }
  const double vector_sum =
      _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(s0, s1), _mm512_add_pd(s2, s3)));
  return vector_sum + SumSquaresScalar(x + i, n - i);
}

#endif  // LOOM_FUSED_ADAMW_X86

using UpdateFn = void (*)(const AdamWTensor&, const UpdateCoeffs&, int64_t, int64_t);
using SumSquaresFn = double (*)(const float*, int64_t);

SimdLevel Resolve(SimdLevel requested) {
  const SimdLevel best = BestSimdLevel();
  if (requested == SimdLevel::kAuto) return best;
  return static_cast<int>(requested) < static_cast<int>(best) ? requested : best;
}

UpdateFn UpdateFor(SimdLevel level) {
  switch (level) {
#ifdef LOOM_FUSED_ADAMW_X86
    case SimdLevel::kAvx512:
      return UpdateAvx512;
    case SimdLevel::kAvx2:
      return UpdateAvx2;
#endif
    default:
      return UpdateScalar;
  }
}

SumSquaresFn SumSquaresFor(SimdLevel level) {
  switch (level) {
#ifdef LOOM_FUSED_ADAMW_X86
    case SimdLevel::kAvx512:
      return SumSquaresAvx512;
    case SimdLevel::kAvx2:
      return SumSquaresAvx2;
#endif
    default:
      return SumSquaresScalar;
  }
}

// ---------------------------------------------------------------------------
// Multi-tensor partitioning: the tensors of all groups, laid end to end, form
// one index space [0, total) that is cut into one contiguous range per
// thread, so many small tensors and one huge tensor balance alike.

struct Segment {
  const AdamWTensor* tensor;
  UpdateCoeffs coeffs;
  int64_t offset;  // index of the tensor's element 0 in the flat space
};

std::vector<Segment> Flatten(absl::Span<const AdamWGroup> groups, double grad_scale,
                             int64_t* total) {
  std::vector<Segment> segments;
  int64_t offset = 0;
  for (const AdamWGroup& group : groups) {
    for (const AdamWTensor& t : group.tensors) {
      if (t.size <= 0) continue;
      segments.push_back({&t, MakeCoeffs(group.hyperparams, t, grad_scale), offset});
      offset += t.size;
    }
  }
  *total = offset;
  return segments;
}

int ThreadsFor(int64_t total, const AdamWKernelOptions& options) {
  int requested = options.num_threads;
#ifdef _OPENMP
  if (requested <= 0) requested = omp_get_max_threads();
#else
  requested = 1;
#endif
  const int64_t useful = std::max<int64_t>(1, total / kMinElementsPerThread);
  return static_cast<int>(std::clamp<int64_t>(useful, 1, std::max(requested, 1)));
}

// Calls fn(segment, begin, end) for each piece of the flat range
// [flat_begin, flat_end), with begin/end indices inside the segment's tensor.
template <typename Fn>
void ForEachPiece(const std::vector<Segment>& segments, int64_t flat_begin, int64_t flat_end,
                  Fn&& fn) {
  if (flat_begin >= flat_end) return;
  // The last segment whose offset is <= flat_begin.
  auto it = std::upper_bound(segments.begin(), segments.end(), flat_begin,
                             [](int64_t value, const Segment& s) { return value < s.offset; });
  for (--it; it != segments.end() && it->offset < flat_end; ++it) {
    const int64_t begin = std::max(flat_begin, it->offset) - it->offset;
    const int64_t end = std::min(flat_end, it->offset + it->tensor->size) - it->offset;
    fn(*it, begin, end);
  }
}

// Thread `index` of `count` gets [RangeStart(index), RangeStart(index + 1)).
int64_t RangeStart(int64_t total, int index, int count) {
  if (index >= count) return total;
  const int64_t start =
      static_cast<int64_t>(static_cast<long double>(total) * index / count);  // no int64 overflow
  return std::min(total, start / kRangeAlignElements * kRangeAlignElements);
}

// Runs body(thread_index, thread_count) on `threads` threads (or fewer, if
// the OpenMP runtime grants fewer) and returns when all have finished.
template <typename Body>
void RunParallel(int threads, Body&& body) {
#ifdef _OPENMP
  if (threads > 1) {
#pragma omp parallel num_threads(threads)
    body(omp_get_thread_num(), omp_get_num_threads());
    return;
  }
#endif
  body(0, 1);
}

}  // namespace


double GradSquaredNorm(absl::Span<const AdamWGroup> groups, const AdamWKernelOptions& options) {
  int64_t total = 0;
  const std::vector<Segment> segments = Flatten(groups, /*grad_scale=*/1.0, &total);
  const SumSquaresFn sum_squares = SumSquaresFor(Resolve(options.simd));
  const int threads = ThreadsFor(total, options);
  // One partial per thread, added in thread order: deterministic for a given
  // thread count and SIMD level.
  std::vector<double> partials(threads, 0.0);
  RunParallel(threads, [&](int index, int count) {
    double sum = 0;
    ForEachPiece(segments, RangeStart(total, index, count), RangeStart(total, index + 1, count),
                 [&](const Segment& s, int64_t begin, int64_t end) {
                   sum += sum_squares(s.tensor->grad + begin, end - begin);
                 });
    partials[index] = sum;
  });
  double sum = 0;
  for (double partial : partials) sum += partial;
  return sum;
}

void AdamWUpdate(absl::Span<const AdamWGroup> groups, double grad_scale,
                 const AdamWKernelOptions& options) {
  int64_t total = 0;
  const std::vector<Segment> segments = Flatten(groups, grad_scale, &total);
  const UpdateFn update = UpdateFor(Resolve(options.simd));
  RunParallel(ThreadsFor(total, options), [&](int index, int count) {
    ForEachPiece(segments, RangeStart(total, index, count), RangeStart(total, index + 1, count),
                 [&](const Segment& s, int64_t begin, int64_t end) {
                   update(*s.tensor, s.coeffs, begin, end);
                 });
  });
}

AdamWStepResult FusedAdamWStep(absl::Span<const AdamWGroup> groups,
                               const AdamWStepOptions& step_options,
                               const AdamWKernelOptions& options) {
  AdamWStepResult result;
  const double sum_squares = GradSquaredNorm(groups, options);
  if (!std::isfinite(sum_squares)) {
    result.applied = false;
    result.grad_norm = sum_squares;  // inf or NaN
    result.clip_coef = 0;
    return result;
  }
  result.grad_norm = std::sqrt(sum_squares) * std::abs(step_options.inv_scale);
  result.clip_coef = 1;
  // torch.nn.utils.clip_grad_norm_: clip_coef = max_norm / (total_norm + 1e-6).
  if (step_options.max_grad_norm > 0 && result.grad_norm > step_options.max_grad_norm) {
    result.clip_coef = step_options.max_grad_norm / (result.grad_norm + 1e-6);
  }
  AdamWUpdate(groups, step_options.inv_scale * result.clip_coef, options);
  result.applied = true;
  return result;
}

}  // namespace loom::engine
