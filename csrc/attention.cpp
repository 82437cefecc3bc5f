#include "attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention_parts.h"
#include "quants.h"
#include "threads.h"
#include "vecmath.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GD_X86 1
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace gd {
namespace {

void to_f32_generic(const uint16_t* h, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = fp16_to_fp32(h[i]);
}

float dot_generic(const float* a, const float* b, size_t d) {
  float acc = 0.f;
  for (size_t i = 0; i < d; ++i) acc += a[i] * b[i];
  return acc;
}

void axpy_generic(float w, const float* v, float* out, size_t d) {
  for (size_t i = 0; i < d; ++i) out[i] += w * v[i];
}

#ifdef GD_X86
__attribute__((target("avx2,fma,f16c"))) inline void to_f32_avx2(const uint16_t* h, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  for (; i < n; ++i) out[i] = _cvtsh_ss(h[i]);
}

__attribute__((target("avx2,fma,f16c"))) inline float dot_avx2(const float* a, const float* b, size_t d) {
  __m256 acc = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= d; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float r = hsum_avx2(acc);
  for (; i < d; ++i) r += a[i] * b[i];
  return r;
}

__attribute__((target("avx2,fma,f16c"))) inline void axpy_avx2(float w, const float* v, float* out, size_t d) {
  const __m256 wv = _mm256_set1_ps(w);
  size_t i = 0;
  for (; i + 8 <= d; i += 8)
    _mm256_storeu_ps(out + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + i), _mm256_loadu_ps(out + i)));
  for (; i < d; ++i) out[i] += w * v[i];
}

// The common shape, 8 query heads per kv head (gpt-oss: 64 over 8): the
// scores of one position are one vector across the 8 heads, so the softmax
// runs 8 heads at a time with no horizontal sums, and the values accumulate
// 16 dimensions x 8 heads in registers per pass. scores: [n][8].
// attention_avx512.cpp's form gives the same bits (one position's scores
// and the softmax are the same steps: attention_parts.h).
__attribute__((target("avx2,fma,f16c"))) void attend_group8_avx2(const AttentionArgs& a, size_t t, size_t kh,
                                                                 size_t lo, size_t n, float* scores) {
  const size_t d = a.d, dv = a.dv, h0 = kh * 8;
  const float* q = a.q + (t * a.H + h0) * d;   // the 8 heads' queries, contiguous
  const __m256 scale = _mm256_set1_ps(a.scale);
  __m256 mx = _mm256_set1_ps(-INFINITY);
  for (size_t j = 0, slot = lo % a.cap; j < n; ++j, slot = next_slot(slot, a.cap)) {
    const uint16_t* k = a.k + (kh * a.cap + slot) * d;
    prefetch_kv(a, kh, j, n, slot);
    const __m256 sc = scores8_avx2(q, k, d, scale);
    _mm256_storeu_ps(scores + j * 8, sc);
    mx = _mm256_max_ps(mx, sc);
  }
  alignas(32) float inv[8];
  softmax8_avx2(a, h0, mx, scores, n, inv);
  float* out = a.out + (t * a.H + h0) * dv;
  for (size_t c = 0; c < dv; c += 16) {
    __m256 acc[8][2];
    for (int g = 0; g < 8; ++g) acc[g][0] = acc[g][1] = _mm256_setzero_ps();
    for (size_t j = 0, slot = lo % a.cap; j < n; ++j, slot = next_slot(slot, a.cap)) {
      const uint16_t* v = a.v + (kh * a.cap + slot) * dv + c;
      const __m256 v0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v)));
      const __m256 v1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + 8)));
      for (int g = 0; g < 8; ++g) {
        const __m256 w = _mm256_broadcast_ss(scores + j * 8 + g);
        acc[g][0] = _mm256_fmadd_ps(w, v0, acc[g][0]);
        acc[g][1] = _mm256_fmadd_ps(w, v1, acc[g][1]);
      }
    }
    for (int g = 0; g < 8; ++g) {
      const __m256 iv = _mm256_set1_ps(inv[g]);
      _mm256_storeu_ps(out + g * dv + c, _mm256_mul_ps(acc[g][0], iv));
      _mm256_storeu_ps(out + g * dv + c + 8, _mm256_mul_ps(acc[g][1], iv));
    }
  }
}

