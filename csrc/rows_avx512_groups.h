// Internal to rows_avx512_grouped.cpp: the grouped form's pieces, MXFP4's and
// Q8_0's blocks eight to a vector (their codes' unpacking, scale bytes and
// scales) and the group's sums by vpdpwssd, for its loops over tokens
// (rows_grouped) and decode's split form (row_split).
#pragma once
#include "rows_avx512.h"
#if defined(__x86_64__) || defined(__i386__)

namespace gd {
namespace {

using namespace x86;

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
// in the L3). Needs AVX-512 VNNI (cpu_has_avx512); VBMI where the CPU has
// it (cpu_has_vbmi: rows_avx512_vbmi.cpp), else the qword form below.
struct Mxfp4Consts {
  __m512i pick, scales, table;
};

// MXFP4 without VBMI (Cascade Lake's and Cooper Lake's AVX-512: no vpermb,
// no vpermt2b; a block's 17 bytes put most of its codes on odd bytes, out
// of reach of vpermt2w) picks the same bytes by qword steps: the eight
// bytes from byte s of the 128 that two loads hold, into qword lane p, are
// the qword holding byte s shifted right by 8 (s % 8) bits, or-ed with the
// next qword shifted left by the rest (a shift of 64 bits leaves zeros):
// vpermt2q, two shifts and an or (three vpermt2q for both eights of a
// block's codes); a scale byte by one vpermt2q and one shift. QwordPicks
// holds, per lane, the qword of byte s, the next one, and the two shifts;
// s = 17p + first, block p's byte `first`.
struct QwordPicks {
  alignas(64) int64_t at[8], next[8], right[8], left[8];
};
constexpr QwordPicks mxfp4_qword_picks(int first) {
  QwordPicks p{};
  for (int l = 0; l < 8; ++l) {
    const int s = 17 * l + first;
    p.at[l] = s / 8, p.next[l] = s / 8 + 1, p.right[l] = 8 * (s % 8), p.left[l] = 64 - 8 * (s % 8);
  }
  return p;
}
static constexpr QwordPicks kMxfp4Codes = mxfp4_qword_picks(1);
static constexpr QwordPicks kMxfp4Scales = mxfp4_qword_picks(0);

AVX512_INLINE __m512i pick_low_bytes(__m512i a, __m512i b, const QwordPicks& p) {   // byte s at the qword's bottom
  return _mm512_srlv_epi64(_mm512_permutex2var_epi64(a, _mm512_load_si512(p.at), b), _mm512_load_si512(p.right));
}

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

AVX512_INLINE Mxfp4Consts mxfp4_consts() {
  return {_mm512_load_si512(kMxfp4Picks.pick), _mm512_load_si512(kMxfp4Picks.scales),
          _mm512_broadcast_i32x4(_mm256_castsi256_si128(mxfp4_values256()))};
}

AVX512_INLINE __m512i load_bytes(const uint8_t* p, int n) {   // n of the 64 bytes (the rest zeros)
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
AVX512_INLINE void mxfp4_values(const uint8_t* blk, int blocks, const Mxfp4Consts& c, __m512i table, __m512i v[4],
                                __m512i& ew) {
  const int n = 17 * blocks;
  const __m512i a = load_bytes(blk, n), b = load_bytes(blk + 64, n - 64);
  const __m512i a8 = load_bytes(blk + 8, n - 8), b8 = load_bytes(blk + 72, n - 72);
#ifdef GD_VBMI
  const __m512i q[2] = {_mm512_permutex2var_epi8(a, c.pick, b), _mm512_permutex2var_epi8(a8, c.pick, b8)};
  // vpermb reads an index's low six bits and the table holds the 16 values
  // four times: each byte's low nibble, and after the word shift its high
  // one, pick their values without masking off the bits above
  for (int h = 0; h < 2; ++h) {
    v[2 * h] = _mm512_permutexvar_epi8(q[h], table);
    v[2 * h + 1] = _mm512_permutexvar_epi8(_mm512_srli_epi16(q[h], 4), table);
  }
  ew = _mm512_maskz_permutex2var_epi8(0x1111111111111111ULL, a, c.scales, b);
#else
  // (the second eight bytes start in the qword where the first end: the
  // loads 8 bytes on hold it, and the one after it, at the same index)
  const QwordPicks& k = kMxfp4Codes;
  const __m512i at = _mm512_load_si512(k.at), right = _mm512_load_si512(k.right), left = _mm512_load_si512(k.left);
  const __m512i q0 = _mm512_permutex2var_epi64(a, at, b), q1 = _mm512_permutex2var_epi64(a8, at, b8);
  const __m512i q2 = _mm512_permutex2var_epi64(a8, _mm512_load_si512(k.next), b8);
  const __m512i q[2] = {_mm512_or_si512(_mm512_srlv_epi64(q0, right), _mm512_sllv_epi64(q1, left)),
                        _mm512_or_si512(_mm512_srlv_epi64(q1, right), _mm512_sllv_epi64(q2, left))};
  // vpshufb looks up within each 128-bit lane (the table is in every lane)
  // and zeroes a byte whose index has its top bit set: the nibbles masked
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  for (int h = 0; h < 2; ++h) {
    v[2 * h] = _mm512_shuffle_epi8(table, _mm512_and_si512(q[h], nibble));
    v[2 * h + 1] = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(q[h], 4), nibble));
  }
  // the scale byte at each qword's bottom, then into bytes 0 and 4 (each
  // dword's low byte), zeros elsewhere
  const __m512i spread =
      _mm512_broadcast_i32x4(_mm_setr_epi8(0, -1, -1, -1, 0, -1, -1, -1, 8, -1, -1, -1, 8, -1, -1, -1));
  ew = _mm512_shuffle_epi8(pick_low_bytes(a, b, kMxfp4Scales), spread);
#endif
}

// The grouped loop's form of them: int16 values w[0..7] (grouped_slot's runs).
AVX512_INLINE void mxfp4_group(const uint8_t* blk, int blocks, const Mxfp4Consts& c, __m512i w[8], __m512i& ew) {
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
  // Without VBMI, the same as words (every Q8_0 block starts on an even
  // byte): vpermt2w picks them, one instruction as vpermt2b
  alignas(64) uint16_t code_words[32], scale_words[32];
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
  for (int i = 0; i < 32; ++i) {
    p.code_words[i] = uint16_t(p.codes[2 * i] / 2);
    p.scale_words[i] = uint16_t(p.scales[2 * i] / 2);
  }
  return p;
}
static constexpr Q8Picks kQ8Picks = q8_picks();

// Q8_0's picks: vpermt2b by a byte index (VBMI), or without VBMI vpermt2w by
// the word index of the same bytes (Q8Picks' words)
#ifdef GD_VBMI
AVX512_INLINE __m512i permute_bytes(__m512i a, __m512i index, __m512i b) {
  return _mm512_permutex2var_epi8(a, index, b);
}
#else
AVX512_INLINE __m512i permute_bytes(__m512i a, __m512i index, __m512i b) {
  return _mm512_permutex2var_epi16(a, index, b);
}
#endif

// A group's codes as four vectors of int8 (qword p block p's: codes 0..7,
// 16..23, 8..15, 24..31, the order of the split form, SplitGroup; the
// grouped form's runs 0, 2, 4, 6 widen them) and its eight scales (dw).
// More: the row goes on after this group (eight blocks, then at least one
// more), so the loads need no masks: the last reads 8 bytes past the group,
// into the row's next block (a masked load per load, and the branches that
// pick its mask, cost one token from memory 0.93x; Intel Xeon with AMX).
template <bool More>
AVX512_INLINE void q8_codes(const uint8_t* blk, int blocks, __m512i q[4], __m512& dw) {
  const int n = 34 * blocks;
#ifdef GD_VBMI
  const __m512i pick = _mm512_load_si512(kQ8Picks.codes), scales = _mm512_load_si512(kQ8Picks.scales);
#else
  const __m512i pick = _mm512_load_si512(kQ8Picks.code_words), scales = _mm512_load_si512(kQ8Picks.scale_words);
#endif
  __m512i lo[2], hi[2], sc[2];   // per half: codes 0..15, 16..31 (qword k: 0..7 or 16..23; 4 + k: 8..15 or 24..31)
  for (int h = 0; h < 2; ++h) {
    const uint8_t* p = blk + 136 * h;
    const int m = More ? 1024 : n - 136 * h;   // (More: every load whole, by a constant)
    const __m512i l0 = load_bytes(p, m), l1 = load_bytes(p + 64, m - 64);
    const __m512i m0 = load_bytes(p + 16, m - 16), m1 = load_bytes(p + 80, m - 80);
    lo[h] = permute_bytes(l0, pick, l1);
    hi[h] = permute_bytes(m0, pick, m1);
    sc[h] = permute_bytes(l0, scales, l1);
  }
  q[0] = _mm512_shuffle_i64x2(lo[0], lo[1], 0x44), q[1] = _mm512_shuffle_i64x2(hi[0], hi[1], 0x44);
  q[2] = _mm512_shuffle_i64x2(lo[0], lo[1], 0xEE), q[3] = _mm512_shuffle_i64x2(hi[0], hi[1], 0xEE);
  // words 0..7 of the first half's, 8..15 of the second's (blocks 4..7)
  const __m512i h = _mm512_mask_blend_epi16(0xFF00, sc[0], sc[1]);
  dw = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
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
AVX512_INLINE void group_sums(const __m512i (&w)[R][8], const int16_t* q, __m512i (&s)[R]) {
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
AVX512_INLINE __m512i interleave_rows(__m512i a, __m512i b) { return _mm512_mask_blend_epi32(0xAAAA, a, b); }
AVX512_INLINE __m512 interleave_rows(__m512 a, __m512 b) { return _mm512_mask_blend_ps(0xAAAA, a, b); }

// Lanes 2p and 2p + 1 swapped (vshufps: SIMDe, which the tests emulate
// this file with, lacks vpermilps and vpshufd in 512 bits).
AVX512_INLINE __m512 swap_pairs(__m512 a) { return _mm512_shuffle_ps(a, a, 0xB1); }
AVX512_INLINE __m512i swap_pairs(__m512i a) { return _mm512_castps_si512(swap_pairs(_mm512_castsi512_ps(a))); }

// Each block's whole sum (its two lanes added) for R rows in one vector:
// lane 2p row 0's block p, lane 2p + 1 row 1's (R = 2) or row 0's again (R
// = 1: the same number). MXFP4's lanes hold 256 times the products (|sum|
// < 2^31) and are added as floats, exactly (256 times an integer below
// 2^24); Q8_0's (and Q4_0's, Q5_0's) as int32 (|sum| < 2^27), then converted.
template <Format F, int R>
AVX512_INLINE __m512 block_sums(const __m512i (&s)[R]) {
  if constexpr (F == Format::MXFP4 || F == Format::Q6_K) {   // (Q6_K's lanes: below 2^31, rounded to floats)
    const __m512 a = _mm512_cvtepi32_ps(s[0]);
    if constexpr (R == 1) return _mm512_add_ps(a, swap_pairs(a));
    const __m512 b = _mm512_cvtepi32_ps(s[1]);
    return _mm512_add_ps(interleave_rows(a, b), swap_pairs(interleave_rows(b, a)));
  } else {
    if constexpr (R == 1) return _mm512_cvtepi32_ps(_mm512_add_epi32(s[0], swap_pairs(s[0])));
    return _mm512_cvtepi32_ps(_mm512_add_epi32(interleave_rows(s[0], s[1]), swap_pairs(interleave_rows(s[1], s[0]))));
  }
}

}  // namespace
}  // namespace gd
#endif
