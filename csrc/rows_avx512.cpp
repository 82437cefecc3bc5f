// The int16 row products in AVX-512 (F, BW, VL, VNNI, VBMI: Ice Lake and
// later Xeons, AMD Zen 4 and 5): a chunk's 32 weight codes are one register
// of 32 int16, its 32 activations another, and one vpmaddwd makes the
// chunk's 16 exact pair sums; MXFP4 and Q8_0 take eight blocks per
// register and vpdpwssd (rows_grouped below), and at decode's few tokens
// vpdpbusd on the activations' bytes (row_split). The plain-float rows (fp32
// activations) are AVX2's (rows_avx2.cpp): they are not this path's hot
// kernels. See rows.h for the contract.
//
// Order of the float steps: per token, 16 lanes; lane l of a chunk is the
// exact int32 sum of products 2l and 2l + 1 of the chunk's I16 form, scaled
// (a format whose two halves have their own scales: lanes 0..7 by the first,
// 8..15 by the second) and added into lane l of one of the token's two
// accumulators, even chunks into the first, odd ones into the second; at
// the row's end the two are added, their 16 lanes summed by one fixed
// reduction and the minimums' terms added (MXFP4 and Q8_0: each block's
// whole sum, converted, scaled and added into one lane of an accumulator
// per token that holds two rows, see block_sums and group_rows). A token's
// sums are formed the same way alone or in a tile (batch invariance), within
// the int16 bound of the reference, but not its bits: the reference sums a
// chunk before scaling it.
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
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")))
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
// activations (MXFP4 and Q8_0 run rows_grouped below).
template <Format F>
AVX512 inline __m512i codes16(const uint8_t* blk, int sub) {
  static_assert(F != Format::MXFP4, "MXFP4 runs rows_grouped");
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

// MXFP4, eight blocks per vector (the activations grouped: ActView's grouped
// form). A group's 136 bytes by four loads; code bytes 0..7 of each block
// into its 64-bit lane by one vpermt2b, bytes 8..15 by another (the same
// index, from the loads 8 bytes on); their low and high nibbles looked up
// as int8 values (vpermb) and made int16 times 256 by a shift or a mask
// (lane p of the eight vectors holds four of block p's values:
// grouped_slot's order), eight vpdpwssd per token into one int32 vector:
// each block's products split over two lanes, sixteen in each (|sum| <
// 2^31: 16 x 12 x 256 x 32767). Then one conversion (exact: 256 times an
// integer below 2^23), each block's two lanes added (block_sums) and the
// group's eight scales at once: vscalefps by
// e + ActView::e (kMxfp4Scale's exponent: the grouped form's e holds
// kGroupedScaleBias - k; the scale bytes picked from the loads by a third
// vpermt2b), the result added into the token's accumulator. Per block and
// token that is one multiply-add instruction and an eighth of a scale step
// (four blocks per vector had spent a quarter: one token 1.19x on AMD Zen 4,
// in the L3). Needs AVX-512 VNNI and VBMI, which cpu_has_avx512 asks for.
struct Mxfp4Consts {
  __m512i pick, scales, table;
};

// Block p's code bytes 0..7 (from the group's first two loads, bytes 17p +
// 1 ..; bytes 8..15 from the two loads 8 bytes on, at the same index) and
// its scale byte (17p, into the low byte of its two dwords).
struct Mxfp4Picks {
  alignas(64) uint8_t pick[64], scales[64];
};
constexpr Mxfp4Picks mxfp4_picks() {
  Mxfp4Picks p{};
  for (int b = 0; b < 8; ++b)
    for (int j = 0; j < 8; ++j) {
      p.pick[8 * b + j] = uint8_t(17 * b + 1 + j);
      p.scales[8 * b + j] = uint8_t(17 * b);
    }
  return p;
}
static constexpr Mxfp4Picks kMxfp4Picks = mxfp4_picks();

AVX512 inline Mxfp4Consts mxfp4_consts() {
  return {_mm512_load_si512(kMxfp4Picks.pick), _mm512_load_si512(kMxfp4Picks.scales),
          _mm512_broadcast_i32x4(_mm256_castsi256_si128(mxfp4_values256()))};
}

AVX512 inline __m512i load_bytes(const uint8_t* p, int n) {   // n of the 64 bytes (the rest zeros)
  if (n >= 64) return _mm512_loadu_si512(p);
  return n > 0 ? _mm512_maskz_loadu_epi8(~__mmask64(0) >> (64 - n), p) : _mm512_setzero_si512();
}

// A group's eight blocks' values as bytes from `table` (c.table, or it plus
// 12 for the split form: row_split): v[0], v[1] the low and high nibbles of
// code bytes 0..7 of each block (its 64-bit lane), v[2], v[3] those of bytes
// 8..15; and the scale bytes ew (each block's in its two lanes). A tail
// group of `blocks` < 8 reads only its own bytes (the rest as zeros: zero
// codes), by masked loads (a copy into a zeroed buffer stalled the loads on
// its stores: 0.87x).
AVX512 inline void mxfp4_values(const uint8_t* blk, int blocks, const Mxfp4Consts& c, __m512i table, __m512i v[4],
                                __m512i& ew) {
  const int n = 17 * blocks;
  const __m512i a = load_bytes(blk, n), b = load_bytes(blk + 64, n - 64);
  const __m512i a8 = load_bytes(blk + 8, n - 8), b8 = load_bytes(blk + 72, n - 72);
  const __m512i q[2] = {_mm512_permutex2var_epi8(a, c.pick, b), _mm512_permutex2var_epi8(a8, c.pick, b8)};
  // vpermb reads an index's low six bits and the table holds the 16 values
  // four times: each byte's low nibble, and after the word shift its high
  // one, pick their values without masking off the bits above
  for (int h = 0; h < 2; ++h) {
    v[2 * h] = _mm512_permutexvar_epi8(q[h], table);
    v[2 * h + 1] = _mm512_permutexvar_epi8(_mm512_srli_epi16(q[h], 4), table);
  }
  ew = _mm512_maskz_permutex2var_epi8(0x1111111111111111ULL, a, c.scales, b);
}

// The grouped loop's form of them: int16 values w[0..7] (grouped_slot's runs).
AVX512 inline void mxfp4_group(const uint8_t* blk, int blocks, const Mxfp4Consts& c, __m512i w[8], __m512i& ew) {
  __m512i v[4];
  mxfp4_values(blk, blocks, c, c.table, v, ew);
  // each word's values as int16 times 256: its low byte's shifted up, its
  // high byte's with the low byte cleared (shifts and masks, where
  // interleaving with zeros took four shuffles)
  const __m512i high = _mm512_set1_epi16(int16_t(0xFF00));
  for (int j = 0; j < 4; ++j) w[2 * j] = _mm512_slli_epi16(v[j], 8), w[2 * j + 1] = _mm512_and_si512(v[j], high);
}

// Q8_0 in the same grouped form: each half group's four 34-byte blocks
// from four loads, codes 0..7 and 8..15 of each block by one vpermt2b,
// codes 16..23 and 24..31 by another (from the loads 16 bytes on), the
// halves' 256-bit parts joined (vshufi64x2) into four vectors of eight
// code bytes per block, each byte widened to int16 in place (even bytes by
// two shifts, odd ones by one: the grouped_slot order), and the eight fp16
// scales, each in its block's two lanes, by two more vpermt2b, a blend and
// one conversion. Lane l then sums
// sixteen products exactly (|sum| < 2^26, so the conversion rounds only
// sums beyond 2^24), as MXFP4's; the activations are MXFP4's grouped form.
struct Q8Picks {
  alignas(64) uint8_t codes[64], scales[64];
};
constexpr Q8Picks q8_picks() {
  Q8Picks p{};
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 8; ++j) {
      // from the loads at 0 and 64: codes 0..7 of block k into qword k, 8..15
      // into qword 4 + k; from those at 16 and 80, the same index picks codes
      // 16..23 and 24..31
      p.codes[8 * k + j] = uint8_t(34 * k + 2 + j);
      p.codes[32 + 8 * k + j] = uint8_t(34 * k + 10 + j);
    }
  for (int l = 0; l < 16; ++l) {   // word l: block l / 2's scale (bytes 34k, 34k + 1 of its half)
    const int k = (l / 2) % 4;
    p.scales[2 * l] = uint8_t(34 * k);
    p.scales[2 * l + 1] = uint8_t(34 * k + 1);
  }
  return p;
}
static constexpr Q8Picks kQ8Picks = q8_picks();

