// The int16 row products in AVX2 (with FMA and F16C): one kernel shape for
// every block format, fed by each format's code unpacking, plus MXFP4's
// tuned loop and one-token paths for the K-quants and the 4/5-bit formats.
// See rows.h for the contract; the fp32 rows are rows_avx2.cpp's.
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include <cstring>

#include "cpu.h"
#include "formats.h"
#include "rows.h"
#include "rows_avx2_halves.h"
#include "rows_x86.h"
#include "vecmath.h"

namespace gd {
namespace {

using namespace x86;

// An MXFP4 block's 32 codes through the value table as int8, in one 256-bit
// shuffle: the 16 code bytes in both halves, low nibbles (codes 0..15)
// indexing the table in the first half, high nibbles (codes 16..31) in the
// second (one variable shift moves the second half's high nibbles down).
// (Cores that split 256-bit operations run rows_avx2_halves.h's instead.)
AVX2 inline __m256i mxfp4_codes8(const uint8_t* blk) {
  const __m256i qs = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 1)));
  const __m256i idx = _mm256_and_si256(_mm256_srlv_epi64(qs, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
  return _mm256_shuffle_epi8(mxfp4_values256(), idx);
}

// The 32 weight codes of a chunk as two vectors of 16 int16 that multiply
// the first and the second 16 activations of the block's I16 form. Small
// codes (small_codes: all but Q8_0's and IQ4's): codes 0, 2, .., 30 and 1,
// 3, .., 31 (the activations are in that order, see act_slot), each times
// 256: a 16-bit lane's low byte shifted up is the even code times 256, its
// high byte masked is the odd code times 256 (a shift and an and, where the
// sign-extending widening of both 128-bit halves took an extract and two
// cross-lane conversions: one token Q5_0 10.3 -> 8.2, Q4_K 12.5 -> 10.4
// cycles per chunk, AMD EPYC Zen 2). The factor 256 is exact all the way (a
// lane sums 4 products below 2^30; a float of 256 s is 256 times the float
// of s): the row's sum divides it out at the end (kMxfp4Scale for MXFP4).
// MXFP4's codes come from its value table (mxfp4_codes8). Q8_0 and IQ4:
// codes 0..15 and 16..31, widened from bytes.
template <Format F>
AVX2 inline void load_codes(const uint8_t* blk, int sub, __m256i& first, __m256i& second) {
  if constexpr (F == Format::Q8_0) {
    first = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2)));
    second = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18)));
  } else if constexpr (small_codes(F)) {
    const __m256i v = F == Format::MXFP4 ? mxfp4_codes8(blk) : codes8<F>(blk, sub);
    first = _mm256_slli_epi16(v, 8);                                        // even codes x 256
    second = _mm256_and_si256(v, _mm256_set1_epi16(int16_t(0xFF00)));       // odd codes x 256
  } else {
    const __m256i v = codes8<F>(blk, sub);
    first = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v));
    second = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1));
  }
}

// What the rows' sums of a format carry beyond the true sum: small codes
// enter the products times 256 (load_codes). Dividing by a power of two is
// exact (short of the float range's ends).
template <Format F>
constexpr float codes_factor_inverse() { return small_codes(F) ? 1.f / 256.f : 1.f; }

AVX2 inline float half_avx2(uint16_t h) { return _cvtsh_ss(h); }

// A token's accumulator: 8 lanes, or 4 in the halves' form (rows_avx2_halves.h).
// (Not std::conditional_t: a vector type as a template argument loses its
// attributes, which GCC warns of.)
template <bool Narrow>
struct Acc {
  using type = __m256;
};
template <>
struct Acc<true> {
  using type = __m128;
};
template <bool Narrow>
using AccOf = typename Acc<Narrow>::type;

// A chunk's sums for one token as floats (qt: its 32 activations): each
// lane the exact int32 sum of four products (codes as load_codes gives them).
AVX2 inline __m256 block_sums(__m256i first, __m256i second, const int16_t* qt) {
  const __m256i s0 = _mm256_madd_epi16(first, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qt)));
  const __m256i s1 = _mm256_madd_epi16(second, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qt + 16)));
  return _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1));
}

