#include "matmul.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "quants.h"
#include "threads.h"
#include "vecmath.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GD_X86 1
#endif

namespace gd {

size_t row_bytes(Format f, size_t K) { return K / kBlock * (f == Format::Q8_0 ? kQ8_0Bytes : kMxfp4Bytes); }

namespace {

// The scale of an MXFP4 block's sum in the I16 kernels, by table: the
// weight scale e8m0_to_fp32_half(e) = 2^(e - 128) times the activation block
// scale 2^-k, over the 256 the codes carry (see load_codes), is
// 2^(e - 136 - k) = kMxfp4Scale[e + ActView::e[b]] with ActView::e[b] =
// 128 - k. A broadcast load: no multiply and no register broadcast per block.
struct Mxfp4ScaleTable {
  float v[512];
  Mxfp4ScaleTable() {
    for (int i = 0; i < 512; ++i) v[i] = float(std::ldexp(1.0, i - 264));
  }
};
const Mxfp4ScaleTable kMxfp4ScaleTable;
const float* const kMxfp4Scale = kMxfp4ScaleTable.v;
constexpr int kScaleBias = 128;   // ActView::e[b] = kScaleBias - k
constexpr int kMaxShift = 126;    // activation block scales 2^-k, |k| <= kMaxShift

constexpr size_t kRowsPerTask = 16;
constexpr size_t kTokenTile = 8;

// Where block b of token t sits in the I16 form (in blocks): tokens in
// tiles of kTokenTile, a tile's blocks one after another, each holding the
// tile's tokens. A tile's activations are contiguous and a block's step
// is small (a token-major walk over a few tokens would land on few cache
// sets; a fully block-major one too, at large T).
inline size_t act_block(size_t t, size_t b, size_t T, size_t nb) {
  const size_t t0 = t - t % kTokenTile, tt = std::min(kTokenTile, T - t0);
  return t0 * nb + b * tt + (t - t0);
}

void dequant_row(Format f, const uint8_t* row, size_t K, float* out, Impl impl) {
  if (f == Format::Q8_0) dequantize_q8_0(row, out, K / kBlock, impl);
  else dequantize_mxfp4(row, out, K / kBlock, impl);
}

// ---- portable reference ---------------------------------------------------
// Dequantize one row, then plain fp32 dot products (fixed summation order:
// the block sums, in order).
void rows_generic(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const float* X, size_t ldx,
                  size_t T, float* Y, size_t ldy, const float* bias) {
  std::vector<float> w(K);
  const size_t rb = row_bytes(f, K);
  for (size_t n = n0; n < n1; ++n) {
    dequant_row(f, W + n * rb, K, w.data(), Impl::Generic);
    for (size_t t = 0; t < T; ++t) {
      const float* x = X + t * ldx;
      float acc = 0.f;
      for (size_t k = 0; k < K; ++k) acc += w[k] * x[k];
      Y[t * ldy + n] = acc + (bias ? bias[n] : 0.f);
    }
  }
}

// The 32 weight codes of a block as int8 and its scale.
inline float block_codes(Format f, const uint8_t* blk, int8_t w[32]) {
  if (f == Format::Q8_0) {
    uint16_t h;
    std::memcpy(&h, blk, 2);
    std::memcpy(w, blk + 2, 32);
    return fp16_to_fp32(h);
  }
  for (int j = 0; j < 16; ++j) {
    w[j] = kMxfp4Values[blk[1 + j] & 0x0F];
    w[j + 16] = kMxfp4Values[blk[1 + j] >> 4];
  }
  return e8m0_to_fp32_half(blk[0]);
}

void rows_generic_i16(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const int16_t* Q,
                      const float* D, size_t T, float* Y, size_t ldy, const float* bias) {
  const size_t rb = row_bytes(f, K), nb = K / kBlock, bb = rb / nb;
  int8_t w[32];
  for (size_t n = n0; n < n1; ++n) {
    for (size_t t = 0; t < T; ++t) {
      float acc = 0.f;
      for (size_t b = 0; b < nb; ++b) {
        const float dw = block_codes(f, W + n * rb + b * bb, w);
        const int16_t* q = Q + act_block(t, b, T, nb) * kBlock;
        int32_t s = 0;
        if (f == Format::MXFP4)
          for (int j = 0; j < 32; ++j) s += int32_t(w[j]) * q[act_slot(j)];
        else
          for (int j = 0; j < 32; ++j) s += int32_t(w[j]) * q[j];
        acc += float(s) * (dw * D[act_block(t, b, T, nb)]);
      }
      Y[t * ldy + n] = acc + (bias ? bias[n] : 0.f);
    }
  }
}

// Calls fn(std::integral_constant<int, tt>) for a tile of 1..8 tokens, so
// kernels can keep one accumulator per token in registers.
template <class Fn>
inline void with_tile(size_t tt, Fn&& fn) {
  switch (tt) {
    case 8: fn(std::integral_constant<int, 8>{}); break;
    case 7: fn(std::integral_constant<int, 7>{}); break;
    case 6: fn(std::integral_constant<int, 6>{}); break;
    case 5: fn(std::integral_constant<int, 5>{}); break;
    case 4: fn(std::integral_constant<int, 4>{}); break;
    case 3: fn(std::integral_constant<int, 3>{}); break;
    case 2: fn(std::integral_constant<int, 2>{}); break;
    default: fn(std::integral_constant<int, 1>{}); break;
  }
}

// Rows [n0, n1) in tiles of up to 8 tokens: tile(TT, row, t0, out) computes
// one row against tokens t0 .. t0 + TT - 1.
template <class Tile>
inline void rows_by_tiles(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, size_t T, float* Y,
                          size_t ldy, const float* bias, Tile&& tile) {
  const size_t rb = row_bytes(f, K);
  float tmp[kTokenTile];
  for (size_t n = n0; n < n1; ++n) {
    const uint8_t* row = W + n * rb;
    const float b = bias ? bias[n] : 0.f;
    for (size_t t0 = 0; t0 < T; t0 += kTokenTile) {
      const size_t tt = std::min(kTokenTile, T - t0);
      with_tile(tt, [&](auto TT) { tile(TT, row, t0, tmp); });
      for (size_t t = 0; t < tt; ++t) Y[(t0 + t) * ldy + n] = tmp[t] + b;
    }
  }
}

#ifdef GD_X86
// 32 weights of one block as 4 x 8 floats.
__attribute__((target("avx2,fma,f16c"))) inline void load_block(Format f, const uint8_t* blk, __m256 w[4]) {
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

// One row against TT tokens. Each token's four products per block form a
// dependency chain on its accumulator; with few tokens that chain (FMA
// latency) would bound the speed, so small tiles split it over A = 4 / TT
// accumulators per token.
template <int TT>
__attribute__((target("avx2,fma,f16c"))) inline void row_tile(Format f, const uint8_t* row, size_t n_blocks,
                                                                size_t block_bytes, const float* X, size_t ldx,
                                                                float* out /* TT values */) {
  constexpr int A = TT >= 4 ? 1 : 4 / TT;
  __m256 acc[TT][A];
  for (int t = 0; t < TT; ++t)
    for (int a = 0; a < A; ++a) acc[t][a] = _mm256_setzero_ps();
  for (size_t b = 0; b < n_blocks; ++b) {
    __m256 w[4];
    load_block(f, row + b * block_bytes, w);
    const float* xb = X + b * kBlock;
    for (int t = 0; t < TT; ++t) {
      const float* x = xb + t * ldx;
      for (int k = 0; k < 4; ++k) acc[t][k % A] = _mm256_fmadd_ps(w[k], _mm256_loadu_ps(x + 8 * k), acc[t][k % A]);
    }
  }
  for (int t = 0; t < TT; ++t) {
    __m256 sum = acc[t][0];
    for (int a = 1; a < A; ++a) sum = _mm256_add_ps(sum, acc[t][a]);
    out[t] = hsum_avx2(sum);
  }
}

// The 32 weight codes of a block as two vectors of 16 int16 that multiply
// the first and the second 16 activations of the block's I16 form. Q8_0:
// codes 0..15 and 16..31, widened from bytes. MXFP4: codes 0, 2, .., 30 and
// 1, 3, .., 31 (the activations are in that order, see act_slot), each
// times 256: its 4-bit codes go through the value table as 32 int8 in one
// 256-bit shuffle; a 16-bit lane's low byte shifted up is the even code
// times 256, its high byte masked is the odd code times 256 (one shift and
// one and: a sign-extending widening takes three shifts). The factor 256 is
// exact all the way (a lane sums 4 products below 2^29; a float of 256 s is
// 256 times the float of s) and kMxfp4Scale divides it out.
template <Format F>
__attribute__((target("avx2,fma,f16c"))) inline void load_codes(const uint8_t* blk, __m256i& first,
                                                                 __m256i& second) {
  if constexpr (F == Format::Q8_0) {
    first = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2)));
    second = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18)));
  } else {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Values)));
    const __m256i mask = _mm256_set1_epi8(0x0F);
    // the 16 code bytes in both halves: low nibbles (codes 0..15) index the
    // table in the first half, high nibbles (codes 16..31) in the second
    const __m256i qs = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 1)));
    // (one variable shift moves the second half's high nibbles down)
    const __m256i idx = _mm256_and_si256(_mm256_srlv_epi64(qs, _mm256_setr_epi64x(0, 0, 4, 4)), mask);
    const __m256i w = _mm256_shuffle_epi8(table, idx);
    first = _mm256_slli_epi16(w, 8);                                        // even codes x 256
    second = _mm256_and_si256(w, _mm256_set1_epi16(int16_t(0xFF00)));       // odd codes x 256
  }
}

