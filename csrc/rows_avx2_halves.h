// Internal to rows_avx2_i16.cpp: the int16 rows for cores that split each
// 256-bit operation into two 128-bit halves (AMD Zen 1 and Zen+, Hygon
// Dhyana; cpu_splits_256), in 128-bit registers. There a 256-bit operation
// costs two, some issue at a fraction of Zen 2's rate (vpsrlvq one in 3.5
// cycles, vpmaddwd 0.56 a cycle; benchmarks/native/x86_pipes.c), and the
// one-token kernels are bound by their operations, not by the memory.
//
// MXFP4, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and Q4_K have an arithmetic of their
// own here (every token count the same, so a token's bits do not depend on
// its batch; other than the 256-bit form's); MXFP4's:
// a block's 32 products summed in 4 lanes of exact int32 (lane i: codes
// 4i..4i+3 and 16+4i..16+4i+3), converted (exact: 256 times an integer
// below 2^22), and each lane's sum times the block's scale added into the
// token's accumulator by one fused multiply-add, block after block (the
// product is exact, d a power of two: the same as a multiply and an add);
// the row's sum is (l0 + l2) + (l1 + l3). The 256-bit form keeps 8 lanes,
// each block's two halves converted, scaled and added apart, and its blocks
// in pairs: per block one conversion, one multiply and 1.5 adds more, and
// Zen 1's one multiply pipe is what binds its tiles. In the L1, one core:
// one token 7.4-7.5 -> 6.7-6.8 cycles a block, 8-token tiles 6.2 -> 5.5
// cycles a token and block (a pair's multiply, FMA and add kept instead:
// 6.8 and 5.8; AMD EPYC Zen 1).
#pragma once
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include <cstring>

#include "rows.h"
#include "rows_x86.h"
#include "vecmath.h"

namespace gd {
namespace x86 {

// A block's 32 codes through the value table as int8: codes 0..15 (v0) and
// 16..31 (v1).
AVX2 inline void mxfp4_codes_x128(const uint8_t* blk, __m128i& v0, __m128i& v1) {
  const __m128i table = _mm256_castsi256_si128(mxfp4_values256()), low4 = _mm_set1_epi8(0x0F);
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 1));
  v0 = _mm_shuffle_epi8(table, _mm_and_si128(x, low4));                      // codes 0..15
  v1 = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(x, 4), low4));   // codes 16..31
}

// A block's 32 codes as the four int16 vectors of its products (which
// codes sit in which vector: the format's maker below says).
struct Codes16 {
  __m128i c[4];
};

// Small codes (small_codes: within -32..32; as int8, 0..15 in v0, 16..31 in
// v1) as Codes16, each code times 256 (load_codes' even/odd form: a lane's
// low byte shifted up, its high byte masked): the even and odd codes of
// 0..15, then of 16..31.
AVX2 inline Codes16 small_codes_h(__m128i v0, __m128i v1) {
  const __m128i high8 = _mm_set1_epi16(int16_t(0xFF00));
  return {{_mm_slli_epi16(v0, 8), _mm_and_si128(v0, high8), _mm_slli_epi16(v1, 8), _mm_and_si128(v1, high8)}};
}
AVX2 inline Codes16 mxfp4_codes_h(const uint8_t* blk) {
  __m128i v0, v1;
  mxfp4_codes_x128(blk, v0, v1);
  return small_codes_h(v0, v1);
}