// One (query, kv head) task with everything inlined: a key row is converted
// once and dotted with the group's queries; the exponentials go 8 at a time.
__attribute__((target("avx2,fma,f16c"))) void attend_task_avx2(const AttentionArgs& a, size_t t, size_t kh,
                                                               size_t lo, size_t n, float* scores) {
  const size_t group = a.H / a.KH, h0 = kh * group, d = a.d, dv = a.dv;
  const float* q = a.q + (t * a.H + h0) * d;   // the group's queries, contiguous
  alignas(32) float krow[256], vrow[256];
  for (size_t j = 0, slot = lo % a.cap; j < n; ++j, slot = next_slot(slot, a.cap)) {
    prefetch_kv(a, kh, j, n, slot);
    to_f32_avx2(a.k + (kh * a.cap + slot) * d, krow, d);
    for (size_t g = 0; g < group; ++g) scores[g * n + j] = a.scale * dot_avx2(q + g * d, krow, d);
  }
  float inv[64];
  for (size_t g = 0; g < group; ++g) {
    float* s = scores + g * n;
    const float sink = a.sinks ? a.sinks[h0 + g] : -INFINITY;
    float m = sink;
    for (size_t j = 0; j < n; ++j) m = std::max(m, s[j]);
    const __m256 mv = _mm256_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
      const __m256 e = exp_neg_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
      _mm256_storeu_ps(s + j, e);
      sum = _mm256_add_ps(sum, e);
    }
    alignas(32) float part[8];
    _mm256_store_ps(part, sum);
    float denom = a.sinks ? std::exp(sink - m) : 0.f;   // the sink joins the softmax, with no value
    for (int k = 0; k < 8; ++k) denom += part[k];
    for (; j < n; ++j) {
      alignas(32) float one[8] = {s[j] - m, 0, 0, 0, 0, 0, 0, 0};
      _mm256_store_ps(one, exp_neg_avx2(_mm256_load_ps(one)));
      s[j] = one[0];
      denom += one[0];
    }
    inv[g] = 1.f / denom;
  }
  float* out = a.out + (t * a.H + h0) * dv;
  std::memset(out, 0, group * dv * sizeof(float));
  for (size_t j = 0, slot = lo % a.cap; j < n; ++j, slot = next_slot(slot, a.cap)) {
    to_f32_avx2(a.v + (kh * a.cap + slot) * dv, vrow, dv);
    for (size_t g = 0; g < group; ++g) axpy_avx2(scores[g * n + j] * inv[g], vrow, out + g * dv, dv);
  }
}
#endif

#if defined(__aarch64__)
void to_f32_neon(const uint16_t* h, float* out, size_t n) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(out + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h + i))));
  for (; i < n; ++i) out[i] = fp16_to_fp32(h[i]);
}

// Four accumulators of four lanes, added in a fixed order.
float dot_neon(const float* a, const float* b, size_t d) {
  float32x4_t acc[4] = {vdupq_n_f32(0.f), vdupq_n_f32(0.f), vdupq_n_f32(0.f), vdupq_n_f32(0.f)};
  size_t i = 0;
  for (; i + 16 <= d; i += 16)
    for (int k = 0; k < 4; ++k) acc[k] = vfmaq_f32(acc[k], vld1q_f32(a + i + 4 * k), vld1q_f32(b + i + 4 * k));
  for (; i + 4 <= d; i += 4) acc[0] = vfmaq_f32(acc[0], vld1q_f32(a + i), vld1q_f32(b + i));
  float r = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
  for (; i < d; ++i) r += a[i] * b[i];
  return r;
}

void axpy_neon(float w, const float* v, float* out, size_t d) {
  size_t i = 0;
  for (; i + 4 <= d; i += 4) vst1q_f32(out + i, vfmaq_n_f32(vld1q_f32(out + i), vld1q_f32(v + i), w));
  for (; i < d; ++i) out[i] += w * v[i];
}

inline float32x4_t half4(const uint16_t* h) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h))); }