// A group's codes as four vectors of int8 (qword p block p's: codes 0..7,
// 16..23, 8..15, 24..31, the order of the split form, SplitGroup; the
// grouped form's runs 0, 2, 4, 6 widen them) and its eight scales (dw).
AVX512 inline void q8_codes(const uint8_t* blk, int blocks, __m512i q[4], __m512& dw) {
  const int n = 34 * blocks;
  const __m512i pick = _mm512_load_si512(kQ8Picks.codes);
  __m512i lo[2], hi[2], sc[2];   // per half: codes 0..15, 16..31 (qword k: 0..7 or 16..23; 4 + k: 8..15 or 24..31)
  for (int h = 0; h < 2; ++h) {
    const uint8_t* p = blk + 136 * h;
    const int m = n - 136 * h;
    const __m512i l0 = load_bytes(p, m), l1 = load_bytes(p + 64, m - 64);
    const __m512i m0 = load_bytes(p + 16, m - 16), m1 = load_bytes(p + 80, m - 80);
    lo[h] = _mm512_permutex2var_epi8(l0, pick, l1);
    hi[h] = _mm512_permutex2var_epi8(m0, pick, m1);
    sc[h] = _mm512_permutex2var_epi8(l0, _mm512_load_si512(kQ8Picks.scales), l1);
  }
  q[0] = _mm512_shuffle_i64x2(lo[0], lo[1], 0x44), q[1] = _mm512_shuffle_i64x2(hi[0], hi[1], 0x44);
  q[2] = _mm512_shuffle_i64x2(lo[0], lo[1], 0xEE), q[3] = _mm512_shuffle_i64x2(hi[0], hi[1], 0xEE);
  // words 0..7 of the first half's, 8..15 of the second's (blocks 4..7)
  const __m512i h = _mm512_mask_blend_epi16(0xFF00, sc[0], sc[1]);
  dw = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
}