// The small-code formats whose chunk has one scale, Q4_0, Q4_1, Q5_0, Q5_1
// and Q4_K: their rows (row_tile_i16's Narrow form) take MXFP4's 4 lanes
// too, each chunk's lane sums times its scale d * a.d added into the token's
// accumulator by one fused multiply-add (rounding once), chunk after chunk;
// the row's sum (l0 + l2) + (l1 + l3), over 256, plus the minimums' terms
// as the 256-bit form forms them. Their codes come in 128-bit halves
// (small_codes_h): through the 256-bit codes split in two, one token Q5_0
// 1.05-1.11x, Q4_K 0.96x; in halves Q5_0 1.15x, Q4_0 1.15x, Q4_1 1.06x,
// Q5_1 1.04-1.06x, Q4_K 1.02-1.05x, 8 tokens 1.09-1.17x (2 threads, 2880 x
// 3072 from memory; AMD EPYC Zen 1). Q5_K keeps the 256-bit form (its
// fifth bits in halves: one token 0.85-0.88x), as do the formats whose
// chunk halves have scales of their own (a lane here mixes both halves).
constexpr bool in_four_lanes(Format f) {
  return f == Format::Q4_0 || f == Format::Q4_1 || f == Format::Q5_0 || f == Format::Q5_1 || f == Format::Q4_K;
}
// Their chunk's 32 codes as int8 in 128-bit registers (codes8's, in halves):
// codes 0..15 in v0, 16..31 in v1.
AVX2 inline __m128i load128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
AVX2 inline void nibbles_h(const uint8_t* qs, __m128i& v0, __m128i& v1) {   // nibbles16's
  const __m128i x = load128(qs), low4 = _mm_set1_epi8(0x0F);
  v0 = _mm_and_si128(x, low4);
  v1 = _mm_and_si128(_mm_srli_epi16(x, 4), low4);
}
AVX2 inline void bits_h(const uint8_t* p, int n, int width, __m128i& v0, __m128i& v1) {   // bits_of's
  const __m128i mask = _mm_set1_epi8(char((1 << width) - 1)), by = _mm_cvtsi32_si128(n);
  v0 = _mm_and_si128(_mm_srl_epi16(load128(p), by), mask);
  v1 = _mm_and_si128(_mm_srl_epi16(load128(p + 16), by), mask);
}
AVX2 inline void bit_bytes_h(uint32_t x, __m128i& set0, __m128i& set1) {   // bit_bytes'
  const __m128i b = _mm_set1_epi32(int(x)), sel = _mm_set1_epi64x(int64_t(0x8040201008040201ULL));
  const __m128i s0 = _mm_shuffle_epi8(b, _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
  const __m128i s1 = _mm_shuffle_epi8(b, _mm_setr_epi8(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  set0 = _mm_cmpeq_epi8(_mm_and_si128(s0, sel), sel);
  set1 = _mm_cmpeq_epi8(_mm_and_si128(s1, sel), sel);
}
template <Format F>
AVX2 inline Codes16 small_codes_h(const uint8_t* b, int sub) {
  static_assert(in_four_lanes(F), "small codes under one scale a chunk");
  __m128i v0, v1;
  if constexpr (F == Format::Q4_0 || F == Format::Q4_1) {
    nibbles_h(b + (F == Format::Q4_0 ? 2 : 4), v0, v1);
    if constexpr (F == Format::Q4_0) v0 = _mm_sub_epi8(v0, _mm_set1_epi8(8)), v1 = _mm_sub_epi8(v1, _mm_set1_epi8(8));
  } else if constexpr (F == Format::Q5_0 || F == Format::Q5_1) {
    constexpr bool one = F == Format::Q5_1;
    uint32_t qh;
    std::memcpy(&qh, b + (one ? 4 : 2), 4);
    __m128i set0, set1;
    bit_bytes_h(qh, set0, set1);
    nibbles_h(b + (one ? 8 : 6), v0, v1);
    const __m128i sixteen = _mm_set1_epi8(16);
    if constexpr (one) {
      v0 = _mm_or_si128(v0, _mm_and_si128(set0, sixteen)), v1 = _mm_or_si128(v1, _mm_and_si128(set1, sixteen));
    } else {
      v0 = _mm_sub_epi8(v0, _mm_andnot_si128(set0, sixteen)), v1 = _mm_sub_epi8(v1, _mm_andnot_si128(set1, sixteen));
    }
  } else {   // Q4_K
    bits_h(b + 16 + 32 * (sub / 2), 4 * (sub % 2), 4, v0, v1);
  }
  return small_codes_h(v0, v1);
}

// A block's sum for one token (k: small_codes_h's; q: its 32 activations in
// act_slot's order: evens of 0..30, then odds) in 4 lanes, as floats: lane
// i the products of codes 4i..4i+3 and 16+4i..16+4i+3, exact (8 products
// of |code| <= 32 times 256 and |q| <= 32767 stay below 2^31; their sum
// over 256 below 2^24, so the conversion is exact too).
AVX2 inline __m128 small_sum_h(const Codes16& k, const int16_t* q) {
  auto act = [q](int i) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i)); };
  const __m128i first = _mm_add_epi32(_mm_madd_epi16(k.c[0], act(0)), _mm_madd_epi16(k.c[1], act(16)));
  const __m128i second = _mm_add_epi32(_mm_madd_epi16(k.c[2], act(8)), _mm_madd_epi16(k.c[3], act(24)));
  return _mm_cvtepi32_ps(_mm_add_epi32(first, second));
}

// One block (k: its codes) into TT tokens' accumulators (q, e: the tile's
// activations of the block).
template <int TT>
AVX2 inline void mxfp4_block_h(const uint8_t* blk, const Codes16& k, const int16_t* q, const int32_t* e,
                               __m128* acc) {
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t)
    acc[t] = _mm_fmadd_ps(small_sum_h(k, q + 32 * t), _mm_broadcast_ss(kMxfp4Scale + blk[0] + e[t]), acc[t]);
}

// n blocks of a row from blk on (q, e: the tile's activations of the first).
template <int TT>
AVX2 inline void mxfp4_blocks_h(const uint8_t* blk, size_t n, const int16_t* q, const int32_t* e, __m128* acc) {
  for (size_t c = 0; c < n; ++c, blk += 17, q += 32 * TT, e += TT) mxfp4_block_h<TT>(blk, mxfp4_codes_h(blk), q, e, acc);
}