// attend_group8_avx2's shape in NEON: a position's scores for the 8 heads as
// two vectors (heads 0-3, 4-7), the softmax 8 heads at a time, the values
// accumulated 8 dimensions x 8 heads in registers per pass. scores: [n][8].
void attend_group8_neon(const AttentionArgs& a, size_t t, size_t kh, size_t lo, size_t n, float* scores) {
  const size_t d = a.d, dv = a.dv, h0 = kh * 8;
  const float* q = a.q + (t * a.H + h0) * d;   // the 8 heads' queries, contiguous
  float32x4_t mx[2] = {vdupq_n_f32(-INFINITY), vdupq_n_f32(-INFINITY)};
  for (size_t j = 0, slot = lo % a.cap; j < n; ++j, slot = next_slot(slot, a.cap)) {
    const uint16_t* k = a.k + (kh * a.cap + slot) * d;
    prefetch_kv(a, kh, j, n, slot);
    float32x4_t p[8];
    for (int g = 0; g < 8; ++g) p[g] = vdupq_n_f32(0.f);
    for (size_t c = 0; c < d; c += 4) {
      const float32x4_t kv = half4(k + c);
      for (int g = 0; g < 8; ++g) p[g] = vfmaq_f32(p[g], vld1q_f32(q + g * d + c), kv);
    }
    // eight dot products into two vectors, lane g for head g
    for (int half = 0; half < 2; ++half) {
      const float32x4_t* h = p + 4 * half;
      const float32x4_t sc = vmulq_n_f32(vpaddq_f32(vpaddq_f32(h[0], h[1]), vpaddq_f32(h[2], h[3])), a.scale);
      vst1q_f32(scores + j * 8 + 4 * half, sc);
      mx[half] = vmaxq_f32(mx[half], sc);
    }
  }
  // softmax over [scores..., sink] per head; the sink has no value
  float inv[8];
  for (int half = 0; half < 2; ++half) {
    const float32x4_t sink = a.sinks ? vld1q_f32(a.sinks + h0 + 4 * half) : vdupq_n_f32(-INFINITY);
    const float32x4_t m = vmaxq_f32(mx[half], sink);
    float32x4_t denom = a.sinks ? exp_neg_neon(vsubq_f32(sink, m)) : vdupq_n_f32(0.f);
    for (size_t j = 0; j < n; ++j) {
      float* s = scores + j * 8 + 4 * half;
      const float32x4_t e = exp_neg_neon(vsubq_f32(vld1q_f32(s), m));
      vst1q_f32(s, e);
      denom = vaddq_f32(denom, e);
    }
    vst1q_f32(inv + 4 * half, vdivq_f32(vdupq_n_f32(1.f), denom));
  }
  float* out = a.out + (t * a.H + h0) * dv;
  for (size_t c = 0; c < dv; c += 8) {
    float32x4_t acc[8][2];
    for (int g = 0; g < 8; ++g) acc[g][0] = acc[g][1] = vdupq_n_f32(0.f);
    for (size_t j = 0, slot = lo % a.cap; j < n; ++j, slot = next_slot(slot, a.cap)) {
      const uint16_t* v = a.v + (kh * a.cap + slot) * dv + c;
      const float32x4_t v0 = half4(v), v1 = half4(v + 4);
      const float32x4_t w0 = vld1q_f32(scores + j * 8), w1 = vld1q_f32(scores + j * 8 + 4);
      // (a lane index must be a constant)
#define GD_HEAD(G, W, L)                                   \
  acc[G][0] = vfmaq_laneq_f32(acc[G][0], v0, W, L);        \
  acc[G][1] = vfmaq_laneq_f32(acc[G][1], v1, W, L);
      GD_HEAD(0, w0, 0) GD_HEAD(1, w0, 1) GD_HEAD(2, w0, 2) GD_HEAD(3, w0, 3)
      GD_HEAD(4, w1, 0) GD_HEAD(5, w1, 1) GD_HEAD(6, w1, 2) GD_HEAD(7, w1, 3)
#undef GD_HEAD
    }
    for (int g = 0; g < 8; ++g) {
      vst1q_f32(out + g * dv + c, vmulq_n_f32(acc[g][0], inv[g]));
      vst1q_f32(out + g * dv + c + 4, vmulq_n_f32(acc[g][1], inv[g]));
    }
  }
}
#endif

void to_f16_generic(const float* x, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = fp32_to_fp16(x[i]);
}

#ifdef GD_X86
__attribute__((target("avx2,fma,f16c"))) void to_f16_avx2(const float* x, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  to_f16_generic(x + i, out + i, n - i);
}
#endif

#if defined(__aarch64__)
void to_f16_neon(const float* x, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) vst1_u16(out + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
  to_f16_generic(x + i, out + i, n - i);
}
#endif

}  // namespace

void store_kv(const float* k, const float* v, size_t T, size_t KH, size_t d, size_t dv, uint16_t* kc, uint16_t* vc,
              size_t cap, size_t pos0, Impl impl) {
  if (T == 0) return;   // (nothing to store, and no slot to take modulo an empty cache)
  const Impl which = resolve_impl(impl);
  auto to_f16 = to_f16_generic;
#ifdef GD_X86
  if (uses_avx2(which)) to_f16 = to_f16_avx2;
#endif
#if defined(__aarch64__)
  if (which == Impl::Neon) to_f16 = to_f16_neon;
#endif
  for (size_t t = 0, slot = pos0 % cap; t < T; ++t, slot = next_slot(slot, cap))
    for (size_t h = 0; h < KH; ++h) {
      to_f16(k + (t * KH + h) * d, kc + (h * cap + slot) * d, d);
      to_f16(v + (t * KH + h) * dv, vc + (h * cap + slot) * dv, dv);
    }
}