// One block against TT tokens, into their accumulators; Q, D and E point at
// the block's run of the tile (act_block).
template <Format F, int TT>
__attribute__((target("avx2,fma,f16c"))) inline void block_i16(const uint8_t* blk, const int16_t* Q, const float* D,
                                                                 const int32_t* E, __m256* acc) {
  __m256i first, second;
  load_codes<F>(blk, first, second);
  float dw = 0.f;
  if constexpr (F == Format::Q8_0) {
    uint16_t h;
    std::memcpy(&h, blk, 2);
    dw = _cvtsh_ss(h);
  }
  for (int t = 0; t < TT; ++t) {
    const int16_t* q = Q + t * kBlock;
    const __m256i s = _mm256_add_epi32(
        _mm256_madd_epi16(first, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q))),
        _mm256_madd_epi16(second, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 16))));
    __m256 scale;
    if constexpr (F == Format::Q8_0) scale = _mm256_set1_ps(dw * D[t]);
    else scale = _mm256_broadcast_ss(kMxfp4Scale + blk[0] + E[t]);
    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc[t]);
  }
}

// One row against TT tokens. One accumulator per token whatever the tile:
// a token's sum is formed in the same order alone or in a batch, so
// prefill, decode and a cached prefix give the same bits. The format is a
// template parameter so that the block loop carries no branch; small tiles
// unroll two blocks (large ones would run out of registers).
template <Format F, int TT>
__attribute__((target("avx2,fma,f16c"))) inline void row_tile_i16(const uint8_t* row, size_t n_blocks,
                                                                    size_t block_bytes, const int16_t* Q,
                                                                    const float* D, const int32_t* E, float* out) {
  __m256 acc[TT];
  for (int t = 0; t < TT; ++t) acc[t] = _mm256_setzero_ps();
  // the tile's activations: block by block, each the TT tokens' (act_block)
  if constexpr (TT <= 2) {
#pragma GCC unroll 2
    for (size_t b = 0; b < n_blocks; ++b)
      block_i16<F, TT>(row + b * block_bytes, Q + b * TT * kBlock, D ? D + b * TT : D, E ? E + b * TT : E, acc);
  } else {
#pragma GCC unroll 1
    for (size_t b = 0; b < n_blocks; ++b)
      block_i16<F, TT>(row + b * block_bytes, Q + b * TT * kBlock, D ? D + b * TT : D, E ? E + b * TT : E, acc);
  }
  for (int t = 0; t < TT; ++t) out[t] = hsum_avx2(acc[t]);
}

