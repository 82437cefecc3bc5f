// Internal to rows_avx2_i16.cpp: MXFP4's own loops in AVX2, its rows
// whole (row_mxfp4) and its full tiles in stretches (mxfp4_full_tiles).
#pragma once
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include <algorithm>

#include "rows.h"
#include "rows_avx2_codes.h"
#include "rows_avx2_halves.h"
#include "rows_x86.h"

namespace gd {
namespace {

using namespace x86;

// A block's scale for one token (et: the token's ActView::e of the block).
AVX2 inline __m256 mxfp4_scale(const uint8_t* blk, int32_t et) {
  return _mm256_broadcast_ss(kMxfp4Scale + blk[0] + et);
}

// Blocks c and c + 1 of a row (blk) against TT tokens (qc, ec: the tile's
// activations of block c on) into their accumulators.
template <int TT>
AVX2 inline void mxfp4_pair(const uint8_t* blk, const int16_t* qc, const int32_t* ec, __m256* acc) {
  __m256i f0, s0, f1, s1;
  load_codes<Format::MXFP4>(blk, 0, f0, s0);
  load_codes<Format::MXFP4>(blk + 17, 0, f1, s1);
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) {
    const __m256 p0 = _mm256_mul_ps(block_sums(f0, s0, qc + 32 * t), mxfp4_scale(blk, ec[t]));
    acc[t] = _mm256_add_ps(
        acc[t], _mm256_fmadd_ps(block_sums(f1, s1, qc + 32 * (TT + t)), mxfp4_scale(blk + 17, ec[TT + t]), p0));
  }
}

// n pairs of blocks of a row from blk on (q, e: the tile's activations of
// the pairs' first block) into the tokens' accumulators.
template <int TT>
AVX2 inline void mxfp4_pairs(const uint8_t* blk, size_t n, const int16_t* q, const int32_t* e, __m256* acc) {
  for (size_t p = 0; p < n; ++p, blk += 34, q += 64 * TT, e += 2 * TT) mxfp4_pair<TT>(blk, q, e, acc);
}

// A row's odd last block c alone (a: the tile's activations).
template <int TT>
AVX2 inline void mxfp4_last(const uint8_t* row, size_t c, const I16Acts& a, __m256* acc) {
  const uint8_t* blk = row + c * 17;
  const int16_t* q = a.q + c * 32 * TT;
  const int32_t* e = a.e + c * TT;
  __m256i f0, s0;
  load_codes<Format::MXFP4>(blk, 0, f0, s0);
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t)
    acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(block_sums(f0, s0, q + 32 * t), mxfp4_scale(blk, e[t])));
}

// MXFP4 in a loop of its own, for every tile: a token's blocks are summed in
// pairs, c0 d0 + c1 d1 (a multiply and an FMA; d is a power of two, so c0 d0
// is exact short of the float range's ends), and each pair then into the
// token's accumulator. Every tile pairs the same blocks (0 with 1, 2 with 3,
// ..; an odd last block alone), so a token's bits do not depend on the tile. Why: at one token a block's
// other work issues in less time than the FMA chain of one block per step
// takes (5 cycles on Zen 2); pairs halve the chain. The loop also carries
// no bookkeeping beyond its pointers (the general loop tested and branched
// for a prefetch in every block): at one token 5.65 -> 4.85 cycles per block
// in L1, the 20b's decode 7.2 -> 8.5 tok/s with the pool's contiguous
// shares (threads.cpp); 8 tokens 2.94 -> 3.16 cycles per token and block
// (the multiply is one more operation per pair), prefill 0.97x (AMD EPYC
// Zen 2, 2 threads). Narrow (cores that split 256-bit operations): the
// halves' rows, whose arithmetic is their own (rows_avx2_halves.h).
template <int TT, bool Narrow = false>
AVX2 inline void row_mxfp4(const uint8_t* row, size_t n_chunks, const I16Acts& a, float* out) {
  if constexpr (Narrow) return row_mxfp4_h<TT>(row, n_chunks, a, out);
  const int16_t* q = a.q;
  const int32_t* e = a.e;
  __m256 acc[TT];
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) acc[t] = _mm256_setzero_ps();
  const uint8_t* blk = row;
  size_t c = 0;
  if constexpr (TT <= 2) {
    // Decode streams the row from memory: four blocks (68 bytes) per pass,
    // one prefetch each (a line in 17 is left to the hardware prefetcher).
    for (; c + 4 <= n_chunks; c += 4, blk += 4 * 17, q += 4 * 32 * TT, e += 4 * TT) {
      __builtin_prefetch(blk + kPrefetchAhead, 0, 3);
      mxfp4_pair<TT>(blk, q, e, acc);
      mxfp4_pair<TT>(blk + 34, q + 64 * TT, e + 2 * TT, acc);
    }
  }
  mxfp4_pairs<TT>(blk, (n_chunks - c) / 2, q, e, acc);
  if (n_chunks % 2) mxfp4_last<TT>(row, n_chunks - 1, a, acc);
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) out[t] = hsum_avx2(acc[t]);
}

