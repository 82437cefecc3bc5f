// The int16 row products in AVX-512 (F, BW, VL, VNNI, VBMI: Ice Lake and
// later Xeons, AMD Zen 4 and 5): a chunk's 32 weight codes are one register
// of 32 int16, its 32 activations another, and one vpmaddwd makes the
// chunk's 16 exact pair sums (Q2_K, Q3_K); the grouped formats (the others)
// take eight blocks per register and vpdpwssd, and at decode's few tokens
// vpdpbusd on the activations' bytes (rows_avx512_grouped.cpp: rows_grouped
// and row_split; their pieces in rows_avx512_groups.h and
// rows_avx512_nibbles.h). The plain-float rows (fp32 activations) are
// rows_avx512_float.cpp's. See rows.h for the contract.
//
// Order of the float steps: per token, 16 lanes; lane l of a chunk is the
// exact int32 sum of products 2l and 2l + 1 of the chunk's I16 form, scaled
// (a format whose two halves have their own scales: lanes 0..7 by the first,
// 8..15 by the second) and added into lane l of one of the token's two
// accumulators, even chunks into the first, odd ones into the second; at
// the row's end the two are added, their 16 lanes summed by one fixed
// reduction and the minimums' terms added (the grouped formats: each block's
// whole sum, converted, scaled and added into one lane of an accumulator
// per token that holds two rows, see block_sums and group_rows). A token's
// sums are formed the same way alone or in a tile (batch invariance), within
// the int16 bound of the reference, but not its bits: the reference sums a
// chunk before scaling it.
#include "rows_avx512.h"
#if defined(__x86_64__) || defined(__i386__)

namespace gd {
namespace {

using namespace x86;

// A chunk's 32 weight codes as 32 int16, in the order of the block's I16
// activations (the grouped formats run rows_grouped).
template <Format F>
AVX512 inline __m512i codes16(const uint8_t* blk, int sub) {
  static_assert(!grouped_acts(F, Impl::Avx512), "the grouped formats run rows_grouped");
  return _mm512_cvtepi8_epi16(codes8<F>(blk, sub));
}

// One chunk against TT tokens, into their accumulators (acc: 16 lanes each;
// accm: the minimums' terms); a points at the chunk's run of the tile
// (act_block); d and m: the chunk's scales and offsets.
// The scales d[h] * a.d[t] come from tile_scales (a full tile's by one
// vector multiply, then a broadcast from memory per token) and a full
// tile's minimums' terms from add_tile_min_terms, the same products as the
// scalar steps (the same bits): per token and chunk a multiply and a
// shuffle had made each scale, and five scalar steps each minimums' term
// (128 tokens, Intel Xeon with AMX: Q4_K and Q5_K 0.61-0.64x AVX2's rows,
// Q6_K 0.90x, before).
template <Format F, int TT, bool Mins = has_min(F)>
AVX512 inline void chunk_i16(const uint8_t* blk, int sub, const float d[2], const float m[2], const I16Acts& a,
                             __m512* acc, float* accm) {
  const __m512i w = codes16<F>(blk, sub);
  constexpr int H = halves_differ(F) ? 2 : 1;
  alignas(32) float scale[H][TT];
  for (int h = 0; h < H; ++h) tile_scales<TT>(d[h], a.d, scale[h]);
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) {
    const __m512 s = _mm512_cvtepi32_ps(_mm512_madd_epi16(w, _mm512_loadu_si512(a.q + t * 32)));
    if constexpr (halves_differ(F)) {
      const __m512 sc = _mm512_mask_blend_ps(__mmask16(0xFF00), _mm512_set1_ps(scale[0][t]),
                                             _mm512_set1_ps(scale[1][t]));
      acc[t] = _mm512_fmadd_ps(s, sc, acc[t]);
    } else {
      acc[t] = _mm512_fmadd_ps(s, _mm512_set1_ps(scale[0][t]), acc[t]);
    }
  }
  if constexpr (Mins) add_tile_min_terms<TT>(m, a, accm);
}

// chunk_i16 at one token with the chunk's scales sc (one_token_scales: the
// same products), without the minimums' terms: the
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

// The 16 lanes' sum, in a fixed order (halves, then quarters, ...).
AVX512 inline float hsum16(__m512 v) {
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_castps512_ps256(_mm512_shuffle_f32x4(v, v, 0xEE)));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}

