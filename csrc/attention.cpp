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
__attribute__((target("avx2,fma,f16c"))) void to_f32_avx2(const uint16_t* h, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  for (; i < n; ++i) out[i] = _cvtsh_ss(h[i]);
}

__attribute__((target("avx2,fma,f16c"))) float dot_avx2(const float* a, const float* b, size_t d) {
  __m256 acc = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= d; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  float r = _mm_cvtss_f32(s);
  for (; i < d; ++i) r += a[i] * b[i];
  return r;
}

__attribute__((target("avx2,fma,f16c"))) void axpy_avx2(float w, const float* v, float* out, size_t d) {
  const __m256 wv = _mm256_set1_ps(w);
  size_t i = 0;
  for (; i + 8 <= d; i += 8)
    _mm256_storeu_ps(out + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + i), _mm256_loadu_ps(out + i)));
  for (; i < d; ++i) out[i] += w * v[i];
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
  auto to_f32 = to_f32_generic;
  auto dot = dot_generic;
  auto axpy = axpy_generic;
#ifdef GD_X86
  if (which == Impl::Avx2) { to_f32 = to_f32_avx2; dot = dot_avx2; axpy = axpy_avx2; }
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
    krow.resize(a.d);
    vrow.resize(a.dv);
    const size_t h0 = kh * group;
    const float* q = a.q + (t * a.H + h0) * a.d;   // the group's queries, contiguous
    for (size_t j = 0; j < n; ++j) {
      const size_t slot = (lo + j) % a.cap;
      to_f32(a.k + (slot * a.KH + kh) * a.d, krow.data(), a.d);
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
    for (size_t j = 0; j < n; ++j) {
      const size_t slot = (lo + j) % a.cap;
      to_f32(a.v + (slot * a.KH + kh) * a.dv, vrow.data(), a.dv);
      for (size_t g = 0; g < group; ++g) axpy(scores[g * n + j] * inv[g], vrow.data(), out + g * a.dv, a.dv);
    }
  });
}

}  // namespace gd