AVX512 inline void q8_group(const uint8_t* blk, int blocks, __m512i w[8], __m512& dw) {
  __m512i q[4];
  q8_codes(blk, blocks, q, dw);
  for (int j = 0; j < 4; ++j) {   // vector j's even bytes into run 2j, its odd ones into run 2j + 1 (grouped_slot's)
    w[2 * j] = _mm512_srai_epi16(_mm512_slli_epi16(q[j], 8), 8);
    w[2 * j + 1] = _mm512_srai_epi16(q[j], 8);
  }
}

// A group's eight vpdpwssd for R rows and one token: lane l of s[r] the
// exact sum of sixteen products, half a block's (grouped_slot: block l /
// 2's), in two chains of four (even and odd runs, added at the end: the
// same sums; one chain of eight, waiting on each vpdpwssd's latency, 0.95-
// 0.98x, four chains no faster than two; AMD Zen 4). Each run of the
// token's activations loaded once for all rows and kept in a register (GCC
// otherwise folds the load into each row's vpdpwssd: two loads per pair of
// products, and the loads, not the products, set the pace: a row pair 1.42x
// on AMD Zen 4, probed; one row keeps the load in its vpdpwssd: held in a
// register, 0.92x).
template <int R>
AVX512 inline void group_sums(const __m512i (&w)[R][8], const int16_t* q, __m512i (&s)[R]) {
  constexpr int C = 2;
  __m512i h[C][R];
  for (int v = 0; v < 8; ++v) {
    __m512i av = _mm512_loadu_si512(q + 32 * v);
#ifndef GOOSEDUMP_AVX512_EMULATED
    if constexpr (R > 1) asm("" : "+v"(av));   // (opaque: one register, not a memory operand per row)
#endif
    const int c = v % C;
    for (int r = 0; r < R; ++r) h[c][r] = v < C ? _mm512_madd_epi16(w[r][v], av) : _mm512_dpwssd_epi32(h[c][r], w[r][v], av);
  }
  for (int r = 0; r < R; ++r) {
    s[r] = h[0][r];
    for (int c = 1; c < C; ++c) s[r] = _mm512_add_epi32(s[r], h[c][r]);
  }
}