// MXFP4's full tiles (kTokenTile tokens) over rows [n0, n1): a the tile's
// activations, Y its first token's outputs. A full tile's activations (8
// tokens of a 2880-wide row: 46 KB of int16) outgrow the L1, and row after
// row read them all again, from the L2 or, once a product's tiles together
// outgrow it, from beyond: here a group of rows takes its blocks a stretch
// at a time (kStretch blocks: 16 KB of the tile's activations, which stay
// in the L1 while the group's rows pass over them), each row's accumulators
// kept in memory between stretches. A store and a load change no bits:
// every token's sums are formed in the same order as row_mxfp4 forms them.
// One thread, 2880 x 2880 in the L3, cycles per token and block: 64 tokens
// 3.05 -> 2.65, 32 tokens 2.85 -> 2.61, 256 tokens 2.97 -> 2.79; the 20b's
// prefill of 512 tokens 1.10x (1.05 .. 1.17; AMD EPYC Zen 3, 2 threads).
// Q8_0's tiles the same way: 0.99x, so they keep rows_by_tiles.
// The two forms' accumulators and steps for mxfp4_full_tiles: a token's 8
// lanes and its blocks in pairs (row_mxfp4), or its 4 lanes and its blocks
// one by one (row_mxfp4_h, for cores that split 256-bit operations).
template <bool Narrow>
struct Mxfp4Form {
  using Acc = __m256;
  AVX2 static Acc zero() { return _mm256_setzero_ps(); }
  // n blocks (even) from blk on; q, e: the tile's activations of the first
  template <int TT>
  AVX2 static void blocks(const uint8_t* blk, size_t n, const int16_t* q, const int32_t* e, Acc* acc) {
    mxfp4_pairs<TT>(blk, n / 2, q, e, acc);
  }
  template <int TT>
  AVX2 static void last(const uint8_t* row, size_t c, const I16Acts& a, Acc* acc) { mxfp4_last<TT>(row, c, a, acc); }
  AVX2 static float sum(Acc v) { return hsum_avx2(v); }
};
template <>
struct Mxfp4Form<true> {
  using Acc = __m128;
  AVX2 static Acc zero() { return _mm_setzero_ps(); }
  template <int TT>
  AVX2 static void blocks(const uint8_t* blk, size_t n, const int16_t* q, const int32_t* e, Acc* acc) {
    mxfp4_blocks_h<TT>(blk, n, q, e, acc);
  }
  template <int TT>
  AVX2 static void last(const uint8_t* row, size_t c, const I16Acts& a, Acc* acc) {
    mxfp4_blocks_h<TT>(row + c * 17, 1, a.q + c * 32 * TT, a.e + c * TT, acc);
  }
  AVX2 static float sum(Acc v) { return hsum_sse(v); }
};

template <bool Narrow>
AVX2 void mxfp4_full_tiles(const uint8_t* W, size_t n0, size_t n1, size_t n_chunks, const I16Acts& a, float* Y,
                           size_t ldy, const float* bias) {
  using Form = Mxfp4Form<Narrow>;
  using Acc = typename Form::Acc;
  constexpr int TT = kTokenTile;
  constexpr size_t kGroupRows = 32, kStretch = 32;   // (kStretch: blocks, even: whole pairs; 16 to 64 within 5%)
  const size_t rb = n_chunks * 17, paired = n_chunks - n_chunks % 2;   // (an odd last block after the stretches)
  Acc kept[kGroupRows][TT];
  for (size_t g0 = n0; g0 < n1; g0 += kGroupRows) {
    const size_t rows = std::min(kGroupRows, n1 - g0);
    for (size_t r = 0; r < rows; ++r)
      for (int t = 0; t < TT; ++t) kept[r][t] = Form::zero();
    for (size_t c0 = 0; c0 < paired; c0 += kStretch) {
      const size_t c1 = std::min(paired, c0 + kStretch);
      for (size_t r = 0; r < rows; ++r) {
        Acc acc[TT];
        GD_EACH_TOKEN
        for (int t = 0; t < TT; ++t) acc[t] = kept[r][t];
        Form::template blocks<TT>(W + (g0 + r) * rb + c0 * 17, c1 - c0, a.q + c0 * 32 * TT, a.e + c0 * TT, acc);
        GD_EACH_TOKEN
        for (int t = 0; t < TT; ++t) kept[r][t] = acc[t];
      }
    }
    for (size_t r = 0; r < rows; ++r) {
      if (paired < n_chunks) Form::template last<TT>(W + (g0 + r) * rb, n_chunks - 1, a, kept[r]);
      const float b = bias ? bias[g0 + r] : 0.f;
      for (int t = 0; t < TT; ++t) Y[t * ldy + g0 + r] = Form::sum(kept[r][t]) + b;
    }
  }
}

// From how many bytes of a product's activations mxfp4_full_tiles pays:
// where the L2 no longer keeps every tile's beside the rows (32 tokens of a
// 2880-wide row, 184 KB: 1.05-1.09x); at 8 and 16 tokens (46 and 92 KB)
// 0.88-1.01x (benchmarks/native/mxfp4_tiles.cpp).
constexpr size_t kStretchesFrom = size_t(128) << 10;

}  // namespace
}  // namespace gd
#endif