void rows_avx2_i16(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const int16_t* Q, const float* D,
                   const int32_t* E, size_t T, float* Y, size_t ldy, const float* bias) {
  const size_t nb = K / kBlock, bb = row_bytes(f, K) / nb;
  if (f == Format::Q8_0)
    rows_by_tiles(f, W, n0, n1, K, T, Y, ldy, bias, [&](auto TT, const uint8_t* row, size_t t0, float* out) {
      row_tile_i16<Format::Q8_0, TT>(row, nb, bb, Q + t0 * K, D + t0 * nb, nullptr, out);
    });
  else
    rows_by_tiles(f, W, n0, n1, K, T, Y, ldy, bias, [&](auto TT, const uint8_t* row, size_t t0, float* out) {
      row_tile_i16<Format::MXFP4, TT>(row, nb, bb, Q + t0 * K, nullptr, E + t0 * nb, out);
    });
}

void rows_avx2(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const float* X, size_t ldx, size_t T,
               float* Y, size_t ldy, const float* bias) {
  const size_t nb = K / kBlock, bb = row_bytes(f, K) / nb;
  rows_by_tiles(f, W, n0, n1, K, T, Y, ldy, bias, [&](auto TT, const uint8_t* row, size_t t0, float* out) {
    row_tile<TT>(f, row, nb, bb, X + t0 * ldx, ldx, out);
  });
}
#endif

}  // namespace