// Rows 0 and 1 in one vector: lanes 2p of a, 2p + 1 of b.
AVX512 inline __m512i interleave_rows(__m512i a, __m512i b) { return _mm512_mask_blend_epi32(0xAAAA, a, b); }
AVX512 inline __m512 interleave_rows(__m512 a, __m512 b) { return _mm512_mask_blend_ps(0xAAAA, a, b); }

// Lanes 2p and 2p + 1 swapped (vshufps: SIMDe, which the tests emulate
// this file with, lacks vpermilps and vpshufd in 512 bits).
AVX512 inline __m512 swap_pairs(__m512 a) { return _mm512_shuffle_ps(a, a, 0xB1); }
AVX512 inline __m512i swap_pairs(__m512i a) { return _mm512_castps_si512(swap_pairs(_mm512_castsi512_ps(a))); }

// Each block's whole sum (its two lanes added) for R rows in one vector:
// lane 2p row 0's block p, lane 2p + 1 row 1's (R = 2) or row 0's again (R
// = 1: the same number). MXFP4's lanes hold 256 times the products (|sum|
// < 2^31) and are added as floats, exactly (256 times an integer below
// 2^24); Q8_0's as int32 (|sum| < 2^27), then converted.
template <Format F, int R>
AVX512 inline __m512 block_sums(const __m512i (&s)[R]) {
  if constexpr (F == Format::MXFP4) {
    const __m512 a = _mm512_cvtepi32_ps(s[0]);
    if constexpr (R == 1) return _mm512_add_ps(a, swap_pairs(a));
    const __m512 b = _mm512_cvtepi32_ps(s[1]);
    return _mm512_add_ps(interleave_rows(a, b), swap_pairs(interleave_rows(b, a)));
  } else {
    if constexpr (R == 1) return _mm512_cvtepi32_ps(_mm512_add_epi32(s[0], swap_pairs(s[0])));
    return _mm512_cvtepi32_ps(_mm512_add_epi32(interleave_rows(s[0], s[1]), swap_pairs(interleave_rows(s[1], s[0]))));
  }
}

// A tile's grouped activations from one group on (q: 256 int16 per token,
// e, d: eight blocks' scales per token).
struct GroupActs {
  const int16_t* q;
  const int32_t* e;
  const float* d;
  GroupActs at(size_t groups, size_t tile) const {
    return {q + 32 * kGroup * groups * tile, e + kGroup * groups * tile, d + kGroup * groups * tile};
  }
};

