// Vector math shared by the kernels (AVX2, NEON).
#pragma once
#if defined(__aarch64__)
#include <arm_neon.h>

namespace gd {

// e^x for x <= 0, 4 at a time: the same steps as exp_neg_avx2 below.
inline float32x4_t exp_neg_neon(float32x4_t x) {
  const float32x4_t lo = vdupq_n_f32(-87.0f);
  const uint32x4_t keep = vcgeq_f32(x, lo);
  x = vmaxq_f32(x, lo);
  const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
  float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693145751953125f));
  r = vfmsq_f32(r, n, vdupq_n_f32(1.428606765330187045e-06f));
  float32x4_t p = vdupq_n_f32(1.0f / 720);
  p = vfmaq_f32(vdupq_n_f32(1.0f / 120), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.0f / 24), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.0f / 6), p, r);
  p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(vmulq_f32(p, vreinterpretq_f32_s32(e))), keep));
}

}  // namespace gd
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

namespace gd {

// The sum of a vector's 4 lanes, in a fixed order: (l0 + l2) + (l1 + l3).
__attribute__((target("avx2,fma,f16c"))) inline float hsum_sse(__m128 s) {
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The sum of a vector's 8 lanes, in a fixed order: lanes i and i + 4, then hsum_sse.
__attribute__((target("avx2,fma,f16c"))) inline float hsum_avx2(__m256 v) {
  return hsum_sse(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}

// e^x for x <= 0 (attention: scores minus their maximum; SwiGLU: -|x|), 8 at a time: x = n ln2 + r,
// |r| <= ln2/2, e^r by a degree-6 polynomial (relative error ~2e-7), 2^n
// built in the exponent bits; below -87 the result is 0.
__attribute__((target("avx2,fma,f16c"))) inline __m256 exp_neg_avx2(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 zero_mask = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), zero_mask);
}

}  // namespace gd
#endif
