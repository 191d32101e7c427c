// Vectorised exp(x) for fp32 lanes, shared by the engine's softmax kernels
// (fused_loss.cc, causal_attention.cc). Header-only: each function carries
// its own target attribute, so callers dispatch on the CPU's SIMD level at
// run time (BestSimdLevel in fused_adamw.h) and the files need no -mavx*.
#ifndef LOOM_WORKER_ENGINE_OPS_SIMD_EXP_H_
#define LOOM_WORKER_ENGINE_OPS_SIMD_EXP_H_

#include <immintrin.h>

namespace loom::engine::simd {

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

}  // namespace loom::engine::simd

#endif  // LOOM_WORKER_ENGINE_OPS_SIMD_EXP_H_