// One group (blocks of it: 8, or fewer for a row's last) of R rows (1 or 2)
// against TT tokens, into one accumulator per token for both rows (lane 2p
// row 0's block p of every group so far, 2p + 1 row 1's): the group's
// activations loaded once for both rows, and a pair's sixteen accumulators
// of 8 tokens halved to eight, which stay in registers (GCC had kept ten
// of sixteen on the stack, a load and a store per add). MXFP4 scales a
// token's block sums by vscalefps (mxfp4_group); Q8_0 multiplies the
// weights' fp16 scales by the activations' 2^-k and adds the sums times
// that by one FMA.
template <Format F, int R, int TT>
AVX512 inline void group_rows(const uint8_t* const blks[R], int blocks, const GroupActs& a, const Mxfp4Consts& c,
                              __m512 (&acc)[TT]) {
  static_assert(F == Format::MXFP4 || F == Format::Q8_0);
  __m512i w[R][8], ew[R];
  __m512 dw[R];
  for (int r = 0; r < R; ++r) {
    if constexpr (F == Format::MXFP4) mxfp4_group(blks[r], blocks, c, w[r], ew[r]);
    else q8_group(blks[r], blocks, w[r], dw[r]);
  }
  // (each block's scale in its two lanes: the pair's are row 0's in the
  // even lanes, row 1's in the odd ones)
  __m512i ewp = ew[0];
  __m512 dwp = dw[0];
  if constexpr (R == 2) {
    if constexpr (F == Format::MXFP4) ewp = interleave_rows(ew[0], ew[1]);
    else dwp = interleave_rows(dw[0], dw[1]);
  }
  const __m512i each2 = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) {
    __m512i s[R];
    group_sums<R>(w, a.q + 32 * kGroup * t, s);
    const __m512 x = block_sums<F, R>(s);
    if constexpr (F == Format::MXFP4) {
      const __m512i et = _mm512_permutexvar_epi32(
          each2, _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.e + kGroup * t))));
      acc[t] = _mm512_add_ps(acc[t], _mm512_scalef_ps(x, _mm512_cvtepi32_ps(_mm512_add_epi32(ewp, et))));
    } else {
      const __m512 dt = _mm512_permutexvar_ps(each2, _mm512_castps256_ps512(_mm256_loadu_ps(a.d + kGroup * t)));
      acc[t] = _mm512_fmadd_ps(x, _mm512_mul_ps(dwp, dt), acc[t]);
    }
  }
}

// A row's sum from the accumulator's even lanes and the next row's from
// its odd lanes, by one fixed reduction (halves, quarters, ...: lanes of a
// parity added to lanes of the same parity): a row's sum is the same bits
// whether it ran alone (R = 1: both parities hold it) or in a pair.
AVX512 inline void hsum_rows(__m512 v, float& even, float& odd) {
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_castps512_ps256(_mm512_shuffle_f32x4(v, v, 0xEE)));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  even = _mm_cvtss_f32(q);
  odd = _mm_cvtss_f32(_mm_movehdup_ps(q));
}

// R rows (1 or 2) against TT tokens (a: the tile's grouped activations from
// the rows' first group on): one accumulator per token for both rows,
// whatever the tile (two, for even and odd groups, measured 0.92x at one
// token: the group's chained vpdpwssd, not the adds, set the pace); out[r]
// row r's sums. Two rows load each
// group's activations once for both: where a product reads its rows again
// for several tiles (they are in the L2 then), each tile's activations (46
// KB of int16 for 8 tokens of a 2880-wide row) are read once per pair.
template <Format F, int R, int TT>
AVX512 inline void rows_grouped(const uint8_t* const rows[R], size_t n_chunks, GroupActs a, size_t tile,
                                float out[2][kTokenTile]) {
  constexpr size_t gb = kGroup * block_bytes(F);   // a group's bytes
  const Mxfp4Consts c = mxfp4_consts();
  __m512 acc[TT];
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) acc[t] = _mm512_setzero_ps();
  for (size_t g = 0, off = 0; g < n_chunks; g += kGroup, off += gb, a = a.at(1, tile)) {
    const uint8_t* blks[R];
    for (int r = 0; r < R; ++r) blks[r] = rows[r] + off;
    if constexpr (R == 1 && TT <= 2)   // decode streams the row
      for (size_t b = 0; b < gb; b += 64) __builtin_prefetch(blks[0] + kPrefetchAhead + b, 0, 3);
    group_rows<F, R, TT>(blks, int(std::min(kGroup, n_chunks - g)), a, c, acc);
  }
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) {
    float odd;   // (R = 1: the same sum again)
    hsum_rows(acc[t], out[0][t], R == 2 ? out[1][t] : odd);
  }
}

