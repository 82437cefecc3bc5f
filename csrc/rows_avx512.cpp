// The int16 row products in AVX-512 (F, BW, VL): a chunk's 32 weight codes
// are one register of 32 int16, its 32 activations another, and one
// vpmaddwd makes the chunk's 16 exact pair sums. The plain-float rows (fp32
// activations) are AVX2's (rows_avx2.cpp): they are not this path's hot
// kernels. See rows.h for the contract.
//
// Order of the float steps: per token, 16 lanes; lane l of a chunk is the
// exact int32 sum of products 2l and 2l + 1 of the chunk's I16 form, scaled
// (a format whose two halves have their own scales: lanes 0..7 by the first,
// 8..15 by the second) and added into lane l of one of the token's two
// accumulators, even chunks into the first, odd ones into the second; at
// the row's end the two are added, their 16 lanes summed by one fixed
// reduction and the minimums' terms added. A token's sums are formed the
// same way alone or in a tile (batch invariance), within the int16 bound of
// the reference, but not its bits: the reference sums a chunk before
// scaling it.
//
// VNNI's vpdpwssd would fold the vpmaddwd into an int32 accumulation, but
// every chunk here has its own float scale, so there is no int32 sum to
// fold into: vpmaddwd is the instruction, and the path asks for F/BW/VL only.
#if defined(__x86_64__) || defined(__i386__)
// GCC 12's AVX-512 intrinsics initialize their undefined vectors from
// themselves, which -W(maybe-)uninitialized reports once inlined into target-
// attribute functions (GCC bug 105593, fixed in 13): a false alarm.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#ifndef GOOSEDUMP_AVX512_EMULATED
#include <immintrin.h>
// (tests/test_avx512.py compiles this file with GOOSEDUMP_AVX512_EMULATED and
// SIMDe's portable AVX-512 in place of the instructions, on CPUs without
// them: the functions then take AVX2's target)
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#else
#define AVX512 __attribute__((target("avx2,fma,f16c")))
#endif

#include <cstring>

#include "formats.h"
#include "matmul.h"
#include "quants.h"
#include "rows.h"
#include "rows_x86.h"

namespace gd {
namespace {

using namespace x86;

// A chunk's 32 weight codes as 32 int16, in the order of the block's I16
// activations (MXFP4 runs row_mxfp4 below).
template <Format F>
AVX512 inline __m512i codes16(const uint8_t* blk, int sub) {
  static_assert(F != Format::MXFP4, "MXFP4 runs row_mxfp4");
  if constexpr (F == Format::Q8_0) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)));
  } else {
    return _mm512_cvtepi8_epi16(codes8<F>(blk, sub));
  }
}

// One chunk against TT tokens, into their accumulators (acc: 16 lanes each;
// accm: the minimums' terms); a points at the chunk's run of the tile
// (act_block); d and m: the chunk's scales and offsets.
template <Format F, int TT, bool Mins = has_min(F)>
AVX512 inline void chunk_i16(const uint8_t* blk, int sub, const float d[2], const float m[2], const I16Acts& a,
                             __m512* acc, float* accm) {
  const __m512i w = codes16<F>(blk, sub);
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) {
    const __m512 s = _mm512_cvtepi32_ps(_mm512_madd_epi16(w, _mm512_loadu_si512(a.q + t * 32)));
    if constexpr (halves_differ(F)) {
      const __m512 scale = _mm512_mask_blend_ps(__mmask16(0xFF00), _mm512_set1_ps(d[0] * a.d[t]),
                                                _mm512_set1_ps(d[1] * a.d[t]));
      acc[t] = _mm512_fmadd_ps(s, scale, acc[t]);
    } else {
      acc[t] = _mm512_fmadd_ps(s, _mm512_set1_ps(d[0] * a.d[t]), acc[t]);
    }
    if constexpr (Mins) accm[t] += (m[0] * float(a.s[2 * t]) + m[1] * float(a.s[2 * t + 1])) * a.d[t];
  }
}