// One row against TT tokens, two accumulators per token whatever the tile
// (even chunks into acc[0], odd ones into acc[1], added at the row's end;
// the minimums' terms likewise): against one accumulator, one token Q8_0
// (before it took the grouped form) and Q5_0 1.01-1.11x, 128 tokens
// 0.96-1.05x. Super-blocks unpack
// their scales once for their eight chunks.
template <Format F, int TT>
AVX512 inline void row_tile_i16(const uint8_t* row, size_t n_chunks, const I16Acts& a, float* out) {
  __m512 acc[2][TT];
  float accm[2][TT];
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) acc[0][t] = acc[1][t] = _mm512_setzero_ps(), accm[0][t] = accm[1][t] = 0.f;
  auto at = [&](size_t c) { return acts_from(a, c * TT); };   // chunk c's activations (act_block)
  // (every format here has super-blocks: the 32-value ones are grouped)
  static_assert(block_values(F) == 256 && !grouped_acts(F, Impl::Avx512));
  float d[8][2], m[8][2];
  for (size_t c0 = 0; c0 < n_chunks; c0 += 8) {
    const uint8_t* blk = row + (c0 / 8) * block_bytes(F);
    if constexpr (TT <= 2) prefetch_ahead(blk, block_bytes(F));
    superblock_scales_avx2<F>(blk, d, m, half_x86);   // (the same values as superblock_scales)
    if constexpr (TT == 1 && !has_min(F)) {
      // one token: the eight chunks' scales by two vector multiplies (the
      // same products chunk_i16 forms one at a time)
      alignas(32) float sc[8][2];
      one_token_scales(d, a.d + c0, sc);
      for (int sub = 0; sub < 8; ++sub) chunk1_i16<F>(blk, sub, sc[sub], a.q + 32 * (c0 + sub), acc[sub & 1][0]);
    } else {
      for (int sub = 0; sub < 8; sub += 2) {
        chunk_i16<F, TT>(blk, sub, d[sub], m[sub], at(c0 + sub), acc[0], accm[0]);
        chunk_i16<F, TT>(blk, sub + 1, d[sub + 1], m[sub + 1], at(c0 + sub + 1), acc[1], accm[1]);
      }
    }
  }
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) out[t] = hsum16(_mm512_add_ps(acc[0][t], acc[1][t])) + (accm[0][t] + accm[1][t]);
}

}  // namespace

void rows_avx512_grouped(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const I16Acts& a, size_t T,
                         float* Y, size_t ldy, const float* bias) {
  if (cpu_has_vbmi()) return rows_avx512_grouped_vbmi(f, W, n0, n1, K, a, T, Y, ldy, bias);
  rows_avx512_grouped_bw(f, W, n0, n1, K, a, T, Y, ldy, bias);
}

void rows_avx512_i16(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const I16Acts& a, size_t T,
                     float* Y, size_t ldy, const float* bias) {
  if (a.amx != nullptr) return rows_amx(f, W, n0, n1, K, a, T, Y, ldy, bias);   // (rows_amx.cpp)
  if (grouped_acts(f, Impl::Avx512))   // (rows_avx512_grouped.cpp)
    return rows_avx512_grouped(f, W, n0, n1, K, a, T, Y, ldy, bias);
  rows_i16_by_tiles(f, W, n0, n1, K, a, T, Y, ldy, bias, [](auto F, auto TT, auto... args) {
    if constexpr (!grouped_acts(decltype(F)::value, Impl::Avx512)) row_tile_i16<decltype(F)::value, decltype(TT)::value>(args...);
  });
}

}  // namespace gd
#endif