// MXFP4 and Q8_0 at up to 3 tokens by vpdpbusd, from the activations'
// split form (SplitGroup), against the codes' low bytes (unsigned) and their
// high bytes (signed); 256 times the second sum plus the first is the exact
// sum of the same sixteen products as group_sums' lane, so a row's sums are
// the same bits as rows_grouped<F, 1, TT>'s. vpdpbusd takes one side
// unsigned: MXFP4's values plus 12 (0..24, as valid an unsigned byte as a
// signed one) against both, less 12 times the lane's codes; Q8_0's codes as
// they are against the low bytes and plus 128 (each byte's top bit
// flipped) against the high ones, less 128 times the high bytes' sum. Each
// sum starts from its offset's share. MXFP4's lanes hold the products once,
// not 256 times (SplitGroup::e adds the 8 to the exponent). A fifth fewer
// vector operations a group than rows_grouped: no shifts and masks making
// int16 of the values, no spreading of the activations' scales (one token
// MXFP4 1.18-1.24x in the L3, one thread, AMD Zen 4). R rows as
// rows_grouped's (block_sums: the same bits for one row or two): MXFP4
// takes two, loading each group's activations once for both (the loads set
// the pace: from memory with kPrefetchFar 1.04-1.15x on 2 threads, 1.22x on
// one, in the L3 1.10-1.17x; the 20b's experts at decode 1.19x); Q8_0, whose
// rows keep pace with the memory alone, one (a pair 0.74-0.76x).
template <Format F, int R, int TT>
AVX512 inline void row_split(const uint8_t* const rows[R], size_t n_chunks, const SplitGroup* a,
                             float out[2][kTokenTile]) {
  static_assert(F == Format::MXFP4 || F == Format::Q8_0);
  constexpr size_t gb = kGroup * block_bytes(F);   // a group's bytes
  const Mxfp4Consts c = mxfp4_consts();
  const __m512i table = _mm512_add_epi8(c.table, _mm512_set1_epi8(12));
  __m512 acc[TT];
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) acc[t] = _mm512_setzero_ps();
  for (size_t g = 0, off = 0; g < n_chunks; g += kGroup, off += gb, a += TT) {
    const int blocks = int(std::min(kGroup, n_chunks - g));   // (a tail group: zero codes, zero activations)
    __m512i w[R][4], wu[R][4], ew[R];   // the values as the low bytes' and the high bytes' partners
    __m512 dw[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = rows[r] + off;
      for (size_t b = 0; b < gb; b += 64) {
        __builtin_prefetch(blk + kPrefetchAhead + b, 0, 3);
        __builtin_prefetch(blk + kPrefetchFar + b, 0, 2);
      }
      if constexpr (F == Format::MXFP4) {
        mxfp4_values(blk, blocks, c, table, w[r], ew[r]);
        for (int v = 0; v < 4; ++v) wu[r][v] = w[r][v];
      } else {
        q8_codes(blk, blocks, w[r], dw[r]);
        for (int v = 0; v < 4; ++v) wu[r][v] = _mm512_xor_si512(w[r][v], _mm512_set1_epi8(int8_t(0x80)));
      }
    }
    GD_EACH_TOKEN
    for (int t = 0; t < TT; ++t) {
      const SplitGroup& at = a[t];
      __m512i lo[R], hi[R];
      for (int r = 0; r < R; ++r) lo[r] = _mm512_load_si512(at.c), hi[r] = _mm512_setzero_si512();
      for (int v = 0; v < 4; ++v) {
        __m512i al = _mm512_load_si512(at.lo[v]), ah = _mm512_load_si512(at.hi[v]);
#ifndef GOOSEDUMP_AVX512_EMULATED
        if constexpr (R > 1) asm("" : "+v"(al), "+v"(ah));   // (one load for both rows, as group_sums)
#endif
        for (int r = 0; r < R; ++r) {
          lo[r] = _mm512_dpbusd_epi32(lo[r], al, w[r][v]);
          hi[r] = _mm512_dpbusd_epi32(hi[r], wu[r][v], ah);
        }
      }
      __m512i s[R];
      for (int r = 0; r < R; ++r) s[r] = _mm512_add_epi32(_mm512_slli_epi32(hi[r], 8), lo[r]);
      const __m512 x = block_sums<F, R>(s);
      if constexpr (F == Format::MXFP4) {
        const __m512i e0 = R == 2 ? interleave_rows(ew[0], ew[R - 1]) : ew[0];
        const __m512i e = _mm512_add_epi32(e0, _mm512_load_si512(at.e));
        acc[t] = _mm512_add_ps(acc[t], _mm512_scalef_ps(x, _mm512_cvtepi32_ps(e)));
      } else {
        const __m512 d0 = R == 2 ? interleave_rows(dw[0], dw[R - 1]) : dw[0];
        acc[t] = _mm512_fmadd_ps(x, _mm512_mul_ps(d0, _mm512_load_ps(at.d)), acc[t]);
      }
    }
  }
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) {
    float odd;   // (R = 1: the same sum again)
    hsum_rows(acc[t], out[0][t], R == 2 ? out[1][t] : odd);
  }
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