// chunk_i16 at one token with the chunk's scales sc (one_token_scales or
// eight_block_scales: the same products), without the minimums' terms: the
// same operations.
template <Format F>
AVX512 inline void chunk1_i16(const uint8_t* blk, int sub, const float sc[2], const int16_t* q, __m512& acc) {
  const __m512 s = _mm512_cvtepi32_ps(_mm512_madd_epi16(codes16<F>(blk, sub), _mm512_loadu_si512(q)));
  if constexpr (halves_differ(F)) {
    acc = _mm512_fmadd_ps(s, _mm512_mask_blend_ps(__mmask16(0xFF00), _mm512_set1_ps(sc[0]), _mm512_set1_ps(sc[1])),
                          acc);
  } else {
    acc = _mm512_fmadd_ps(s, _mm512_set1_ps(sc[0]), acc);
  }
}

AVX512 inline float half_avx512(uint16_t h) { return _cvtsh_ss(h); }

// The scales of one 32-value block (the MXFP4 kernel takes its own from a table).
template <Format F>
AVX512 inline void block_scales(const uint8_t* blk, float d[2], float m[2]) {
  d[0] = d[1] = m[0] = m[1] = 0.f;
  if constexpr (F == Format::Q8_0) {
    uint16_t h;
    std::memcpy(&h, blk, 2);
    d[0] = _cvtsh_ss(h);
  } else {
    chunk_scales(F, blk, 0, d, m, half_avx512);
  }
}

// The 16 lanes' sum, in a fixed order (halves, then quarters, ...).
AVX512 inline float hsum16(__m512 v) {
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_castps512_ps256(_mm512_shuffle_f32x4(v, v, 0xEE)));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}

// MXFP4's 16 values times 256 (as the AVX2 path's codes, see load_codes
// there: kMxfp4Scale divides the 256 out), twice over as 32 int16: vpermw
// reads an index's low five bits, so a nibble indexes the table whatever
// the bit above it holds.
AVX512 inline __m512i mxfp4_table16() {
  const __m256i v = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(mxfp4_values256()));
  return _mm512_broadcast_i64x4(_mm256_slli_epi16(v, 8));
}

// An MXFP4 block's 32 codes as int16 in act_slot's even/odd order, by two
// operations: the 16 code bytes in all four 128-bit lanes, each lane's
// words shifted right by 0, 4, 8 and 12 bits (word i then holds, in its low
// nibble, code 2i, 16 + 2i, 2i + 1 and 17 + 2i: lanes 0..3 of the even/odd
// order), and the table looked up by word (vpermw). The widening it
// replaces took five (a 64-bit shift, a mask, a byte shuffle, a 16-bit
// shift and a mask).
AVX512 inline __m512i mxfp4_codes16(const uint8_t* blk, __m512i table) {
  const __m512i qs = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 1)));
  const __m512i shifts = _mm512_setr_epi64(0, 0, 0x0004000400040004, 0x0004000400040004, 0x0008000800080008,
                                           0x0008000800080008, 0x000C000C000C000C, 0x000C000C000C000C);
  return _mm512_permutexvar_epi16(_mm512_srlv_epi16(qs, shifts), table);
}

// A block's sums for one token (qt: its 32 activations) as floats: lane l
// the exact int32 sum of products 2l and 2l + 1.
AVX512 inline __m512 mxfp4_sums(__m512i w, const int16_t* qt) {
  return _mm512_cvtepi32_ps(_mm512_madd_epi16(w, _mm512_loadu_si512(qt)));
}

// A block's scale for one token (et: the token's ActView::e of the block).
AVX512 inline __m512 mxfp4_scale(const uint8_t* blk, int32_t et) { return _mm512_set1_ps(kMxfp4Scale[blk[0] + et]); }