// A chunk's scale for block_sums' lanes (h0, h1: its halves' scales): with
// small codes in load_codes' even/odd order, lanes 0..3 sum the first half's
// products and 4..7 the second's, so a format whose halves differ blends the
// two.
template <Format F>
AVX2 inline __m256 lane_scales(const float* h0, const float* h1) {
  if constexpr (halves_differ(F)) {
    static_assert(small_codes(F), "the halves' lanes assume load_codes' even/odd order");
    return _mm256_blend_ps(_mm256_broadcast_ss(h0), _mm256_broadcast_ss(h1), 0xF0);
  } else {
    return _mm256_broadcast_ss(h0);
  }
}

// One chunk against TT tokens, into their accumulators (acc: the scaled code
// sums, 8 lanes each, or 4 in the Narrow form of in_four_lanes formats;
// accm: the minimums' terms); a points at the chunk's run of the tile
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
  } else {
    __m256i first, second;
    load_codes<F>(blk, sub, first, second);
    GD_EACH_TOKEN
    for (int t = 0; t < TT; ++t)
      acc[t] = _mm256_fmadd_ps(block_sums(first, second, a.q + t * 32),
                               lane_scales<F>(&scale[0][t], &scale[H - 1][t]), acc[t]);
  }
  if constexpr (Mins && TT != 8) {
    GD_EACH_TOKEN
    for (int t = 0; t < TT; ++t) accm[t] += (m[0] * float(a.s[2 * t]) + m[1] * float(a.s[2 * t + 1])) * a.d[t];
  }
  if constexpr (Mins && TT == 8) {
    // The minimums' terms of a full tile at once, lane t the scalar
    // expression's own steps (the same bits): the tokens' half sums come
    // interleaved (t0 h0, t0 h1, t1 h0, ..), split into two vectors.
    const __m256 lo = _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.s)));
    const __m256 hi = _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.s + 8)));
    const __m256 s0 = in_token_order(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)));
    const __m256 s1 = in_token_order(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1)));
    const __m256 terms = _mm256_mul_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(m[0]), s0),
                                                     _mm256_mul_ps(_mm256_set1_ps(m[1]), s1)),
                                       _mm256_loadu_ps(a.d));
    _mm256_storeu_ps(accm, _mm256_add_ps(_mm256_loadu_ps(accm), terms));
  }
}

// The scales of one 32-value block (MXFP4's come from a table in row_mxfp4).
template <Format F>
AVX2 inline void block_scales(const uint8_t* blk, float d[2], float m[2]) {
  d[0] = d[1] = m[0] = m[1] = 0.f;
  if constexpr (F == Format::Q8_0) {
    uint16_t h;
    std::memcpy(&h, blk, 2);
    d[0] = _cvtsh_ss(h);
  } else if constexpr (F != Format::MXFP4) {
    chunk_scales(F, blk, 0, d, m, half_avx2);
  }
}

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

// chunk_i16 at one token with the chunk's scales sc (one_token_scales), no
// minimums: the same operations.
template <Format F, bool Narrow = false>
AVX2 inline void chunk1_i16(const uint8_t* blk, int sub, const float sc[2], const int16_t* q, AccOf<Narrow>& acc) {
  if constexpr (Narrow) {
    acc = _mm_fmadd_ps(small_sum_h(small_codes_h<F>(blk, sub), q), _mm_broadcast_ss(&sc[0]), acc);
  } else {
    __m256i first, second;
    load_codes<F>(blk, sub, first, second);
    acc = _mm256_fmadd_ps(block_sums(first, second, q), lane_scales<F>(&sc[0], &sc[1]), acc);
  }
}