// Per group: code vectors 2v and 2v + 1 of the grouped form (32 int16
// each) give the split form's vector v, their low bytes interleaved into
// lo (byte 2j of lo: vector 2v's code j, byte 2j + 1: vector 2v + 1's) and
// their high bytes into hi by one vpermt2b each; lane l's sums by vpmaddwd
// against ones (codes 2l and 2l + 1 of each vector).
struct SplitPicks {
  alignas(64) uint8_t lo[64], hi[64];
};
constexpr SplitPicks split_picks() {
  SplitPicks p{};
  for (int j = 0; j < 32; ++j) {
    p.lo[2 * j] = uint8_t(2 * j), p.lo[2 * j + 1] = uint8_t(64 + 2 * j);
    p.hi[2 * j] = uint8_t(2 * j + 1), p.hi[2 * j + 1] = uint8_t(64 + 2 * j + 1);
  }
  return p;
}
static constexpr SplitPicks kSplitPicks = split_picks();

AVX512 void split_acts_avx512(Format f, const int16_t* q, const float* d, const int32_t* e, size_t groups,
                              SplitGroup* out) {
  const __m512i pick_lo = _mm512_load_si512(kSplitPicks.lo), pick_hi = _mm512_load_si512(kSplitPicks.hi);
  const __m512i ones = _mm512_set1_epi16(1);
  const __m512i each2 = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  for (size_t g = 0; g < groups; ++g, q += kGroup * 32, d += kGroup, e += kGroup) {
    SplitGroup& s = out[g];
    __m512i sum = _mm512_setzero_si512(), sum_hi = _mm512_setzero_si512();
    for (int v = 0; v < 4; ++v) {
      const __m512i a = _mm512_loadu_si512(q + 64 * v), b = _mm512_loadu_si512(q + 64 * v + 32);
      _mm512_store_si512(s.lo[v], _mm512_permutex2var_epi8(a, pick_lo, b));
      _mm512_store_si512(s.hi[v], _mm512_permutex2var_epi8(a, pick_hi, b));
      sum = _mm512_add_epi32(sum, _mm512_add_epi32(_mm512_madd_epi16(a, ones), _mm512_madd_epi16(b, ones)));
      sum_hi = _mm512_add_epi32(sum_hi, _mm512_add_epi32(_mm512_madd_epi16(_mm512_srai_epi16(a, 8), ones),
                                                         _mm512_madd_epi16(_mm512_srai_epi16(b, 8), ones)));
    }
    if (f == Format::MXFP4) {
      _mm512_store_si512(s.c, _mm512_mullo_epi32(sum, _mm512_set1_epi32(-12)));
      const __m256i e8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(e));
      const __m512i ev = _mm512_permutexvar_epi32(each2, _mm512_castsi256_si512(e8));
      _mm512_store_si512(s.e, _mm512_add_epi32(ev, _mm512_set1_epi32(8)));
    } else {
      _mm512_store_si512(s.c, _mm512_slli_epi32(_mm512_sub_epi32(_mm512_setzero_si512(), sum_hi), 15));
      _mm512_store_ps(s.d, _mm512_permutexvar_ps(each2, _mm512_castps256_ps512(_mm256_loadu_ps(d))));
    }
  }
}