void check_attention(const AttentionArgs& a) {
  if (a.KH == 0 || a.H % a.KH) throw std::invalid_argument("query heads must be a multiple of kv heads");
  // Every position a query reads must still be in the cache (slots wrap).
  const size_t need = a.window ? std::min(a.pos0 + a.T, a.window + a.T - 1) : a.pos0 + a.T;
  if (a.cap < need)
    throw std::invalid_argument("the KV cache holds " + std::to_string(a.cap) + " positions, these queries need " +
                                std::to_string(need));
}

void attention(const AttentionArgs& a, Impl impl) {
  check_attention(a);
  const Impl which = resolve_impl(impl);
  auto to_f32 = to_f32_generic;
  auto dot = dot_generic;
  auto axpy = axpy_generic;
#ifdef GD_X86
  if (uses_avx2(which)) { to_f32 = to_f32_avx2; dot = dot_avx2; axpy = axpy_avx2; }
#endif
#if defined(__aarch64__)
  if (which == Impl::Neon) { to_f32 = to_f32_neon; dot = dot_neon; axpy = axpy_neon; }
#endif
  // One task per (query, kv head): the kv head's query heads share each key
  // and value row as it is read and converted from fp16.
  const size_t group = a.H / a.KH;
  parallel_for(a.T * a.KH, [&](size_t task) {
    const size_t t = task / a.KH, kh = task % a.KH;
    const size_t p = a.pos0 + t;
    const size_t lo = (a.window && p + 1 > a.window) ? p + 1 - a.window : 0;
    const size_t n = p + 1 - lo;
    thread_local std::vector<float> scores, krow, vrow;
    scores.resize(group * n);
#ifdef GD_X86
    if (which == Impl::Avx512 && group == 8 && a.d % 8 == 0 && a.d <= kMaxHeadDim && a.dv % 32 == 0)
      return attend_group8_avx512(a, t, kh, lo, n, scores.data());
    if (uses_avx2(which) && group == 8 && a.d % 8 == 0 && a.dv % 16 == 0)
      return attend_group8_avx2(a, t, kh, lo, n, scores.data());
    if (uses_avx2(which) && a.d <= 256 && a.dv <= 256 && group <= 64)
      return attend_task_avx2(a, t, kh, lo, n, scores.data());
#endif
#if defined(__aarch64__)
    if (which == Impl::Neon && group == 8 && a.d % 4 == 0 && a.dv % 8 == 0)
      return attend_group8_neon(a, t, kh, lo, n, scores.data());
#endif
    krow.resize(a.d);
    vrow.resize(a.dv);
    const size_t h0 = kh * group;
    const float* q = a.q + (t * a.H + h0) * a.d;   // the group's queries, contiguous
    for (size_t j = 0, slot = lo % a.cap; j < n; ++j, slot = next_slot(slot, a.cap)) {
      to_f32(a.k + (kh * a.cap + slot) * a.d, krow.data(), a.d);
      for (size_t g = 0; g < group; ++g) scores[g * n + j] = a.scale * dot(q + g * a.d, krow.data(), a.d);
    }
    std::vector<float> inv(group);
    for (size_t g = 0; g < group; ++g) {
      float* s = &scores[g * n];
      const float sink = a.sinks ? a.sinks[h0 + g] : -INFINITY;
      float m = sink;
      for (size_t j = 0; j < n; ++j) m = std::max(m, s[j]);
      float denom = a.sinks ? std::exp(sink - m) : 0.f;   // the sink joins the softmax, with no value
      for (size_t j = 0; j < n; ++j) {
        s[j] = std::exp(s[j] - m);
        denom += s[j];
      }
      inv[g] = 1.f / denom;
    }
    float* out = a.out + (t * a.H + h0) * a.dv;
    std::memset(out, 0, group * a.dv * sizeof(float));
    for (size_t j = 0, slot = lo % a.cap; j < n; ++j, slot = next_slot(slot, a.cap)) {
      to_f32(a.v + (kh * a.cap + slot) * a.dv, vrow.data(), a.dv);
      for (size_t g = 0; g < group; ++g) axpy(scores[g * n + j] * inv[g], vrow.data(), out + g * a.dv, a.dv);
    }
  }, a.T * a.KH * std::min(a.pos0 + a.T, a.window ? a.window : a.pos0 + a.T) * (a.d + a.dv) * 2 * group);
}

}  // namespace gd
