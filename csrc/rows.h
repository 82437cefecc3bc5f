// Internal to the products (matmul.cpp): the row kernels of each instruction
// set and what they share. Rows [n0, n1) of W times T tokens of activations:
// Y[t, n] = W[n] . x[t] + bias[n]. One accumulator per token whatever the
// tile, so a token's sums are formed in the same order alone or in a batch.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "formats.h"
#include "matmul.h"   // (kGroup)

namespace gd {

constexpr size_t kTokenTile = 8;

// Before each loop over a tile's tokens: unrolled early, so that the tile's
// accumulator array becomes registers. Without it GCC 12 keeps the
// accumulators of tiles above 2 tokens on the stack, a load and a store per
// token and chunk (the prefill products ran at 49% of the int16 peak).
#define GD_EACH_TOKEN _Pragma("GCC unroll 8")
constexpr int kScaleBias = 128;   // ActView::e[b] = kScaleBias - k for an activation block scale 2^-k
// MXFP4's scale table (rows_x86.h's kMxfp4Scale[i] = 2^(i - kMxfp4ScaleOffset))
// and the grouped form's exponents (matmul.h's grouped_acts: e[b] =
// kGroupedScaleBias - k, so that a weight block's scale byte plus e[b] is
// the table's index less the offset, the sum's whole exponent: one add
// fewer per group than kScaleBias - k)
constexpr int kMxfp4ScaleOffset = 264;
constexpr int kGroupedScaleBias = kScaleBias - kMxfp4ScaleOffset;

// 2^k as a float from its bits, k in -126..127 (an activation block's scale
// and its inverse, ActView's d and AMX's 2^-k).
inline float pow2(int k) {
  const uint32_t bits = uint32_t(k + 127) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Where block b of token t sits in the I16 form (in blocks): tokens in
// tiles of kTokenTile, a tile's blocks one after another, each holding the
// tile's tokens. A tile's activations are contiguous and a block's step
// is small (a token-major walk over a few tokens would land on few cache
// sets; a fully block-major one too, at large T).
inline size_t act_block(size_t t, size_t b, size_t T, size_t nb) {
  const size_t t0 = t - t % kTokenTile, tt = std::min(kTokenTile, T - t0);
  return t0 * nb + b * tt + (t - t0);
}

// Where group block b (a multiple of kGroup) of token t sits in the
// grouped I16 form (ActView::grouped, in blocks; nbp: the blocks per row,
// padded to whole groups): tiles as act_block's, a tile's groups one after
// another, each holding kGroup blocks of each of the tile's tokens.
inline size_t grouped_block(size_t t, size_t b, size_t T, size_t nbp) {
  const size_t t0 = t - t % kTokenTile, tt = std::min(kTokenTile, T - t0);
  return t0 * nbp + b * tt + (t - t0) * kGroup;
}

// The I16 activations of a product: q (int16 codes, 32 per block), d (each
// block's scale 2^-k), e (kScaleBias - k, for MXFP4's scale table), s (the
// sums of each half block's codes, for formats with minimums; else null).
struct I16Acts {
  const int16_t* q;
  const float* d;
  const int32_t* e;
  const int32_t* s;
  bool even_odd;   // each block's codes in act_slot's order (ActView::even_odd)
  const SplitGroup* split = nullptr;   // a few tokens of the grouped form also split into bytes (or null)
  const uint16_t* amx = nullptr;       // many tokens also in AMX's form (ActView::amx, or null)
  const float* amx_e = nullptr;        // (the int8 formats')
  AmxExponents amx_k;                  // (MXFP4's)
  const float* sd = nullptr;           // grouped, with minimums: each block's sum of codes times its d (ActView::sd)
  const float* amx_m = nullptr;        // (sd in AMX's places)
};

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

// Calls fn(std::integral_constant<int, n>) for n = 1..4 (a tile's rows, or
// row pairs), so a kernel's count of them is a constant inside it.
template <class Fn>
inline void with_up_to_four(size_t n, Fn&& fn) {
  switch (n) {
    case 4: fn(std::integral_constant<int, 4>{}); break;
    case 3: fn(std::integral_constant<int, 3>{}); break;
    case 2: fn(std::integral_constant<int, 2>{}); break;
    default: fn(std::integral_constant<int, 1>{}); break;
  }
}

// A tile's sums (tmp[r tt + t]: rows n .. n + rr - 1, tokens t0 .. t0 + tt
// - 1) plus each row's bias, into Y.
inline void store_tile(const float* tmp, size_t n, size_t rr, size_t t0, size_t tt, float* Y, size_t ldy,
                       const float* bias) {
  for (size_t r = 0; r < rr; ++r)
    for (size_t t = 0; t < tt; ++t) Y[(t0 + t) * ldy + n + r] = tmp[r * tt + t] + (bias ? bias[n + r] : 0.f);
}

// Decode streams each weight row from memory once, and the hardware
// prefetcher alone leaves a core waiting: a software prefetch this far ahead
// of the block in use, once per cache line, lifted MXFP4 at one token from
// 12.5 to 16.9 GMAC/s on one thread and 22.4 to 28.3 on two (AMD EPYC Zen
// 2, 2880 x 2880 matrices rotating beyond the L3: 1,536 to 6,144 bytes
// ahead all within 3%; benchmarks/kernel_paths.py).
constexpr size_t kPrefetchAhead = 3072;
// The split form's rows at decode (row_split, AVX-512) also ask for the
// lines this far ahead into the L2 (prefetcht1). Q8_0 (a weight's 1.06
// bytes read for one product: its rows keep pace with the memory): from
// memory at one token 1.05-1.20x on 2 threads (AMD EPYC Zen 4, 2880 x 2880
// rotating beyond the L3; 8,192 to 24,576 bytes ahead alike). MXFP4's row
// pairs read two streams 1.5 KB apart that jump every row, which the
// hardware prefetcher follows badly: without it a pair measured 0.75x of
// one row from memory, with it 1.13-1.22x (one row alone: 1.01x). The
// AVX2 rows and the other formats with it: 0.94-0.96x (the prefetches' own
// cost), and the bandwidth probe (module.cpp's stream_read) no faster.
constexpr size_t kPrefetchFar = 12288;
// And they ask for each line into the L1 a second time, this far ahead: a
// retry of the first request. From memory at one token (1 GiB rotating in
// 2 MiB pages, 2 threads, Intel Xeon with AMX): MXFP4 1.01-1.05x, Q8_0
// 1.01-1.03x (kernel_ab.py, five runs of nine pairs); the 20b's decode
// 1.00-1.05x, four pairs. 512 to 2,304 bytes alike; a third request (2 KB
// and 1 KB) no better; a second far one (6 KB) 1.00x.
constexpr size_t kPrefetchRetry = kPrefetchAhead / 2;

// Prefetches the `bytes` bytes kPrefetchAhead past p, one request per 64
// bytes: a run of blocks a loop takes at once (a run that starts mid-line
// leaves its last line to the next run's first request).
inline void prefetch_run(const uint8_t* p, size_t bytes) {
  for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + kPrefetchAhead + b, 0, 3);
}

// Prefetches the cache line kPrefetchAhead bytes past blk when the block
// (of `bytes` bytes) starts a new line there: one prefetch per line.
inline void prefetch_ahead(const uint8_t* blk, size_t bytes) {
  if ((reinterpret_cast<uintptr_t>(blk + kPrefetchAhead) & 63) < bytes) prefetch_run(blk, bytes);
}

// Rows [n0, n1) in tiles of up to 8 tokens: tile(TT, row, t0, out) computes
// one row against tokens t0 .. t0 + TT - 1. Token tiles outside, rows
// inside: a tile's activations (8 tokens of a 2880-wide row: 46 KB of int16)
// stay in the L2 while a task's rows (16: 26-55 KB) pass over them, where
// rows outside streamed every token's activations (737 KB at 128 tokens)
// from the L3 again for each row: 128 tokens 1.09-1.16x (MXFP4, Q8_0, Q4_K,
// Q6_K; AMD EPYC, 2 threads, alternating builds in one process). Each token's
// sums are the same either way.
template <class Tile>
inline void rows_by_tiles(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, size_t T, float* Y,
                          size_t ldy, const float* bias, Tile&& tile) {
  const size_t rb = row_bytes(f, K);
  float tmp[kTokenTile];
  for (size_t t0 = 0; t0 < T; t0 += kTokenTile) {
    const size_t tt = std::min(kTokenTile, T - t0);
    for (size_t n = n0; n < n1; ++n) {
      const uint8_t* row = W + n * rb;
      with_tile(tt, [&](auto TT) { tile(TT, row, t0, tmp); });
      const float b = bias ? bias[n] : 0.f;
      for (size_t t = 0; t < tt; ++t) Y[(t0 + t) * ldy + n] = tmp[t] + b;
    }
  }
}

// Rows [n0, n1) against fp32 activations in tiles of up to kFloatTile
// tokens: tile(TT, row, X_t0, out) computes one row against tokens t0 ..
// t0 + TT - 1 (the float kernels keep several accumulators per token, so
// their tiles stay small enough for the registers). Token tiles outside, as
// rows_by_tiles: 128 tokens 1.17-1.27x (F16, BF16, F32).
constexpr size_t kFloatTile = 2;

template <class Tile>
inline void rows_by_float_tiles(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const float* X,
                                size_t ldx, size_t T, float* Y, size_t ldy, const float* bias, Tile&& tile) {
  const size_t rb = row_bytes(f, K);
  float tmp[kFloatTile];
  for (size_t t0 = 0; t0 < T; t0 += kFloatTile) {
    for (size_t n = n0; n < n1; ++n) {
      const uint8_t* row = W + n * rb;
      if (T - t0 >= 2) tile(std::integral_constant<int, 2>{}, row, X + t0 * ldx, tmp);
      else tile(std::integral_constant<int, 1>{}, row, X + t0 * ldx, tmp);
      const float b = bias ? bias[n] : 0.f;
      for (size_t t = t0; t < std::min(T, t0 + kFloatTile); ++t) Y[t * ldy + n] = tmp[t - t0] + b;
    }
  }
}

// Calls fn(std::integral_constant<Format, F>{}) for the format f: a path's
// kernels instantiated once per format, the format a constant inside them.
template <class Fn>
inline void with_format(Format f, Fn&& fn) {
  switch (f) {
#define GD_FORMAT(F) case Format::F: return fn(std::integral_constant<Format, Format::F>{});
    GD_FORMAT(F32) GD_FORMAT(F16) GD_FORMAT(BF16) GD_FORMAT(Q4_0) GD_FORMAT(Q4_1) GD_FORMAT(Q5_0) GD_FORMAT(Q5_1)
    GD_FORMAT(Q8_0) GD_FORMAT(Q2_K) GD_FORMAT(Q3_K) GD_FORMAT(Q4_K) GD_FORMAT(Q5_K) GD_FORMAT(Q6_K)
    GD_FORMAT(IQ4_NL) GD_FORMAT(IQ4_XS) GD_FORMAT(MXFP4)
#undef GD_FORMAT
  }
}

// The error of an int16 product asked of plain-float weights.
[[noreturn]] void float_weights_take_f32(Format f);

// The I16 activations from `blocks` blocks on: a tile's (blocks = its first
// token times the blocks per row) or a tile's chunk c (c times its tokens;
// see act_block).
inline I16Acts acts_from(const I16Acts& a, size_t blocks) {
  return I16Acts{a.q + blocks * 32, a.d ? a.d + blocks : a.d, a.e ? a.e + blocks : a.e,
                 a.s ? a.s + 2 * blocks : a.s, a.even_odd, nullptr, nullptr, nullptr, {}};
}

// An int16 product's rows [n0, n1) for a block format, in tiles:
// tile(std::integral_constant<Format, F>, TT, row, n_chunks, acts, out)
// computes one row against a tile of TT tokens, acts the tile's own
// activations. Plain-float formats are an error.
template <class Tile>
inline void rows_i16_by_tiles(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const I16Acts& a,
                              size_t T, float* Y, size_t ldy, const float* bias, Tile&& tile) {
  with_format(f, [&](auto F) {
    if constexpr (is_float(decltype(F)::value)) {
      float_weights_take_f32(f);
    } else {
      const size_t nc = K / 32;
      rows_by_tiles(f, W, n0, n1, K, T, Y, ldy, bias, [&](auto TT, const uint8_t* row, size_t t0, float* out) {
        tile(F, TT, row, nc, acts_from(a, t0 * nc), out);
      });
    }
  });
}

// The portable reference (rows_generic.cpp).
void rows_generic(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const float* X, size_t ldx,
                  size_t T, float* Y, size_t ldy, const float* bias);
void rows_generic_i16(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const I16Acts& a, size_t T,
                      float* Y, size_t ldy, const float* bias);

// AVX2 (rows_avx2.cpp, rows_avx2_i16.cpp); only called when the CPU has it.
void rows_avx2(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const float* X, size_t ldx, size_t T,
               float* Y, size_t ldy, const float* bias);
void rows_avx2_i16(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const I16Acts& a, size_t T,
                   float* Y, size_t ldy, const float* bias);

// AVX-512 F/BW/VL (rows_avx512.cpp, rows_avx512_grouped.cpp, rows_avx512_float.cpp); only called
// when the CPU has it. Its fp32 rows: the plain floats' two rows a register
// with AVX2's bits, the block formats' AVX2's own.
void rows_avx512(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const float* X, size_t ldx, size_t T,
                 float* Y, size_t ldy, const float* bias);
void rows_avx512_i16(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const I16Acts& a, size_t T,
                     float* Y, size_t ldy, const float* bias);
// The split form (SplitGroup) of `groups` groups of grouped activations, for
// format f (its offset and scales).
void split_acts_avx512(Format f, const int16_t* q, const float* d, const int32_t* e, size_t groups, SplitGroup* out);

// AMX (rows_amx.cpp): the grouped formats' rows [n0, n1) against T tokens
// from their AMX form (a.amx), the same bits as rows_avx512_grouped's; and
// that form for format f made from the grouped one (q, d, e, sd: ActView's;
// nb blocks per row).
void rows_amx(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const I16Acts& a, size_t T, float* Y,
              size_t ldy, const float* bias);
// False where MXFP4's activations are too large for the form (a scale
// beyond 2^112: those products stay on the vectors); k: the form's range.
// out (and the int8 formats' out_e, Q4_K's out_m) must arrive zeroed, as
// ActView's new vectors do: a last tile's missing tokens are the zeros left
// in place.
bool amx_acts(Format f, const int16_t* q, const float* d, const int32_t* e, const float* sd, size_t T, size_t nb,
              uint16_t* out, float* out_e, float* out_m, AmxExponents& k);

// NEON (rows_neon.cpp); only compiled for and called on AArch64. The int16
// path is bit for bit rows_generic_i16.
void rows_neon(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const float* X, size_t ldx, size_t T,
               float* Y, size_t ldy, const float* bias);
void rows_neon_i16(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const I16Acts& a, size_t T,
                   float* Y, size_t ldy, const float* bias);

}  // namespace gd