// One row against TT tokens. One accumulator per token whatever the tile:
// a token's sum is formed in the same order alone or in a batch, so
// prefill, decode and a cached prefix give the same bits. The format is a
// template parameter so that the chunk loop carries no branch; small tiles
// unroll two chunks (large ones would run out of registers). Super-blocks
// unpack their scales once for their eight chunks.
template <Format F, int TT, bool Narrow = false>
AVX2 inline void row_tile_i16(const uint8_t* row, size_t n_chunks, const I16Acts& a, float* out) {
  AccOf<Narrow> acc[TT];
  float accm[TT];
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) acc[t] = AccOf<Narrow>{}, accm[t] = 0.f;
  auto at = [&](size_t c) { return acts_from(a, c * TT); };   // chunk c's activations (act_block)
  if constexpr (block_values(F) == 256) {
    float d[8][2], m[8][2];
    // one token of Q4_K or Q5_K: the minimums' terms in a pass of their own
    constexpr bool mins_apart = (F == Format::Q4_K || F == Format::Q5_K) && TT == 1;
    for (size_t c0 = 0; c0 < n_chunks; c0 += 8) {
      const uint8_t* blk = row + (c0 / 8) * block_bytes(F);
      if constexpr (TT <= 2) prefetch_ahead(blk, block_bytes(F));
      if constexpr (Narrow && F == Format::Q4_K && TT == 1) {
        // The halves' one token takes the eight chunks' scales d sc_j a.d
        // alone (the same two products as below, in one vector), not their
        // minimums nor each scale twice: Zen 1 splits the lane-crossing
        // shuffles that store_twice and one_token_scales use into 8
        // operations each
        uint32_t s[4];
        k4_fields(blk, s);
        alignas(32) float sc[8];
        _mm256_store_ps(sc, _mm256_mul_ps(scaled_bytes(s, blk, half_avx2), _mm256_loadu_ps(a.d + c0)));
        for (int sub = 0; sub < 8; ++sub) chunk1_i16<F, Narrow>(blk, sub, &sc[sub], a.q + 32 * (c0 + sub), acc[0]);
        continue;
      }
      superblock_scales_avx2<F>(blk, d, m, half_avx2);
      if constexpr (TT == 1 && (!has_min(F) || mins_apart)) {
        alignas(32) float sc[8][2];
        one_token_scales(d, a.d + c0, sc);
        for (int sub = 0; sub < 8; ++sub) chunk1_i16<F, Narrow>(blk, sub, sc[sub], a.q + 32 * (c0 + sub), acc[0]);
      } else {
        for (int sub = 0; sub < 8; ++sub)
          chunk_i16<F, TT, has_min(F) && !mins_apart, Narrow>(blk, sub, d[sub], m[sub], at(c0 + sub), acc, accm);
      }
    }
    // The same terms in the same order into their own sum (the row's sum is
    // hsum(acc) + accm either way), after the products: in the products'
    // loop they cost 3.7 of its 10.3 cycles per chunk, apart 2.0 (one-token
    // Q4_K in cache 10.3 -> 8.7 cycles per chunk)
    if constexpr (mins_apart) mins_pass<F, 1>(row, n_chunks, a, accm);
  } else {
    size_t c = 0;
    if constexpr (TT == 1 && (F == Format::Q4_0 || F == Format::Q5_0 || F == Format::IQ4_NL ||
                              F == Format::Q4_1 || F == Format::Q5_1)) {
      // one token, eight chunks at a time: their scales d * a.d by one vector
      // conversion and multiply (eight_block_scales): one token, 2 threads,
      // from memory, Q4_0 1.20x, IQ4_NL 1.17x, Q5_0 1.13x (Q8_0, at the
      // bandwidth already, 0.97-0.99x: it keeps the loop below); Q4_1's and
      // Q5_1's minimums' terms too (eight_min_terms: the same steps, added
      // in chunk order)
      for (; c + 8 <= n_chunks; c += 8) {
        const uint8_t* blk = row + c * block_bytes(F);
        float sc[8];
        eight_block_scales<F>(blk, a.d + c, sc);
        for (int j = 0; j < 8; ++j) {
          prefetch_ahead(blk + j * block_bytes(F), block_bytes(F));
          chunk1_i16<F, Narrow>(blk + j * block_bytes(F), 0, &sc[j], a.q + 32 * (c + j), acc[0]);
        }
        if constexpr (has_min(F)) {
          float terms[8];
          eight_min_terms(eight_block_halves<F>(blk, 2), a, c, terms);
          for (int j = 0; j < 8; ++j) accm[0] += terms[j];
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
        chunk_i16<F, TT, has_min(F), Narrow>(blk, 0, d, m, at(c), acc, accm);
      }
    } else {
#pragma GCC unroll 1
      for (; c < n_chunks; ++c) {
        const uint8_t* blk = row + c * block_bytes(F);
        block_scales<F>(blk, d, m);
        chunk_i16<F, TT, has_min(F), Narrow>(blk, 0, d, m, at(c), acc, accm);
      }
    }
  }
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) {
    if constexpr (Narrow) out[t] = hsum_sse(acc[t]) * codes_factor_inverse<F>() + accm[t];
    else out[t] = hsum_avx2(acc[t]) * codes_factor_inverse<F>() + accm[t];
  }
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