void rows_avx512_i16(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const I16Acts& a, size_t T,
                     float* Y, size_t ldy, const float* bias) {
  if (grouped_acts(f, Impl::Avx512)) {   // MXFP4 and Q8_0: grouped activations (ActView::grouped)
    const size_t nc = K / 32, nbp = grouped_blocks(nc), rb = row_bytes(f, K);
    // Rows in pairs where a pair shares each group's activations. The
    // grouped form pairs from 4 tokens on (with eight blocks per group one
    // row's weights fill eight registers, and one row against 8 tokens
    // measured 0.70x of a pair on AMD Zen 4); below that its rows stream
    // from memory alone (two interleaved streams had prefetched worse: MXFP4
    // four blocks per group 0.82x). Decode's split form (T <= kSplitTokens:
    // one tile) pairs MXFP4's rows, whose loads set the pace, and keeps
    // Q8_0's alone (row_split).
    const size_t pair = a.split ? (f == Format::MXFP4 ? 2 : 1) : (T >= 4 ? 2 : 1);
    float out[2][kTokenTile];
    for (size_t t0 = 0; t0 < T; t0 += kTokenTile) {
      const size_t tt = std::min(kTokenTile, T - t0);
      const GroupActs ga{a.q + t0 * nbp * 32, a.e + t0 * nbp, a.d + t0 * nbp};
      for (size_t n = n0; n < n1; n += pair) {
        const size_t R = std::min(pair, n1 - n);
        const uint8_t* rows[2] = {W + n * rb, W + (n + R - 1) * rb};
        auto run = [&](auto F) {
          with_tile(tt, [&](auto TT) {
            constexpr Format f_ = decltype(F)::value;
            constexpr int tt_ = decltype(TT)::value;
            if (a.split) {
              if constexpr (tt_ <= kSplitTokens) {
                if (R == 1) row_split<f_, 1, tt_>(rows, nc, a.split, out);
                else if constexpr (f_ == Format::MXFP4) row_split<f_, 2, tt_>(rows, nc, a.split, out);
              }
            } else if (R == 2) {
              rows_grouped<f_, 2, tt_>(rows, nc, ga, tt, out);
            } else {
              rows_grouped<f_, 1, tt_>(rows, nc, ga, tt, out);
            }
          });
        };
        if (f == Format::MXFP4) run(std::integral_constant<Format, Format::MXFP4>{});
        else run(std::integral_constant<Format, Format::Q8_0>{});
        for (size_t r = 0; r < R; ++r)
          for (size_t t = 0; t < tt; ++t) Y[(t0 + t) * ldy + n + r] = out[r][t] + (bias ? bias[n + r] : 0.f);
      }
    }
    return;
  }
  rows_i16_by_tiles(f, W, n0, n1, K, a, T, Y, ldy, bias, [](auto F, auto TT, auto... args) {
    if constexpr (!grouped_acts(decltype(F)::value, Impl::Avx512)) row_tile_i16<decltype(F)::value, decltype(TT)::value>(args...);
  });
}

}  // namespace gd
#endif
