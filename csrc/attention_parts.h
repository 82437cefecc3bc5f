// Internal to attention.cpp and attention_avx512.cpp: how a task walks the
// KV cache's slots and prefetches it, the group-of-8 kernels' shared steps
// (one position's scores, the softmax), and the AVX-512 kernel's entry.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "attention.h"
#include "vecmath.h"   // (exp_neg_avx2; on x86 with immintrin.h)

namespace gd {

// The KV slot after `slot` in a cache of `cap` positions (slots wrap): a
// loop over positions steps its slot instead of dividing (a 64-bit modulo
// per position cost as much as the position's dot products).
inline size_t next_slot(size_t slot, size_t cap) { return slot + 1 == cap ? 0 : slot + 1; }
// The slot `steps` positions after `slot`.
inline size_t slot_after(size_t slot, size_t steps, size_t cap) {
  slot += steps;
  while (slot >= cap) slot -= cap;
  return slot;
}

// At decode the KV cache is cold (the weights streamed since the layer last
// ran have evicted it): the scores' loop prefetches the key row kKvAhead
// positions on and the value row of the position at hand (the values' pass
// comes after the softmax, then from the L2).
constexpr size_t kKvAhead = 16;

inline void prefetch_row(const uint16_t* row, size_t values) {
  for (size_t b = 0; b < values * sizeof(uint16_t); b += 64) __builtin_prefetch(reinterpret_cast<const char*>(row) + b);
}

// The prefetches of position j (at `slot`) in the scores' loop of kv head kh.
inline void prefetch_kv(const AttentionArgs& a, size_t kh, size_t j, size_t n, size_t slot) {
  if (j + kKvAhead < n) prefetch_row(a.k + (kh * a.cap + slot_after(slot, kKvAhead, a.cap)) * a.d, a.d);
  prefetch_row(a.v + (kh * a.cap + slot) * a.dv, a.dv);
}

// AVX-512's values' pass takes the positions in blocks of kValueBlock, each
// block's value rows read once from the L2 into the L1 and kept there
// while both 32-dimension slices of the output pass over them (a task's
// partial sums wait in its output between blocks: the same sums in the
// same order). One pass per slice over all positions read each value row
// once per slice, from the L2 or, past 2 MB of a head's keys and values
// (8,000 positions), from the L3: blocks 1.03-1.07x over 8,192 positions
// (Intel Xeon with AMX).
constexpr size_t kValueBlock = 256;

#if defined(__x86_64__) || defined(__i386__)
// The group-of-8 kernels' steps that AVX2's and AVX-512's forms share (the
// same code, so the same bits). One position's scores: lane g head g's
// q . k times the scale (q: the 8 heads' queries, contiguous; k: the fp16
// key row), eight lanes of dimensions i, i + 8, ... each, reduced by
// vhaddps and the 128-bit halves.
__attribute__((target("avx2,fma,f16c"), always_inline)) inline __m256 scores8_avx2(const float* q, const uint16_t* k, size_t d,
                                                                     __m256 scale) {
  __m256 p[8];
  for (int g = 0; g < 8; ++g) p[g] = _mm256_setzero_ps();
  for (size_t c = 0; c < d; c += 8) {
    const __m256 kv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k + c)));
    for (int g = 0; g < 8; ++g) p[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * d + c), kv, p[g]);
  }
  const __m256 h0123 = _mm256_hadd_ps(_mm256_hadd_ps(p[0], p[1]), _mm256_hadd_ps(p[2], p[3]));
  const __m256 h4567 = _mm256_hadd_ps(_mm256_hadd_ps(p[4], p[5]), _mm256_hadd_ps(p[6], p[7]));
  return _mm256_mul_ps(scale, _mm256_add_ps(_mm256_permute2f128_ps(h0123, h4567, 0x20),
                                            _mm256_permute2f128_ps(h0123, h4567, 0x31)));
}

// The softmax over [scores..., sink] per head (the sink has no value) of a
// task's scores [n][8] whose largest are mx: the scores become their
// exponentials, inv each head's 1 / denominator.
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void softmax8_avx2(const AttentionArgs& a, size_t h0, __m256 mx,
                                                                    float* scores, size_t n, float inv[8]) {
  const __m256 sink = a.sinks ? _mm256_loadu_ps(a.sinks + h0) : _mm256_set1_ps(-INFINITY);
  const __m256 m = _mm256_max_ps(mx, sink);
  __m256 denom = a.sinks ? exp_neg_avx2(_mm256_sub_ps(sink, m)) : _mm256_setzero_ps();
  for (size_t j = 0; j < n; ++j) {
    const __m256 e = exp_neg_avx2(_mm256_sub_ps(_mm256_loadu_ps(scores + j * 8), m));
    _mm256_storeu_ps(scores + j * 8, e);
    denom = _mm256_add_ps(denom, e);
  }
  _mm256_storeu_ps(inv, _mm256_div_ps(_mm256_set1_ps(1.f), denom));
}

// AVX-512's form of the group-of-8 kernel (8 query heads per kv head, d a
// multiple of 8 up to kMaxHeadDim, dv a multiple of 32): two positions a
// vector, the same bits as attend_group8_avx2 (attention_avx512.cpp).
constexpr size_t kMaxHeadDim = 256;
void attend_group8_avx512(const AttentionArgs& a, size_t t, size_t kh, size_t lo, size_t n, float* scores);
#endif

}  // namespace gd
