#include "ops.h"

#include <cmath>
#include <algorithm>
#include <vector>

#include "threads.h"
#include "vecmath.h"

#if defined(__x86_64__) || defined(__i386__)
#define GD_X86 1
#endif

namespace gd {
namespace {

// sum a[i] * b[i] in a fixed order: 32 lanes (four of 8) over the
// multiples of 32, the lanes summed pairwise, then the tail in order.
float dot_generic(const float* a, const float* b, size_t n) {
  float lane[32] = {};
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int j = 0; j < 32; ++j) lane[j] += a[i + j] * b[i + j];
  for (int w = 16; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) lane[j] += lane[j + w];
  float s = lane[0];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

#ifdef GD_X86
__attribute__((target("avx2,fma,f16c"))) float dot_avx2(const float* a, const float* b, size_t n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int j = 0; j < 4; ++j)
      acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * j), _mm256_loadu_ps(b + i + 8 * j), acc[j]);
  float s = hsum_avx2(_mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3])));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}
#endif

float dot(const float* a, const float* b, size_t n, Impl impl) {
#ifdef GD_X86
  if (uses_avx2(impl)) return dot_avx2(a, b, n);
#endif
  return dot_generic(a, b, n);
}

}  // namespace

void rms_norm(const float* x, const float* w, size_t T, size_t D, float eps, float* out, Impl impl) {
  const Impl which = resolve_impl(impl);
  for (size_t t = 0; t < T; ++t) {
    const float* r = x + t * D;
    const float inv = 1.f / std::sqrt(dot(r, r, D, which) / float(D) + eps);
    float* o = out + t * D;
    for (size_t d = 0; d < D; ++d) o[d] = r[d] * inv * w[d];
  }
}

void add_rms_norm(float* x, const float* add, const float* w, size_t T, size_t D, float eps, float* out, Impl impl) {
  for (size_t i = 0; i < T * D; ++i) x[i] += add[i];
  rms_norm(x, w, T, D, eps, out, impl);
}

void rope(float* x, size_t T, size_t H, size_t d, const float* cos, const float* sin) {
  const size_t half = d / 2;
  for (size_t t = 0; t < T; ++t) {
    const float* c = cos + t * half;
    const float* s = sin + t * half;
    for (size_t h = 0; h < H; ++h) {
      float* x1 = x + (t * H + h) * d;
      float* x2 = x1 + half;
      for (size_t i = 0; i < half; ++i) {
        const float a = x1[i], b = x2[i];
        x1[i] = a * c[i] - b * s[i];
        x2[i] = b * c[i] + a * s[i];
      }
    }
  }
}

void route(const float* W, const float* bias, size_t E, size_t D, const float* h, size_t T, size_t k,
           int64_t* top, float* weights, Impl impl) {
  const Impl which = resolve_impl(impl);
  // Every logit first, over the pool: each is one dot product, the same
  // bits on any thread. Decode's few tokens split the experts (the router's
  // weights, 368 KB in the 20b, come from memory: 40 us a layer on one
  // thread); more tokens split the tokens, each against all the weights
  // while they stay in the cache.
  std::vector<float> all(T * E);
  auto logit = [&](size_t t, size_t e) {
    all[t * E + e] = dot(W + e * D, h + t * D, D, which) + (bias ? bias[e] : 0.f);
  };
  constexpr size_t kFewTokens = 4;
  if (T < kFewTokens)
    parallel_for(E, [&](size_t e) { for (size_t t = 0; t < T; ++t) logit(t, e); }, T * E * D * sizeof(float));
  else
    parallel_for(T, [&](size_t t) { for (size_t e = 0; e < E; ++e) logit(t, e); }, T * E * D * sizeof(float));
  std::vector<char> taken(E);
  for (size_t t = 0; t < T; ++t) {
    const float* logits = all.data() + t * E;
    std::fill(taken.begin(), taken.end(), 0);
    int64_t* ids = top + t * k;
    float* wt = weights + t * k;
    for (size_t j = 0; j < k; ++j) {   // selection: strictly larger wins, so ties keep the lowest index
      size_t best = E;
      for (size_t e = 0; e < E; ++e)
        if (!taken[e] && (best == E || logits[e] > logits[best])) best = e;
      taken[best] = 1;
      ids[j] = int64_t(best);
    }
    // softmax over the chosen k (the first is the largest)
    float sum = 0.f;
    for (size_t j = 0; j < k; ++j) sum += (wt[j] = std::exp(logits[ids[j]] - logits[ids[0]]));
    for (size_t j = 0; j < k; ++j) wt[j] /= sum;
  }
}

}  // namespace gd