// One row against a tile of TT tokens.
template <int TT>
AVX2 inline void row_mxfp4_h(const uint8_t* row, size_t n_chunks, const I16Acts& a, float* out) {
  __m128 acc[TT];
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) acc[t] = _mm_setzero_ps();
  const uint8_t* blk = row;
  const int16_t* q = a.q;
  const int32_t* e = a.e;
  size_t c = 0;
  if constexpr (TT <= 2) {
    // Decode streams the row from memory: four blocks (68 bytes) a step, one
    // prefetch each; at one token their codes before their products (3-5%
    // fewer cycles than each block's codes before its own products).
    for (; c + 4 <= n_chunks; c += 4, blk += 4 * 17, q += 4 * 32 * TT, e += 4 * TT) {
      __builtin_prefetch(blk + kPrefetchAhead, 0, 3);
      __m128i v[8];
      for (int j = 0; j < 4; ++j) mxfp4_codes_x128(blk + 17 * j, v[2 * j], v[2 * j + 1]);
      for (int j = 0; j < 4; ++j)
        mxfp4_block_h<TT>(blk + 17 * j, small_codes_h(v[2 * j], v[2 * j + 1]), q + 32 * TT * j, e + TT * j, acc);
    }
  }
  mxfp4_blocks_h<TT>(blk, n_chunks - c, q, e, acc);
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) out[t] = hsum_sse(acc[t]);
}

// Q8_0's as Codes16, widened to int16: values 0..7, 8..15, 16..23, 24..31
// (two 16-byte loads, each high half moved down: one token in the L1
// 7.4-7.5 -> 7.1-7.2 cycles a block against four 8-byte loads).
AVX2 inline Codes16 q8_0_codes_h(const uint8_t* blk) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
  const __m128i y = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18));
  return {{_mm_cvtepi8_epi16(x), _mm_cvtepi8_epi16(_mm_unpackhi_epi64(x, x)), _mm_cvtepi8_epi16(y),
           _mm_cvtepi8_epi16(_mm_unpackhi_epi64(y, y))}};
}

// A Q8_0 block's sum for one token in 4 lanes, as floats (lane i: values
// 2i, 2i + 1, 8 + 2i, 9 + 2i, 16 + 2i, .., 25 + 2i; rounded to the nearest
// float, since a lane's sum may pass 2^24).
AVX2 inline __m128 q8_0_sum_h(const Codes16& k, const int16_t* q) {
  const __m128i* x = reinterpret_cast<const __m128i*>(q);
  const __m128i a = _mm_add_epi32(_mm_madd_epi16(k.c[0], _mm_loadu_si128(x)), _mm_madd_epi16(k.c[2], _mm_loadu_si128(x + 2)));
  const __m128i b = _mm_add_epi32(_mm_madd_epi16(k.c[1], _mm_loadu_si128(x + 1)), _mm_madd_epi16(k.c[3], _mm_loadu_si128(x + 3)));
  return _mm_cvtepi32_ps(_mm_add_epi32(a, b));
}

// One Q8_0 row against a tile of TT tokens, in the halves' arithmetic of
// MXFP4's rows: each block's 4 lane sums times its scale d * a.d (the
// scale exact, the FMA rounding once) into the token's accumulator, block
// after block; the row's sum by hsum_sse. The 256-bit form converts and
// scales 8 lanes: 8 tokens 6.0 -> 5.6 cycles a token and block in the L2,
// from memory 1.12x; one token 1.09x (AMD EPYC Zen 1; benchmarks/kernel_ab.py).
// One token: eight blocks' scales at a time (eight_block_scales).
template <int TT>
AVX2 inline void row_q8_0_h(const uint8_t* row, size_t n_chunks, const I16Acts& a, float* out) {
  __m128 acc[TT];
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) acc[t] = _mm_setzero_ps();
  size_t c = 0;
  if constexpr (TT == 1) {
    for (; c + 8 <= n_chunks; c += 8) {
      const uint8_t* blk = row + c * 34;
      alignas(32) float sc[8];
      eight_block_scales<Format::Q8_0>(blk, a.d + c, sc);
      for (int j = 0; j < 8; ++j) {
        prefetch_ahead(blk + j * 34, 34);
        acc[0] = _mm_fmadd_ps(q8_0_sum_h(q8_0_codes_h(blk + j * 34), a.q + 32 * (c + j)), _mm_broadcast_ss(&sc[j]),
                              acc[0]);
      }
    }
  }
  for (; c < n_chunks; ++c) {
    const uint8_t* blk = row + c * 34;
    if constexpr (TT <= 2) prefetch_ahead(blk, 34);
    uint16_t h;
    std::memcpy(&h, blk, 2);
    alignas(32) float sc[TT];   // the block's scale for each token
    tile_scales<TT>(_cvtsh_ss(h), a.d + c * TT, sc);
    const Codes16 k = q8_0_codes_h(blk);
    GD_EACH_TOKEN
    for (int t = 0; t < TT; ++t)
      acc[t] = _mm_fmadd_ps(q8_0_sum_h(k, a.q + 32 * (c * TT + t)), _mm_broadcast_ss(&sc[t]), acc[t]);
  }
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) out[t] = hsum_sse(acc[t]);
}

}  // namespace x86
}  // namespace gd
#endif