ActView::ActView(Acts a, Format f, const float* x, size_t ld, size_t T, size_t K, Impl impl)
    : acts(a), X(x), ldx(ld) {
  if (acts == Acts::I16) {
    q.resize(T * K);
    d.resize(T * K / kBlock);
    e.resize(T * K / kBlock);
    quantize_acts_i16(X, ldx, T, K, q.data(), d.data(), e.data(), f == Format::MXFP4, impl);
  }
}

void matmul_rows(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const ActView& a, size_t T,
                 float* Y, size_t ldy, const float* bias, Impl impl) {
  if (a.acts == Acts::I16) {
#ifdef GD_X86
    if (impl == Impl::Avx2) return rows_avx2_i16(f, W, n0, n1, K, a.q.data(), a.d.data(), a.e.data(), T, Y, ldy, bias);
#endif
    return rows_generic_i16(f, W, n0, n1, K, a.q.data(), a.d.data(), T, Y, ldy, bias);
  }
#ifdef GD_X86
  if (impl == Impl::Avx2) return rows_avx2(f, W, n0, n1, K, a.X, a.ldx, T, Y, ldy, bias);
#endif
  rows_generic(f, W, n0, n1, K, a.X, a.ldx, T, Y, ldy, bias);
}

namespace {

// A block's shift k: the largest with amax * 2^k <= 32767 (amax = m 2^p, m in
// [0.5, 1): k = 15 - p, one less when m * 2^15 rounds above 32767), within
// the range whose 2^k and 2^-k are normal floats.
inline int block_shift(float amax) {
  if (!(amax > 0.f)) return 0;   // all zero (or NaN: the products carry it on)
  int p = 0;
  const float m = std::frexp(amax, &p);
  return std::clamp(15 - p - (m * 32768.f > 32767.f ? 1 : 0), -kMaxShift, kMaxShift);
}

inline float pow2(int k) {
  const uint32_t bits = uint32_t(k + 127) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void quantize_block_generic(const float* x, int16_t* out, int k, bool even_odd) {
  const float s = pow2(k);   // exact scaling, then one rounding (to nearest even)
  for (int j = 0; j < kBlock; ++j) out[even_odd ? act_slot(j) : j] = int16_t(std::lrint(x[j] * s));
}

#ifdef GD_X86
__attribute__((target("avx2,fma,f16c"))) inline float block_amax_avx2(const float* x) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 m = _mm256_and_ps(_mm256_loadu_ps(x), abs_mask);
  for (int i = 8; i < kBlock; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

// The same numbers as quantize_block_generic: cvtps rounds to nearest even.
__attribute__((target("avx2,fma,f16c"))) inline void quantize_block_avx2(const float* x, int16_t* out, int k,
                                                                          bool even_odd) {
  const __m256 s = _mm256_set1_ps(pow2(k));
  __m256i v[4];
  for (int i = 0; i < 4; ++i) v[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), s));
  // packs interleaves 128-bit halves; the permute puts values 0..15 in order
  __m256i a = _mm256_permute4x64_epi64(_mm256_packs_epi32(v[0], v[1]), 0xD8);
  __m256i b = _mm256_permute4x64_epi64(_mm256_packs_epi32(v[2], v[3]), 0xD8);
  if (even_odd) {
    // per 128-bit half: its 4 even values, then its 4 odd ones; then gather
    // the even quarters first: evens 0..30, odds 1..31 (act_slot's order)
    const __m256i split = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                           0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    a = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(a, split), 0xD8);
    b = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(b, split), 0xD8);
    const __m256i evens = _mm256_permute2x128_si256(a, b, 0x20), odds = _mm256_permute2x128_si256(a, b, 0x31);
    a = evens;
    b = odds;
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), a);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16), b);
}
#endif

}  // namespace

