#include "attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "quants.h"
#include "threads.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GD_X86 1
#endif

namespace gd {
namespace {

float dot_f16_generic(const float* q, const uint16_t* k, size_t d) {
  float acc = 0.f;
  for (size_t i = 0; i < d; ++i) acc += q[i] * fp16_to_fp32(k[i]);
  return acc;
}

void axpy_f16_generic(float w, const uint16_t* v, float* out, size_t d) {
  for (size_t i = 0; i < d; ++i) out[i] += w * fp16_to_fp32(v[i]);
}

#ifdef GD_X86
__attribute__((target("avx2,fma,f16c"))) float dot_f16_avx2(const float* q, const uint16_t* k, size_t d) {
  __m256 acc = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= d; i += 8) {
    const __m256 kv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k + i)));
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), kv, acc);
  }
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  float r = _mm_cvtss_f32(s);
  for (; i < d; ++i) r += q[i] * _cvtsh_ss(k[i]);
  return r;
}

__attribute__((target("avx2,fma,f16c"))) void axpy_f16_avx2(float w, const uint16_t* v, float* out, size_t d) {
  const __m256 wv = _mm256_set1_ps(w);
  size_t i = 0;
  for (; i + 8 <= d; i += 8) {
    const __m256 vv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + i)));
    _mm256_storeu_ps(out + i, _mm256_fmadd_ps(wv, vv, _mm256_loadu_ps(out + i)));
  }
  for (; i < d; ++i) out[i] += w * _cvtsh_ss(v[i]);
}
#endif

}  // namespace

void attention(const AttentionArgs& a, Impl impl) {
  if (a.KH == 0 || a.H % a.KH) throw std::invalid_argument("query heads must be a multiple of kv heads");
  // Every position a query reads must still be in the cache (slots wrap).
  const size_t need = a.window ? std::min(a.pos0 + a.T, a.window + a.T - 1) : a.pos0 + a.T;
  if (a.cap < need)
    throw std::invalid_argument("the KV cache holds " + std::to_string(a.cap) + " positions, these queries need " +
                                std::to_string(need));
  const Impl which = resolve_impl(impl);
  auto dot = dot_f16_generic;
  auto axpy = axpy_f16_generic;
#ifdef GD_X86
  if (which == Impl::Avx2) { dot = dot_f16_avx2; axpy = axpy_f16_avx2; }
#endif
  const size_t group = a.H / a.KH;
  parallel_for(a.T * a.H, [&](size_t task) {
    const size_t t = task / a.H, h = task % a.H, kh = h / group;
    const size_t p = a.pos0 + t;
    const size_t lo = (a.window && p + 1 > a.window) ? p + 1 - a.window : 0;
    const size_t n = p + 1 - lo;
    thread_local std::vector<float> scores;
    scores.resize(n);
    const float* q = a.q + (t * a.H + h) * a.d;
    float m = a.sinks ? a.sinks[h] : -INFINITY;
    for (size_t j = 0; j < n; ++j) {
      const size_t slot = (lo + j) % a.cap;
      scores[j] = a.scale * dot(q, a.k + (slot * a.KH + kh) * a.d, a.d);
      m = std::max(m, scores[j]);
    }
    float denom = a.sinks ? std::exp(a.sinks[h] - m) : 0.f;
    for (size_t j = 0; j < n; ++j) {
      scores[j] = std::exp(scores[j] - m);
      denom += scores[j];
    }
    float* out = a.out + (t * a.H + h) * a.dv;
    std::memset(out, 0, a.dv * sizeof(float));
    const float inv = 1.f / denom;
    for (size_t j = 0; j < n; ++j) {
      const size_t slot = (lo + j) % a.cap;
      axpy(scores[j] * inv, a.v + (slot * a.KH + kh) * a.dv, out, a.dv);
    }
  });
}

}  // namespace gd
