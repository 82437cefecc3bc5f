// The fp32 row products in AVX2 (with FMA and F16C): the plain-float rows,
// and the block formats' rows against fp32 activations (each block
// dequantized in registers; the tuned Q8_0 and MXFP4 unpacking). The int16
// products are rows_avx2_i16.cpp's. See rows.h for the contract.
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include <cstring>

#include "formats.h"
#include "quants.h"
#include "rows.h"
#include "rows_x86.h"
#include "vecmath.h"

namespace gd {
namespace {

using namespace x86;

// 32 weights of one block as 4 x 8 floats.
AVX2 inline void load_block_q(Format f, const uint8_t* blk, __m256 w[4]) {
  __m128i lo, hi;
  __m256 d;
  if (f == Format::Q8_0) {
    uint16_t h;
    std::memcpy(&h, blk, 2);
    d = _mm256_set1_ps(_cvtsh_ss(h));
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    lo = _mm256_castsi256_si128(q);
    hi = _mm256_extracti128_si256(q, 1);
  } else {
    const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Values));
    const __m128i mask = _mm_set1_epi8(0x0F);
    d = _mm256_set1_ps(e8m0_to_fp32_half(blk[0]));
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 1));
    lo = _mm_shuffle_epi8(table, _mm_and_si128(qs, mask));
    hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(qs, 4), mask));
  }
  w[0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)));
  w[1] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))));
  w[2] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)));
  w[3] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))));
}

// 32 weights of any format as 4 x 8 floats: the tuned Q8_0 and MXFP4 paths,
// the plain floats converted, other block formats through chunk_codes.
AVX2 inline void load_block(Format f, const uint8_t* blk, int sub, __m256 w[4]) {
  switch (f) {
    case Format::Q8_0:
    case Format::MXFP4:
      return load_block_q(f, blk, w);
    case Format::F32:
      for (int k = 0; k < 4; ++k) w[k] = _mm256_loadu_ps(reinterpret_cast<const float*>(blk) + 8 * k);
      return;
    case Format::F16:
      for (int k = 0; k < 4; ++k)
        w[k] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * k)));
      return;
    case Format::BF16:
      for (int k = 0; k < 4; ++k)
        w[k] = _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * k))), 16));
      return;
    default: {
      alignas(32) float v[32];
      int8_t q[32];
      float d[2], m[2];
      chunk_codes(f, blk, sub, q, d, m);
      for (int j = 0; j < 32; ++j) v[j] = d[j / 16] * float(q[j]) + m[j / 16];
      for (int k = 0; k < 4; ++k) w[k] = _mm256_load_ps(v + 8 * k);
    }
  }
}

// One row against TT (1 or 2) tokens. Each token's products are summed in
// four accumulators (products k = 0..3 of each block in accumulator k), so
// the FMA latency does not bound the speed at decode's one token, and a
// token's sums are formed in the same order whatever the tile: tiles stay at
// two tokens (the row stays in L1 across them) so that the accumulators fit
// in registers (rows_by_float_tiles).

template <Format F, int TT>
AVX2 inline void row_tile(const uint8_t* row, size_t n_blocks, const float* X, size_t ldx,
                          float* out /* TT values */) {
  __m256 acc[TT][4];
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t)
    for (int a = 0; a < 4; ++a) acc[t][a] = _mm256_setzero_ps();
  for (size_t b = 0; b < n_blocks; ++b) {
    __m256 w[4];
    int sub;
    const uint8_t* blk = chunk_block(F, row, b, sub);   // (sets sub)
    load_block(F, blk, sub, w);
    const float* xb = X + b * kBlock;
    GD_EACH_TOKEN
    for (int t = 0; t < TT; ++t) {
      const float* x = xb + t * ldx;
      for (int k = 0; k < 4; ++k) acc[t][k] = _mm256_fmadd_ps(w[k], _mm256_loadu_ps(x + 8 * k), acc[t][k]);
    }
  }
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t)
    out[t] = hsum_avx2(_mm256_add_ps(_mm256_add_ps(acc[t][0], acc[t][1]), _mm256_add_ps(acc[t][2], acc[t][3])));
}