void quantize_acts_i16(const float* X, size_t ldx, size_t T, size_t K, int16_t* q, float* d, int32_t* e,
                       bool even_odd, Impl impl) {
  const size_t nb = K / kBlock;
  const bool avx2 = resolve_impl(impl) == Impl::Avx2;
  for (size_t t = 0; t < T; ++t) {
    for (size_t b = 0; b < nb; ++b) {
      const float* x = X + t * ldx + b * kBlock;
      const size_t at = act_block(t, b, T, nb);
      int16_t* out = q + at * kBlock;
      float amax = 0.f;
#ifdef GD_X86
      if (avx2) amax = block_amax_avx2(x);
      else
#endif
        for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
      const int k = block_shift(amax);
      d[at] = pow2(-k);
      e[at] = kScaleBias - k;
#ifdef GD_X86
      if (avx2) quantize_block_avx2(x, out, k, even_odd);
      else
#endif
        quantize_block_generic(x, out, k, even_odd);
    }
  }
}

void matmul(Format f, const uint8_t* W, size_t N, size_t K, const float* X, size_t ldx, size_t T, float* Y,
            size_t ldy, const float* bias, Impl impl, Acts acts) {
  const Impl which = resolve_impl(impl);
  const ActView a(acts, f, X, ldx, T, K, which);
  const size_t n_tasks = (N + kRowsPerTask - 1) / kRowsPerTask;
  parallel_for(n_tasks, [&](size_t task) {
    const size_t n0 = task * kRowsPerTask, n1 = std::min(N, n0 + kRowsPerTask);
    matmul_rows(f, W, n0, n1, K, a, T, Y, ldy, bias, which);
  });
}

ArgMax matvec_argmax(Format f, const uint8_t* W, size_t N, size_t K, const float* x, Impl impl, Acts acts) {
  const Impl which = resolve_impl(impl);
  const ActView a(acts, f, x, K, 1, K, which);
  constexpr size_t kRows = 256;
  const size_t n_tasks = (N + kRows - 1) / kRows;
  std::vector<ArgMax> best(n_tasks, {0, -std::numeric_limits<float>::infinity()});
  parallel_for(n_tasks, [&](size_t task) {
    const size_t n0 = task * kRows, n1 = std::min(N, n0 + kRows);
    float y[kRows];
    matmul_rows(f, W + n0 * row_bytes(f, K), 0, n1 - n0, K, a, 1, y, 1, nullptr, which);
    ArgMax b{n0, y[0]};
    for (size_t n = n0 + 1; n < n1; ++n)
      if (y[n - n0] > b.value) b = {n, y[n - n0]};
    best[task] = b;
  });
  ArgMax out = best[0];
  for (const auto& b : best)
    if (b.value > out.value) out = b;
  return out;
}

void get_rows(Format f, const uint8_t* W, size_t K, const int64_t* idx, size_t n_rows, float* out, Impl impl) {
  const Impl which = resolve_impl(impl);
  const size_t rb = row_bytes(f, K);
  for (size_t i = 0; i < n_rows; ++i) dequant_row(f, W + size_t(idx[i]) * rb, K, out + i * K, which);
}

}  // namespace gd
