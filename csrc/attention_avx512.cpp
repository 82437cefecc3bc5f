// AVX-512's attention for the common shape, 8 query heads per kv head
// (gpt-oss: 64 over 8), with the same bits as attend_group8_avx2: every
// sum in the same order, two positions a vector.
//
// Scores: lanes 0-7 hold position j's and lanes 8-15 position j + 1's
// share of a head's dot product, the same eight lanes AVX2's accumulator
// has (lane i: dimensions i, i + 8, ..., one fused multiply-add each, in
// order); the eight heads' sums are then reduced as AVX2's vhaddps and
// 128-bit halves reduce them (vhaddps as two vshufps and an add, each
// 128-bit lane alike), both positions at once. Values: 32 dimensions x 8
// heads a pass in 16 registers, each output's sum in position order as
// AVX2's 16 dimensions a pass, blocks of kValueBlock positions kept in the
// L1 across the passes. The softmax between is AVX2's own code.
#include "attention_parts.h"
#if defined(__x86_64__) || defined(__i386__)
#include "rows_avx512.h"   // (the AVX512 target attribute)

#include <algorithm>
#include <cmath>

namespace gd {

namespace {

// _mm256_hadd_ps in each 256-bit half: [a0 + a1, a2 + a3, b0 + b1, b2 + b3]
// per 128-bit lane (the same sums: addition commutes).
AVX512 inline __m512 hadd_halves(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD));
}

// Heads 0-7's scores of position j (in the low 256 bits) and j + 1 (the
// high 256): AVX2's _mm256_permute2f128_ps(h0123, h4567, 0x20) + (.., 0x31)
// in each half, times the scale.
AVX512 inline __m512 pair_scores(__m512 h0123, __m512 h4567, __m512 scale) {
  const __m512i low = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
  const __m512i high = _mm512_setr_epi32(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
  return _mm512_mul_ps(scale, _mm512_add_ps(_mm512_permutex2var_ps(h0123, low, h4567),
                                            _mm512_permutex2var_ps(h0123, high, h4567)));
}

AVX512 inline __m256 high_half(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

}  // namespace

AVX512 void attend_group8_avx512(const AttentionArgs& a, size_t t, size_t kh, size_t lo, size_t n, float* scores) {
  const size_t d = a.d, dv = a.dv, h0 = kh * 8;
  const float* q = a.q + (t * a.H + h0) * d;   // the 8 heads' queries, contiguous
  const uint16_t* keys = a.k + kh * a.cap * d;
  const uint16_t* values = a.v + kh * a.cap * dv;
  const __m256 scale = _mm256_set1_ps(a.scale);
  const __m512 scale2 = _mm512_set1_ps(a.scale);
  // each head's queries eight at a time in both halves of a vector (d <= kMaxHeadDim)
  alignas(64) float qq[8 * kMaxHeadDim * 2];
  for (size_t i = 0; i < 8 * d; i += 8)
    _mm512_store_ps(qq + 2 * i, _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(q + i)))));
  __m512 mx2 = _mm512_set1_ps(-INFINITY);
  size_t j = 0, slot = lo % a.cap;
  for (; j + 2 <= n; j += 2) {
    const size_t next = next_slot(slot, a.cap);
    prefetch_kv(a, kh, j, n, slot);
    prefetch_kv(a, kh, j + 1, n, next);
    const uint16_t* k0 = keys + slot * d;
    const uint16_t* k1 = keys + next * d;
    __m512 p[8];
    for (int g = 0; g < 8; ++g) p[g] = _mm512_setzero_ps();
    for (size_t c = 0; c < d; c += 8) {
      const __m256i kk = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k0 + c))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(k1 + c)), 1);
      const __m512 kv = _mm512_cvtph_ps(kk);
      for (int g = 0; g < 8; ++g) p[g] = _mm512_fmadd_ps(_mm512_load_ps(qq + (g * d + c) * 2), kv, p[g]);
    }
    const __m512 h0123 = hadd_halves(hadd_halves(p[0], p[1]), hadd_halves(p[2], p[3]));
    const __m512 h4567 = hadd_halves(hadd_halves(p[4], p[5]), hadd_halves(p[6], p[7]));
    const __m512 sc = pair_scores(h0123, h4567, scale2);
    _mm512_storeu_ps(scores + j * 8, sc);
    mx2 = _mm512_max_ps(mx2, sc);
    slot = next_slot(next, a.cap);
  }
  __m256 mx = _mm256_max_ps(_mm512_castps512_ps256(mx2), high_half(mx2));
  if (j < n) {   // an odd last position
    prefetch_kv(a, kh, j, n, slot);
    const __m256 sc = scores8_avx2(q, keys + slot * d, d, scale);
    _mm256_storeu_ps(scores + j * 8, sc);
    mx = _mm256_max_ps(mx, sc);
  }
  alignas(32) float inv[8];
  softmax8_avx2(a, h0, mx, scores, n, inv);   // (AVX2's)
  float* out = a.out + (t * a.H + h0) * dv;
  for (size_t j0 = 0, slot0 = lo % a.cap; j0 < n; j0 += kValueBlock) {
    const size_t j1 = std::min(n, j0 + kValueBlock);
    for (size_t c = 0; c < dv; c += 32) {
      __m512 acc[8][2];
      for (int g = 0; g < 8; ++g)
        for (int h = 0; h < 2; ++h) acc[g][h] = j0 ? _mm512_loadu_ps(out + g * dv + c + 16 * h) : _mm512_setzero_ps();
      for (size_t i = j0, s = slot0; i < j1; ++i, s = next_slot(s, a.cap)) {
        const uint16_t* v = values + s * dv + c;
        const __m512 v0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v)));
        const __m512 v1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 16)));
        for (int g = 0; g < 8; ++g) {
          const __m512 w = _mm512_set1_ps(scores[i * 8 + g]);
          acc[g][0] = _mm512_fmadd_ps(w, v0, acc[g][0]);
          acc[g][1] = _mm512_fmadd_ps(w, v1, acc[g][1]);
        }
      }
      const bool last = j1 == n;
      for (int g = 0; g < 8; ++g)
        for (int h = 0; h < 2; ++h)
          _mm512_storeu_ps(out + g * dv + c + 16 * h, last ? _mm512_mul_ps(acc[g][h], _mm512_set1_ps(inv[g])) : acc[g][h]);
    }
    slot0 = slot_after(slot0, j1 - j0, a.cap);
  }
}

}  // namespace gd
#endif