// Blocks c and c + 1 of a row (blk) against TT tokens (qc, ec: the tile's
// activations of block c on), each into its own of the token's two
// accumulators (acc: even blocks, acc + TT: odd ones).
template <int TT>
AVX512 inline void mxfp4_pair(const uint8_t* blk, const int16_t* qc, const int32_t* ec, __m512i table,
                              __m512* acc) {
  const __m512i w0 = mxfp4_codes16(blk, table), w1 = mxfp4_codes16(blk + 17, table);
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) {
    acc[t] = _mm512_fmadd_ps(mxfp4_sums(w0, qc + 32 * t), mxfp4_scale(blk, ec[t]), acc[t]);
    acc[TT + t] = _mm512_fmadd_ps(mxfp4_sums(w1, qc + 32 * (TT + t)), mxfp4_scale(blk + 17, ec[TT + t]), acc[TT + t]);
  }
}

// MXFP4 in a loop of its own, for every tile: a token's even blocks summed
// into one 16-lane accumulator, its odd ones into another, the two added at
// the row's end, so a token's bits do not depend on the tile. Against the
// general loop (one accumulator, the five-operation widening, a prefetch
// test in every block): one token in cache 1.4-1.6x, 128 tokens 0.93-0.97x
// (AMD EPYC Zen 5, one thread, alternating builds). Two accumulators: the
// loop stripped of its unpacking and scales is bound by one FMA chain; the
// whole loop ran the same with block pairs (c0 d0 + c1 d1, into one or two
// accumulators) and with the next pass's codes unpacked ahead.
template <int TT>
AVX512 inline void row_mxfp4(const uint8_t* row, size_t n_chunks, const I16Acts& a, float* out) {
  const __m512i table = mxfp4_table16();
  const int16_t* q = a.q;
  const int32_t* e = a.e;
  __m512 acc[2 * TT];
  GD_EACH_TOKEN
  for (int t = 0; t < 2 * TT; ++t) acc[t] = _mm512_setzero_ps();
  const uint8_t* blk = row;
  size_t c = 0;
  if constexpr (TT <= 2) {
    // Decode streams the row from memory: four blocks (68 bytes) per pass,
    // one prefetch each (a line in 17 is left to the hardware prefetcher).
    for (; c + 4 <= n_chunks; c += 4, blk += 4 * 17, q += 4 * 32 * TT, e += 4 * TT) {
      __builtin_prefetch(blk + kPrefetchAhead, 0, 3);
      mxfp4_pair<TT>(blk, q, e, table, acc);
      mxfp4_pair<TT>(blk + 34, q + 64 * TT, e + 2 * TT, table, acc);
    }
  }
  for (; c + 2 <= n_chunks; c += 2, blk += 34, q += 64 * TT, e += 2 * TT) mxfp4_pair<TT>(blk, q, e, table, acc);
  if (c < n_chunks) {
    const __m512i w = mxfp4_codes16(blk, table);
    GD_EACH_TOKEN
    for (int t = 0; t < TT; ++t) acc[t] = _mm512_fmadd_ps(mxfp4_sums(w, q + 32 * t), mxfp4_scale(blk, e[t]), acc[t]);
  }
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) out[t] = hsum16(_mm512_add_ps(acc[t], acc[TT + t]));
}