// 8 plain-float weights from value i of a row on, as floats (exact).
template <Format F>
AVX2 inline __m256 load8(const uint8_t* row, size_t i) {
  if constexpr (F == Format::F32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + i);
  } else if constexpr (F == Format::F16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i)));
  } else {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i))), 16));
  }
}

// R rows of plain floats (F32, F16, BF16) against TT tokens: one accumulator
// per row and token, the products of values i .. i + 7 into it in order of
// i, then one fixed sum across its lanes, so a row's sum for a token is the
// same in any tile (K: a multiple of 32, checked at the bindings). Eight
// weights of each row are loaded once for all TT tokens and each token's
// eight activations once for all R rows: a tile of 3 rows and 4 tokens
// issues 7 loads per 12 fused multiply-adds, where row_tile (one row, four
// accumulators per token; the quantized formats' fp32 rows) issued 12 per 8
// and was bound by its loads. At 128 tokens, 4 x 2 tiles against row_tile:
// F16 1.59x, BF16 1.40x, F32 1.62x (AMD EPYC, 2 threads).
template <Format F, int R, int TT>
AVX2 inline void float_tile(const uint8_t* row, size_t rb, size_t K, const float* X, size_t ldx, float* out) {
  __m256 acc[R][TT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < TT; ++t) acc[r][t] = _mm256_setzero_ps();
  for (size_t i = 0; i < K; i += 8) {
    __m256 w[R];
    for (int r = 0; r < R; ++r) w[r] = load8<F>(row + r * rb, i);
    for (int t = 0; t < TT; ++t) {
      const __m256 x = _mm256_loadu_ps(X + t * ldx + i);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(w[r], x, acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < TT; ++t) out[r * TT + t] = hsum_avx2(acc[r][t]);
}

// Rows [n0, n1) of plain floats in tiles of 3 rows and 4 tokens (12
// accumulators, 3 weight vectors and an activation: the 16 registers), 4
// rows at one token (decode: four independent chains); tokens outside, as
// rows_by_float_tiles; the last rows and tokens in smaller tiles of the same
// order. 3 x 4 against 4 x 2: 128 tokens BF16 1.29x, F32 1.20x, F16 1.02x.
constexpr int kFloatTokens = 4;

template <Format F>
AVX2 void float_rows(const uint8_t* W, size_t n0, size_t n1, size_t K, const float* X, size_t ldx, size_t T,
                     float* Y, size_t ldy, const float* bias) {
  const size_t rb = row_bytes(F, K);
  float tmp[4 * kFloatTokens];
  for (size_t t0 = 0; t0 < T; t0 += kFloatTokens) {
    const size_t tt = std::min<size_t>(kFloatTokens, T - t0), rows = tt == 1 ? 4 : 3;
    const float* x = X + t0 * ldx;
    for (size_t n = n0; n < n1; n += rows) {
      const size_t rr = std::min(rows, n1 - n);
      const uint8_t* row = W + n * rb;
      auto tile = [&](auto R) {
        with_tile(tt, [&](auto TT) {
          constexpr int r = decltype(R)::value, t = decltype(TT)::value;
          if constexpr (r * t <= 12 && t <= kFloatTokens) float_tile<F, r, t>(row, rb, K, x, ldx, tmp);
        });
      };
      with_up_to_four(rr, tile);
      store_tile(tmp, n, rr, t0, tt, Y, ldy, bias);
    }
  }
}

}  // namespace

void rows_avx2(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const float* X, size_t ldx, size_t T,
               float* Y, size_t ldy, const float* bias) {
  with_format(f, [&](auto F) {
    constexpr Format G = decltype(F)::value;
    if constexpr (is_float(G)) return float_rows<G>(W, n0, n1, K, X, ldx, T, Y, ldy, bias);
    rows_by_float_tiles(f, W, n0, n1, K, X, ldx, T, Y, ldy, bias,
                        [&](auto TT, const uint8_t* row, const float* x, float* out) {
                          row_tile<G, decltype(TT)::value>(row, K / 32, x, ldx, out);
                        });
  });
}

}  // namespace gd
#endif
