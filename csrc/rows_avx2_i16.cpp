// The int16 row products in AVX2 (with FMA and F16C): one kernel shape for
// every block format, fed by each format's code unpacking (its shared
// steps: rows_avx2_codes.h), plus MXFP4's tuned loops (rows_avx2_mxfp4.h)
// and one-token paths for the K-quants and the 4/5-bit formats.
// See rows.h for the contract; the fp32 rows are rows_avx2.cpp's.
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include <cstring>

#include "cpu.h"
#include "formats.h"
#include "rows.h"
#include "rows_avx2_codes.h"
#include "rows_avx2_halves.h"
#include "rows_avx2_mxfp4.h"
#include "rows_x86.h"
#include "vecmath.h"

namespace gd {
namespace {

using namespace x86;

// One chunk against TT tokens, into their accumulators (acc: the scaled code
// sums, 8 lanes each, or 4 in the Narrow form of in_four_lanes formats;
// accm: the minimums' terms of the chunk's class, see MinClasses); a points
// at the chunk's run of the tile
// (act_block); d and m: the chunk's scales and offsets.
template <Format F, int TT, bool Mins = has_min(F), bool Narrow = false>
AVX2 inline void chunk_i16(const uint8_t* blk, int sub, const float d[2], const float m[2], const I16Acts& a,
                           AccOf<Narrow>* acc, float* accm) {
  // The scales d[h] * a.d[t] of each half (tile_scales)
  static_assert(F != Format::MXFP4, "MXFP4 runs row_mxfp4 (rows_avx2_i16)");
  constexpr int H = halves_differ(F) ? 2 : 1;
  alignas(32) float scale[H][TT];
  for (int h = 0; h < H; ++h) tile_scales<TT>(d[h], a.d, scale[h]);
  if constexpr (Narrow) {
    static_assert(in_four_lanes(F), "rows_avx2_halves.h: the formats in 4 lanes");
    const Codes16 k = small_codes_h<F>(blk, sub);
    GD_EACH_TOKEN
    for (int t = 0; t < TT; ++t)
      acc[t] = _mm_fmadd_ps(small_sum_h(k, a.q + t * 32), _mm_broadcast_ss(&scale[0][t]), acc[t]);
  } else if constexpr (H == 2 && TT == 8) {
    // A full tile of a format whose halves differ: token t's lanes' scales
    // (its first half's in lanes 0..3, its second's in 4..7) picked from
    // the two halves' vectors by one in-lane shuffle, not two broadcasts
    // from the stored scales and a blend (8 tokens in the L1, AMD EPYC Zen
    // 3: Q2_K 1.27x, Q3_K 1.31x, Q6_K 1.37x; the same bits)
    __m256i first, second;
    load_codes<F, Narrow>(blk, sub, first, second);
    const __m256 s0 = _mm256_load_ps(scale[0]), s1 = _mm256_load_ps(scale[1]);
    const __m256 early = _mm256_permute2f128_ps(s0, s1, 0x20), late = _mm256_permute2f128_ps(s0, s1, 0x31);
#define GD_HALVES_TOKEN(t, v)                                                                   \
  acc[t] = _mm256_fmadd_ps(block_sums(first, second, a.q + (t) * 32),                           \
                           _mm256_permute_ps(v, ((t) % 4) * 0x55), acc[t]);
    GD_HALVES_TOKEN(0, early) GD_HALVES_TOKEN(1, early) GD_HALVES_TOKEN(2, early) GD_HALVES_TOKEN(3, early)
    GD_HALVES_TOKEN(4, late) GD_HALVES_TOKEN(5, late) GD_HALVES_TOKEN(6, late) GD_HALVES_TOKEN(7, late)
#undef GD_HALVES_TOKEN
  } else {
    __m256i first, second;
    load_codes<F, Narrow>(blk, sub, first, second);
    GD_EACH_TOKEN
    for (int t = 0; t < TT; ++t)
      acc[t] = _mm256_fmadd_ps(block_sums(first, second, a.q + t * 32),
                               lane_scales<F>(&scale[0][t], &scale[H - 1][t]), acc[t]);
  }
  if constexpr (Mins) add_tile_min_terms<TT>(m, a, accm);
}

// The scales of one 32-value block (MXFP4's come from a table in row_mxfp4):
// the fp16 d first (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL), then Q4_1's and
// Q5_1's m, as chunk_scales gives them. (Through chunk_scales, a template
// outside the AVX2 functions, the conversion had been a call out of line, two
// a chunk for Q4_1 and Q5_1: 8 tokens in the L1, Q4_1 1.04x, Q5_1 1.03x.)
template <Format F>
AVX2 inline void block_scales(const uint8_t* blk, float d[2], float m[2]) {
  static_assert(block_values(F) == 32 && F != Format::MXFP4, "32-value blocks with fp16 factors");
  uint16_t h[2];
  std::memcpy(h, blk, 4);
  d[0] = d[1] = _cvtsh_ss(h[0]);
  m[0] = m[1] = has_min(F) ? _cvtsh_ss(h[1]) : 0.f;
}


// chunk_i16 at one token with the chunk's scales sc (one_token_scales), no
// minimums: the same operations.
template <Format F, bool Narrow = false>
AVX2 inline void chunk1_i16(const uint8_t* blk, int sub, const float sc[2], const int16_t* q, AccOf<Narrow>& acc) {
  if constexpr (Narrow) {
    acc = _mm_fmadd_ps(small_sum_h(small_codes_h<F>(blk, sub), q), _mm_broadcast_ss(&sc[0]), acc);
  } else {
    __m256i first, second;
    load_codes<F, Narrow>(blk, sub, first, second);
    acc = _mm256_fmadd_ps(block_sums(first, second, q), lane_scales<F>(&sc[0], &sc[1]), acc);
  }
}

// A row's minimums' terms (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) for TT tokens, in
// eight sums a token by the chunk's class, its index mod 8, each in chunk
// order, then the eight by one fixed tree: the same bits for a token alone
// or in a tile, and one token adds a super-block's (or eight blocks') eight
// terms by one vector add. (One sum in chunk order had chained the
// one-token loops, a dependent add of 3 cycles a chunk: one token, 2
// threads, from memory, Q4_1 13.6-20.5 -> 23.2-26.4 GMAC/s, Q5_1 13.2-16.5
// -> 20.7-21.7, Q4_K 23.2-23.3 -> 23.6-25.3; 128 tokens 0.93-0.99x, the
// tile's eight classes and their sums; AMD EPYC Zen 3.)
template <int TT>
struct MinClasses {
  alignas(32) float v[8][TT] = {};   // v[j][t]: token t's class j
  float* of(size_t c) { return v[c % 8]; }
  // one token: chunk j's term in lane j, chunks 8k .. 8k + 7
  AVX2 void add_eight(__m256 terms) {
    static_assert(TT == 1, "one token's classes are one vector");
    _mm256_store_ps(&v[0][0], _mm256_add_ps(_mm256_load_ps(&v[0][0]), terms));
  }
  // one token of Q4_K or Q5_K: every minimum's term, after the products
  template <Format F>
  AVX2 void one_token_pass(const uint8_t* row, size_t n_chunks, const I16Acts& a) {
    __m256 s = _mm256_load_ps(&v[0][0]);
    for (size_t c0 = 0; c0 < n_chunks; c0 += 8)
      s = _mm256_add_ps(s, eight_min_terms(k4_minimums(row + (c0 / 8) * block_bytes(F), half_x86), a, c0));
    _mm256_store_ps(&v[0][0], s);
  }
  // each token's sum, ((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7)):
  // a full tile's by vectors (lane t token t, the scalar adds' bits)
  AVX2 void sums(float out[TT]) const {
    if constexpr (TT == 8) {
      __m256 r[8];   // (not a lambda: it would not inherit the AVX2 target)
      for (int j = 0; j < 8; ++j) r[j] = _mm256_load_ps(v[j]);
      const __m256 lo = _mm256_add_ps(_mm256_add_ps(r[0], r[1]), _mm256_add_ps(r[2], r[3]));
      const __m256 hi = _mm256_add_ps(_mm256_add_ps(r[4], r[5]), _mm256_add_ps(r[6], r[7]));
      _mm256_storeu_ps(out, _mm256_add_ps(lo, hi));
    } else {
      for (int t = 0; t < TT; ++t)
        out[t] = ((v[0][t] + v[1][t]) + (v[2][t] + v[3][t])) + ((v[4][t] + v[5][t]) + (v[6][t] + v[7][t]));
    }
  }
};

// One row against TT tokens. One accumulator per token whatever the tile:
// a token's sum is formed in the same order alone or in a batch, so
// prefill, decode and a cached prefix give the same bits. The format is a
// template parameter so that the chunk loop carries no branch; small tiles
// unroll two chunks (large ones would run out of registers). Super-blocks
// unpack their scales once for their eight chunks.
template <Format F, int TT, bool Narrow = false>
AVX2 inline void row_tile_i16(const uint8_t* row, size_t n_chunks, const I16Acts& a, float* out) {
  AccOf<Narrow> acc[TT];
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) acc[t] = AccOf<Narrow>{};
  MinClasses<TT> mins;   // (unused, and optimized away, where the format has no minimums)
  auto at = [&](size_t c) { return acts_from(a, c * TT); };   // chunk c's activations (act_block)
  if constexpr (block_values(F) == 256) {
    float d[8][2], m[8][2];
    // one token of Q4_K or Q5_K: the minimums' terms in a pass of their own.
    // The chunk loops below unrolled (#pragma GCC unroll 8), so each chunk's
    // index is a constant and its shifts take immediates: GCC had left some
    // rolled, their shift counts run-time values (in the L1, alternating
    // builds, AMD EPYC Zen 3: one token Q2_K 11.3 -> 9.7 cycles a chunk, 8
    // tokens Q4_K 1.07x, Q5_K 1.09x, Q6_K 1.05x, Q2_K 1.05x)
    constexpr bool mins_apart = (F == Format::Q4_K || F == Format::Q5_K) && TT == 1;
    for (size_t c0 = 0; c0 < n_chunks; c0 += 8) {
      const uint8_t* blk = row + (c0 / 8) * block_bytes(F);
      if constexpr (TT <= 2) prefetch_ahead(blk, block_bytes(F));
      if constexpr (mins_apart) {
        // One token takes the eight chunks' scales d sc_j a.d alone (the
        // same two products as chunk_i16's, in one vector), not their
        // minimums nor each scale twice: Zen 1 splits the lane-crossing
        // shuffles that store_twice and one_token_scales use into 8
        // operations each, and the 256-bit form gains too (one token, 2
        // threads, AMD EPYC Zen 3: Q4_K 1.10x in the L3, Q5_K 1.15x from
        // memory and 1.35x in the L3; the same bits)
        uint32_t s[4];
        k4_fields(blk, s);
        alignas(32) float sc[8];
        _mm256_store_ps(sc, _mm256_mul_ps(scaled_bytes(s, blk, half_x86), _mm256_loadu_ps(a.d + c0)));
#pragma GCC unroll 8
        for (int sub = 0; sub < 8; ++sub) chunk1_i16<F, Narrow>(blk, sub, &sc[sub], a.q + 32 * (c0 + sub), acc[0]);
      } else {
        superblock_scales_avx2<F>(blk, d, m, half_x86);
        if constexpr (TT == 1 && (!has_min(F) || F == Format::Q2_K)) {
          alignas(32) float sc[8][2];
          one_token_scales(d, a.d + c0, sc);
          if constexpr (F == Format::Q2_K) {
            // its minimums' terms by vectors, eight chunks' at once into
            // their classes (the same steps and order as chunk_i16's, which
            // added them one chunk at a time: one token 9.7 -> 6.6 cycles a
            // chunk in the L1)
            __m256 m0, m1;
            q2k_minimums(blk, half_x86, m0, m1);
            mins.add_eight(eight_min_terms(m0, m1, a, c0));
          }
#pragma GCC unroll 8
          for (int sub = 0; sub < 8; ++sub) chunk1_i16<F, Narrow>(blk, sub, sc[sub], a.q + 32 * (c0 + sub), acc[0]);
        } else {
#pragma GCC unroll 8
          for (int sub = 0; sub < 8; ++sub)
            chunk_i16<F, TT, has_min(F), Narrow>(blk, sub, d[sub], m[sub], at(c0 + sub), acc, mins.of(sub));
        }
      }
    }
    // The same terms into the same classes (MinClasses), after the
    // products: in the products' loop they cost 3.7 of its 10.3 cycles per
    // chunk, apart 2.0 (one-token Q4_K in cache 10.3 -> 8.7 cycles per
    // chunk); since the scales' vector above shares k4_fields with them,
    // the terms in the loop by one vector add a super-block measured the
    // same (Q4_K 6.15 against 6.19, Q5_K 7.5 against 6.9 cycles per chunk
    // in the L1, medians of 12, AMD EPYC Zen 3), so they stay apart
    if constexpr (mins_apart) mins.template one_token_pass<F>(row, n_chunks, a);
  } else {
    size_t c = 0;
    if constexpr (TT == 1 && (F == Format::Q4_0 || F == Format::Q5_0 || F == Format::IQ4_NL || F == Format::Q8_0 ||
                              F == Format::Q4_1 || F == Format::Q5_1)) {
      // one token, eight chunks at a time: their scales d * a.d by one vector
      // conversion and multiply (eight_block_scales): one token, 2 threads,
      // from memory, Q4_0 1.20x, IQ4_NL 1.17x, Q5_0 1.13x; Q4_1's and
      // Q5_1's minimums' terms too (eight_min_terms: the same steps, into
      // their classes by one vector add). The eight chunks' lines asked for
      // by one run of prefetches, not a test and a branch in every chunk
      // (prefetch_ahead): one token, 2 threads, from memory, alternating
      // builds: Q5_0 1.06x, IQ4_NL 1.07x, Q5_1 1.03x, Q4_1 1.01x; Q8_0,
      // which had kept the chunk loop below (0.97-0.99x with the tests), in
      // it since: 1.03x from memory, 1.14x in the caches (AMD EPYC Zen 3)
      for (; c + 8 <= n_chunks; c += 8) {
        const uint8_t* blk = row + c * block_bytes(F);
        float sc[8];
        eight_block_scales<F>(blk, a.d + c, sc);
        prefetch_run(blk, 8 * block_bytes(F));
        for (int j = 0; j < 8; ++j)
          chunk1_i16<F, Narrow>(blk + j * block_bytes(F), 0, &sc[j], a.q + 32 * (c + j), acc[0]);
        if constexpr (has_min(F)) {
          mins.add_eight(eight_min_terms(eight_block_halves<F>(blk, 2), a, c));
        }
      }
    }
    float d[2], m[2];
    if constexpr (TT <= 2) {
#pragma GCC unroll 2
      for (; c < n_chunks; ++c) {
        const uint8_t* blk = row + c * block_bytes(F);
        prefetch_ahead(blk, block_bytes(F));
        block_scales<F>(blk, d, m);
        chunk_i16<F, TT, has_min(F), Narrow>(blk, 0, d, m, at(c), acc, mins.of(c));
      }
    } else {
#pragma GCC unroll 1
      for (; c < n_chunks; ++c) {
        const uint8_t* blk = row + c * block_bytes(F);
        block_scales<F>(blk, d, m);
        chunk_i16<F, TT, has_min(F), Narrow>(blk, 0, d, m, at(c), acc, mins.of(c));
      }
    }
  }
  float m[TT] = {};
  if constexpr (has_min(F)) mins.sums(m);
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) {
    if constexpr (Narrow) out[t] = hsum_sse(acc[t]) * codes_factor_inverse<F>() + m[t];
    else out[t] = hsum_avx2(acc[t]) * codes_factor_inverse<F>() + m[t];
  }
}