// One row against TT tokens, two accumulators per token whatever the tile
// (even chunks into acc[0], odd ones into acc[1], added at the row's end;
// the minimums' terms likewise), as MXFP4's: one token
// Q8_0 and Q5_0 1.01-1.11x, 128 tokens 0.96-1.05x. Super-blocks unpack
// their scales once for their eight chunks.
template <Format F, int TT>
AVX512 inline void row_tile_i16(const uint8_t* row, size_t n_chunks, const I16Acts& a, float* out) {
  __m512 acc[2][TT];
  float accm[2][TT];
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) acc[0][t] = acc[1][t] = _mm512_setzero_ps(), accm[0][t] = accm[1][t] = 0.f;
  auto at = [&](size_t c) { return acts_from(a, c * TT); };   // chunk c's activations (act_block)
  if constexpr (block_values(F) == 256) {
    float d[8][2], m[8][2];
    // one token of Q4_K or Q5_K: the minimums' terms in a pass of their own
    // (as on AVX2: the same terms in the same order)
    constexpr bool mins_apart = (F == Format::Q4_K || F == Format::Q5_K) && TT == 1;
    for (size_t c0 = 0; c0 < n_chunks; c0 += 8) {
      const uint8_t* blk = row + (c0 / 8) * block_bytes(F);
      if constexpr (TT <= 2) prefetch_ahead(blk, block_bytes(F));
      superblock_scales_avx2<F>(blk, d, m, half_avx512);   // (the same values as superblock_scales)
      if constexpr (TT == 1 && (!has_min(F) || mins_apart)) {
        // one token: the eight chunks' scales by two vector multiplies (the
        // same products chunk_i16 forms one at a time)
        alignas(32) float sc[8][2];
        one_token_scales(d, a.d + c0, sc);
        for (int sub = 0; sub < 8; ++sub) chunk1_i16<F>(blk, sub, sc[sub], a.q + 32 * (c0 + sub), acc[sub & 1][0]);
      } else {
        for (int sub = 0; sub < 8; sub += 2) {
          chunk_i16<F, TT, has_min(F) && !mins_apart>(blk, sub, d[sub], m[sub], at(c0 + sub), acc[0], accm[0]);
          chunk_i16<F, TT, has_min(F) && !mins_apart>(blk, sub + 1, d[sub + 1], m[sub + 1], at(c0 + sub + 1), acc[1],
                                                      accm[1]);
        }
      }
    }
    if constexpr (mins_apart) {
      float sums[2] = {0.f, 0.f};
      mins_pass<F, 2>(row, n_chunks, a, sums);
      accm[0][0] = sums[0], accm[1][0] = sums[1];
    }
  } else {
    float d[2], m[2];
    size_t c = 0;
    if constexpr (TT == 1 && (F == Format::Q4_0 || F == Format::Q5_0 || F == Format::IQ4_NL)) {
      // one token, eight chunks at a time: their scales d * a.d by one vector
      // conversion and multiply (the same products)
      for (; c + 8 <= n_chunks; c += 8) {
        const uint8_t* blk = row + c * block_bytes(F);
        float sc[8];
        eight_block_scales<F>(blk, a.d + c, sc);
        for (int j = 0; j < 8; ++j) {
          prefetch_ahead(blk + j * block_bytes(F), block_bytes(F));
          chunk1_i16<F>(blk + j * block_bytes(F), 0, &sc[j], a.q + 32 * (c + j), acc[j & 1][0]);
        }
      }
    }
    for (; c < n_chunks; c += 2) {
      const uint8_t* blk = row + c * block_bytes(F);
      if constexpr (TT <= 2) prefetch_ahead(blk, block_bytes(F));   // (decode: rows streamed once)
      block_scales<F>(blk, d, m);
      chunk_i16<F, TT>(blk, 0, d, m, at(c), acc[0], accm[0]);
      if (c + 1 == n_chunks) break;
      blk += block_bytes(F);
      if constexpr (TT <= 2) prefetch_ahead(blk, block_bytes(F));
      block_scales<F>(blk, d, m);
      chunk_i16<F, TT>(blk, 0, d, m, at(c + 1), acc[1], accm[1]);
    }
  }
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) out[t] = hsum16(_mm512_add_ps(acc[0][t], acc[1][t])) + (accm[0][t] + accm[1][t]);
}

}  // namespace

void rows_avx512_i16(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const I16Acts& a, size_t T,
                     float* Y, size_t ldy, const float* bias) {
  rows_i16_by_tiles(f, W, n0, n1, K, a, T, Y, ldy, bias, [](auto F, auto TT, auto... args) {
    if constexpr (decltype(F)::value == Format::MXFP4) row_mxfp4<decltype(TT)::value>(args...);
    else row_tile_i16<decltype(F)::value, decltype(TT)::value>(args...);
  });
}

}  // namespace gd
#endif
