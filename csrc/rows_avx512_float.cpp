// AVX-512's plain-float rows (F16, BF16, F32 weights against fp32
// activations: the unsloth F16 files' attention and output head, 2.4 GB of
// the 20b's 3.7 a decoded token) with AVX2's bits: rows_avx2.cpp's
// float_tile keeps one 8-lane accumulator per row and token (lane l the
// products of values l, l + 8, .. in order, by FMA) and sums its lanes by
// hsum_avx2; here two rows share a register, row a in lanes 0..7 and row b
// in lanes 8..15, each half the same FMAs on the same numbers as AVX2's
// register, then the same sum. So a token's results are AVX2's bits
// whatever the path, the tile or the batch (tests/test_avx512.py), and one
// instruction does AVX2's two: per 8 values of a row pair two 16-byte loads,
// an insert, one conversion and one FMA against the token's 8 activations
// broadcast to both halves.
//
// At one token (decode) 8 rows at a time (four FMA chains) stream from
// memory with prefetches: each row's lines into the L1 a little ahead, and
// the next 8 rows' lines into the L2 spread over this pass. Many tokens: 6
// or 8 rows against up to 8 tokens (24 of the 32 registers accumulate).
#include "rows_avx512.h"
#if defined(__x86_64__) || defined(__i386__)

#include <algorithm>

#include "vecmath.h"

namespace gd {
namespace {

using namespace x86;

// Values i .. i + 7 of rows a and b as floats, a's in lanes 0..7 (exact
// conversions: AVX2's load8).
template <Format F>
AVX512 inline __m512 load_pair(const uint8_t* a, const uint8_t* b, size_t i) {
  if constexpr (F == Format::F32) {
    const __m256d lo = _mm256_castps_pd(_mm256_loadu_ps(reinterpret_cast<const float*>(a) + i));
    const __m256d hi = _mm256_castps_pd(_mm256_loadu_ps(reinterpret_cast<const float*>(b) + i));
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(lo), hi, 1));
  } else {
    const __m256i h = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 2 * i))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 * i)), 1);
    if constexpr (F == Format::F16) return _mm512_cvtph_ps(h);
    else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// A token's 8 activations from value i on, in both halves.
AVX512 inline __m512 both_halves(const float* x) {
  return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(x))));
}

// P row pairs (rows[2p], rows[2p + 1]; a lone last row is its own pair)
// against TT tokens: out[(2p + h) TT + t], AVX2's float_tile sums.
// Prefetch: at one token, each row's lines kAhead bytes on into the L1, and
// `next` (the rows after these: `next_bytes` of them) into the L2, a share
// every 64 bytes of a row.
constexpr size_t kAhead = 512;

template <Format F, int P, int TT, bool Stream>
AVX512 inline void pair_tile(const uint8_t* const* rows, size_t K, const float* X, size_t ldx,
                             const uint8_t* next, size_t next_bytes, float* out) {
  constexpr size_t kValueBytes = F == Format::F32 ? 4 : 2;
  constexpr size_t kStep = 64 / kValueBytes;   // values per line of a row
  __m512 acc[P][TT];
  for (int p = 0; p < P; ++p)
    for (int t = 0; t < TT; ++t) acc[p][t] = _mm512_setzero_ps();
  // the next rows' lines, as many each line of this pass as keeps pace
  const size_t lines = K / kStep, share = Stream ? (next_bytes / 64 + lines - 1) / lines : 0;
  size_t asked = 0;
  for (size_t i = 0; i < K; i += 8) {
    if constexpr (Stream) {
      if (i % kStep == 0) {
        for (int r = 0; r < 2 * P; ++r) _mm_prefetch(reinterpret_cast<const char*>(rows[r] + kValueBytes * i + kAhead), _MM_HINT_T0);
        for (size_t j = 0; j < share && asked < next_bytes; ++j, asked += 64)
          _mm_prefetch(reinterpret_cast<const char*>(next + asked), _MM_HINT_T1);
      }
    }
    __m512 w[P];
    for (int p = 0; p < P; ++p) w[p] = load_pair<F>(rows[2 * p], rows[2 * p + 1], i);
    GD_EACH_TOKEN
    for (int t = 0; t < TT; ++t) {
      const __m512 x = both_halves(X + t * ldx + i);
      for (int p = 0; p < P; ++p) acc[p][t] = _mm512_fmadd_ps(w[p], x, acc[p][t]);
    }
  }
  for (int p = 0; p < P; ++p)
    for (int t = 0; t < TT; ++t) {
      const __m512 v = acc[p][t];
      out[(2 * p) * TT + t] = hsum_avx2(_mm512_castps512_ps256(v));
      out[(2 * p + 1) * TT + t] = hsum_avx2(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    }
}

// Rows [n0, n1) of plain floats: tokens in tiles of up to 8 outside, rows
// inside in groups of 2 P (P pairs: 4 up to 6 tokens, 3 at 7 and 8).
constexpr int kTokens = 8;

template <Format F>
AVX512 void float_rows(const uint8_t* W, size_t n0, size_t n1, size_t K, const float* X, size_t ldx, size_t T,
                       float* Y, size_t ldy, const float* bias) {
  const size_t rb = row_bytes(F, K);
  float tmp[8 * kTokens];
  for (size_t t0 = 0; t0 < T; t0 += kTokens) {
    const size_t tt = std::min<size_t>(kTokens, T - t0);
    const size_t group = tt <= 6 ? 8 : 6;   // rows a pass
    const float* x = X + t0 * ldx;
    for (size_t n = n0; n < n1; n += group) {
      const size_t rr = std::min(group, n1 - n);
      const uint8_t* rows[8];
      for (size_t r = 0; r < 8; ++r) rows[r] = W + (n + std::min(r, rr - 1)) * rb;   // (a lone row twice)
      const uint8_t* next = W + (n + rr) * rb;   // (past the matrix: prefetches do not fault)
      auto tile = [&](auto P) {
        constexpr int p = decltype(P)::value;
        with_tile(tt, [&](auto TT) {
          constexpr int t = decltype(TT)::value;
          if constexpr (p * t <= 24) {
            if constexpr (t == 1) pair_tile<F, p, 1, true>(rows, K, x, ldx, next, rr * rb, tmp);
            else pair_tile<F, p, t, false>(rows, K, x, ldx, nullptr, 0, tmp);
          }
        });
      };
      with_up_to_four((rr + 1) / 2, tile);
      store_tile(tmp, n, rr, t0, tt, Y, ldy, bias);
    }
  }
}

}  // namespace

void rows_avx512(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const float* X, size_t ldx, size_t T,
                 float* Y, size_t ldy, const float* bias) {
  switch (f) {
    case Format::F16: return float_rows<Format::F16>(W, n0, n1, K, X, ldx, T, Y, ldy, bias);
    case Format::BF16: return float_rows<Format::BF16>(W, n0, n1, K, X, ldx, T, Y, ldy, bias);
    case Format::F32: return float_rows<Format::F32>(W, n0, n1, K, X, ldx, T, Y, ldy, bias);
    default: return rows_avx2(f, W, n0, n1, K, X, ldx, T, Y, ldy, bias);   // (block formats' fp32 rows: AVX2's)
  }
}

}  // namespace gd
#endif