template <bool Narrow>
void rows_avx2_i16_as(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const I16Acts& a, size_t T,
                      float* Y, size_t ldy, const float* bias) {
  // MXFP4's full tiles in stretches (mxfp4_full_tiles) where they pay, the
  // rest (all of it elsewhere) by the rows whole
  const size_t nc = K / 32;
  size_t full = 0;
  if (f == Format::MXFP4 && T * K * sizeof(int16_t) >= kStretchesFrom) {
    full = T - T % kTokenTile;
    for (size_t t0 = 0; t0 < full; t0 += kTokenTile)
      mxfp4_full_tiles<Narrow>(W, n0, n1, nc, acts_from(a, t0 * nc), Y + t0 * ldy, ldy, bias);
  }
  if (full == T) return;
  // (acts_from(a, 0) is a but for the split form, the AVX-512 rows' alone)
  rows_i16_by_tiles(f, W, n0, n1, K, acts_from(a, full * nc), T - full, Y + full * ldy, ldy, bias,
                    [](auto F, auto TT, auto... args) {
                      if constexpr (decltype(F)::value == Format::MXFP4)
                        row_mxfp4<decltype(TT)::value, Narrow>(args...);
                      else if constexpr (Narrow && decltype(F)::value == Format::Q8_0)
                        row_q8_0_h<decltype(TT)::value>(args...);
                      else if constexpr (Narrow && in_four_lanes(decltype(F)::value))
                        row_tile_i16<decltype(F)::value, decltype(TT)::value, true>(args...);
                      else
                        row_tile_i16<decltype(F)::value, decltype(TT)::value>(args...);
                    });
}

}  // namespace

void rows_avx2_i16(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const I16Acts& a, size_t T,
                   float* Y, size_t ldy, const float* bias) {
  if (cpu_splits_256()) rows_avx2_i16_as<true>(f, W, n0, n1, K, a, T, Y, ldy, bias);
  else rows_avx2_i16_as<false>(f, W, n0, n1, K, a, T, Y, ldy, bias);
}

}  // namespace gd
#endif
