// Internal to rows_avx512_grouped.cpp: the grouped form's pieces for the
// formats whose codes fit a byte besides Q8_0's, decoded into q8_codes'
// order (rows_avx512_groups.h): the legacy 4- and 5-bit blocks (Q4_0, Q4_1,
// Q5_0, Q5_1, IQ4_NL) and the super-blocks of Q4_K, Q5_K and IQ4_XS, each
// one group, its eight 32-value chunks the blocks. From there they are Q8_0's
// codes: the same widening, sums, scales and split form, so the same bits in
// every tile; formats with minimums (Q4_1, Q5_1, Q4_K, Q5_K) add them by a
// second FMA (rows_avx512_grouped.cpp's add_min_terms). Against the chunk
// loop (one vpmaddwd, a conversion and an FMA per block and token, the first
// two on one port in 512 bits on Intel) one vpdpwssd per block and token.
#pragma once
#include "rows_avx512_groups.h"
#if defined(__x86_64__) || defined(__i386__)

namespace gd {
namespace {

using namespace x86;

// The legacy blocks: an fp16 scale d, the minimum m (Q4_1, Q5_1: fp16, the
// value d code + m), the 32 fifth bits (Q5_0, Q5_1), then 16 bytes of
// nibbles, low ones codes 0..15 and high ones 16..31. Q4_0's and Q5_0's
// values are d (code - offset); IQ4_NL's d times a table's entry
// (kIq4nlValues, -127..113: signed codes, as Q8_0's).
struct Legacy {
  int size, bits_at, codes_at, offset;
  bool min, table;
};
constexpr Legacy legacy(Format f) {
  switch (f) {
    case Format::Q4_0: return {18, 0, 2, 8, false, false};
    case Format::Q4_1: return {20, 0, 4, 0, true, false};
    case Format::Q5_0: return {22, 2, 6, 16, false, false};
    case Format::IQ4_NL: return {18, 0, 2, 0, false, true};
    default: return {24, 4, 8, 0, true, false};   // Q5_1
  }
}

// Whether a format's int8 codes are signed (Q8_0's, and IQ4_NL's and
// IQ4_XS's table values): decode's split form flips their top bit as Q8_0's
// (SplitGroup::c); the others' are unsigned there, their values less an
// offset.
constexpr bool signed_codes(Format f) { return f == Format::Q8_0 || f == Format::IQ4_NL || f == Format::IQ4_XS; }

// The table's 16 values in each 128-bit lane, for vpshufb.
AVX512_INLINE __m512i iq4_table() {
  return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
}
constexpr int nibble_offset(Format f) { return legacy(f).offset; }

// A half group's four blocks come from two loads; one permute puts code
// bytes 0..7 of block k into qword k and 8..15 into qword 4 + k, one its
// fifth bits into qword k, one its scale into words 2k and 2k + 1, one its
// minimum likewise; the halves are joined as Q8_0's. Every pick is of whole
// words (the blocks' sizes and fields are even): without VBMI, vpermt2w.
struct SmallPicks {
  alignas(64) uint8_t codes[64], bits[64], scales[64], mins[64];
  alignas(64) uint16_t code_words[32], bit_words[32], scale_words[32], min_words[32];
};
constexpr SmallPicks small_picks(Legacy b) {
  SmallPicks p{};
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 8; ++j) {
      p.codes[8 * k + j] = uint8_t(b.size * k + b.codes_at + j);
      p.codes[32 + 8 * k + j] = uint8_t(b.size * k + b.codes_at + 8 + j);
      p.bits[8 * k + j] = p.bits[32 + 8 * k + j] = uint8_t(b.size * k + b.bits_at + j % 4);   // (qwords 4..7 unused)
    }
  for (int l = 0; l < 16; ++l) {   // word l: block l / 2's scale (as Q8Picks'), and its minimum
    const int k = (l / 2) % 4;
    p.scales[2 * l] = uint8_t(b.size * k), p.scales[2 * l + 1] = uint8_t(b.size * k + 1);
    p.mins[2 * l] = uint8_t(b.size * k + 2), p.mins[2 * l + 1] = uint8_t(b.size * k + 3);
  }
  for (int i = 0; i < 32; ++i) {
    p.code_words[i] = uint16_t(p.codes[2 * i] / 2);
    p.bit_words[i] = uint16_t(p.bits[2 * i] / 2);
    p.scale_words[i] = uint16_t(p.scales[2 * i] / 2);
    p.min_words[i] = uint16_t(p.mins[2 * i] / 2);
  }
  return p;
}
template <Format F>
constexpr SmallPicks kSmallPicks = small_picks(legacy(F));

#ifdef GD_VBMI
#define GD_PICKS(k, bytes, words) _mm512_load_si512((k).bytes)
#else
#define GD_PICKS(k, bytes, words) _mm512_load_si512((k).words)
#endif

// A group's codes in q8_codes' four vectors of eight codes per block,
// unsigned (u: the nibble, plus 16 where the fifth bit is set: each qword's
// fifth-bit byte spread to its eight bytes by vpshufb, tested against each
// byte's bit) or, with Values, as Q4_0's and Q5_0's values u - offset; dw
// the blocks' scales, mw their minimums (Q4_1, Q5_1), each in its block's
// two lanes. Decode's split form takes u as both of vpdpbusd's sides, its
// offset's share -offset times the lane's activations (SplitGroup::c),
// where Q8_0's flips each code's top bit.
template <Format F, bool Values>
AVX512_INLINE void nibble_codes(const uint8_t* blk, int blocks, __m512i q[4], __m512& dw, __m512& mw) {
  constexpr Legacy b = legacy(F);
  constexpr bool five = b.bits_at != 0;
  const SmallPicks& k = kSmallPicks<F>;
  const __m512i pick = GD_PICKS(k, codes, code_words), bits = GD_PICKS(k, bits, bit_words);
  const __m512i scales = GD_PICKS(k, scales, scale_words), mins = GD_PICKS(k, mins, min_words);
  const int n = b.size * blocks;
  __m512i c[2], h[2], sc[2], mn[2];
  for (int half = 0; half < 2; ++half) {
    const uint8_t* p = blk + 4 * b.size * half;
    const int m = n - 4 * b.size * half;
    const __m512i l0 = load_bytes(p, m), l1 = load_bytes(p + 64, m - 64);
    c[half] = permute_bytes(l0, pick, l1);
    if constexpr (five) h[half] = permute_bytes(l0, bits, l1);
    sc[half] = permute_bytes(l0, scales, l1);
    if constexpr (b.min) mn[half] = permute_bytes(l0, mins, l1);
  }
  const __m512i lo = _mm512_shuffle_i64x2(c[0], c[1], 0x44), hi = _mm512_shuffle_i64x2(c[0], c[1], 0xEE);
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  // codes 0..7, 16..23, 8..15, 24..31 of block p in qword p (q8_codes' order)
  q[0] = _mm512_and_si512(lo, nibble), q[1] = _mm512_and_si512(_mm512_srli_epi16(lo, 4), nibble);
  q[2] = _mm512_and_si512(hi, nibble), q[3] = _mm512_and_si512(_mm512_srli_epi16(hi, 4), nibble);
  if constexpr (five) {
    const __m512i fifth = _mm512_shuffle_i64x2(h[0], h[1], 0x44);   // qword p: block p's 32 bits
    const __m512i each = _mm512_set1_epi64(int64_t(0x8040201008040201ULL)), sixteen = _mm512_set1_epi8(16);
    constexpr int byte_of[4] = {0, 2, 1, 3};   // the fifth bits' byte of each vector's codes
    for (int j = 0; j < 4; ++j) {
      const int x = byte_of[j];
      const __m512i spread = _mm512_broadcast_i32x4(
          _mm_setr_epi8(x, x, x, x, x, x, x, x, 8 + x, 8 + x, 8 + x, 8 + x, 8 + x, 8 + x, 8 + x, 8 + x));
      const __mmask64 set = _mm512_test_epi8_mask(_mm512_shuffle_epi8(fifth, spread), each);
      q[j] = _mm512_mask_add_epi8(q[j], set, q[j], sixteen);
    }
  }
  if constexpr (Values && b.offset != 0)
    for (int j = 0; j < 4; ++j) q[j] = _mm512_sub_epi8(q[j], _mm512_set1_epi8(int8_t(b.offset)));
  if constexpr (b.table)
    for (int j = 0; j < 4; ++j) q[j] = _mm512_shuffle_epi8(iq4_table(), q[j]);
  dw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_mask_blend_epi16(0xFF00, sc[0], sc[1])));
  if constexpr (b.min) mw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_mask_blend_epi16(0xFF00, mn[0], mn[1])));
}

// Q4_K's and Q5_K's super-block: the 128 code bytes by two loads (chunks 2c
// and 2c + 1 share bytes 32c .. 32c + 31, the first their low nibbles, the
// second their high ones); each of q8_codes' four vectors by one permute
// (eight bytes of chunk p's pair into qword p), a shift of the odd chunks'
// qwords by 4 and a mask: the codes 0..15, unsigned. Q5_K's fifth bits (bit
// p of byte i of its 32: chunk p's code i) plus 16 where set: the eight
// bytes of a vector's codes broadcast to every qword and tested against
// qword p's bit p. The chunks' scales d sc and minimums -(dmin m)
// (k4_fields, scaled_bytes: the chunk loop's values), each in its chunk's
// two lanes.
struct K4Picks {
  alignas(64) uint8_t codes[4][64];
  alignas(64) uint16_t code_words[4][32];
  alignas(64) int64_t shifts[8], bits[8];
};
constexpr int kFirstCode[4] = {0, 16, 8, 24};   // q8_codes' order
constexpr K4Picks k4_picks() {
  K4Picks p{};
  for (int v = 0; v < 4; ++v)
    for (int c = 0; c < 8; ++c)
      for (int j = 0; j < 8; ++j) p.codes[v][8 * c + j] = uint8_t(32 * (c / 2) + kFirstCode[v] + j);
  for (int v = 0; v < 4; ++v)
    for (int i = 0; i < 32; ++i) p.code_words[v][i] = uint16_t(p.codes[v][2 * i] / 2);
  for (int c = 0; c < 8; ++c) p.shifts[c] = 4 * (c % 2), p.bits[c] = int64_t(0x0101010101010101ULL << c);
  return p;
}
static constexpr K4Picks kK4Picks = k4_picks();

template <Format F>
AVX512_INLINE void k4_codes(const uint8_t* blk, __m512i q[4], __m512& dw, __m512& mw) {
  static_assert(F == Format::Q4_K || F == Format::Q5_K);
  constexpr int at = F == Format::Q5_K ? 48 : 16;   // the code bytes (Q5_K: after the 32 of fifth bits)
  const __m512i a = _mm512_loadu_si512(blk + at), b = _mm512_loadu_si512(blk + at + 64);
  const __m512i shifts = _mm512_load_si512(kK4Picks.shifts), nibble = _mm512_set1_epi8(0x0F);
  for (int v = 0; v < 4; ++v) {
    const __m512i pick = GD_PICKS(kK4Picks, codes[v], code_words[v]);
    q[v] = _mm512_and_si512(_mm512_srlv_epi64(permute_bytes(a, pick, b), shifts), nibble);
    if constexpr (F == Format::Q5_K) {
      int64_t eight;
      std::memcpy(&eight, blk + 16 + kFirstCode[v], 8);
      const __mmask64 set = _mm512_test_epi8_mask(_mm512_set1_epi64(eight), _mm512_load_si512(kK4Picks.bits));
      q[v] = _mm512_mask_add_epi8(q[v], set, q[v], _mm512_set1_epi8(16));
    }
  }
  uint32_t s[4];
  k4_fields(blk, s);
  const __m512i each2 = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  dw = _mm512_permutexvar_ps(each2, _mm512_castps256_ps512(scaled_bytes(s, blk, half_x86)));
  mw = _mm512_permutexvar_ps(each2, _mm512_castps256_ps512(scaled_bytes(s + 2, blk + 2, half_x86, -0.f)));
}
// IQ4_XS's super-block (d, 16 bits of the scales' high bits, four bytes of
// their low nibbles, then each chunk's 16 bytes of nibbles, low ones codes
// 0..15, high ones 16..31): two loads, bytes 0..7 and 8..15 of chunk p into
// qword p by one permute each, their nibbles looked up in the table; each
// chunk's scale d (ls - 32) (superblock_scales' values) in its two lanes.
struct XsPicks {
  alignas(64) uint8_t low[64], high[64];
  alignas(64) uint16_t low_words[32], high_words[32];
};
constexpr XsPicks xs_picks() {
  XsPicks p{};
  for (int c = 0; c < 8; ++c)
    for (int j = 0; j < 8; ++j) p.low[8 * c + j] = uint8_t(16 * c + j), p.high[8 * c + j] = uint8_t(16 * c + 8 + j);
  for (int i = 0; i < 32; ++i)
    p.low_words[i] = uint16_t(p.low[2 * i] / 2), p.high_words[i] = uint16_t(p.high[2 * i] / 2);
  return p;
}
static constexpr XsPicks kXsPicks = xs_picks();

AVX512_INLINE void xs_codes(const uint8_t* blk, __m512i q[4], __m512& dw) {
  const __m512i a = _mm512_loadu_si512(blk + 8), b = _mm512_loadu_si512(blk + 72);
  const __m512i lo = permute_bytes(a, GD_PICKS(kXsPicks, low, low_words), b);
  const __m512i hi = permute_bytes(a, GD_PICKS(kXsPicks, high, high_words), b);
  const __m512i nibble = _mm512_set1_epi8(0x0F), table = iq4_table();
  q[0] = _mm512_shuffle_epi8(table, _mm512_and_si512(lo, nibble));
  q[1] = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(lo, 4), nibble));
  q[2] = _mm512_shuffle_epi8(table, _mm512_and_si512(hi, nibble));
  q[3] = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(hi, 4), nibble));
  // each chunk's 6-bit ls (a nibble from the four bytes at 4, two bits from
  // the word at 2) into byte j of a word by shifts and masks, then d (ls -
  // 32) as superblock_scales forms it (the scalar unpacking had cost a
  // quarter of the one-token rate)
  uint32_t low;
  uint16_t high, h;
  std::memcpy(&h, blk, 2), std::memcpy(&high, blk + 2, 2), std::memcpy(&low, blk + 4, 4);
  uint64_t n = low, t = high;
  n = (n | n << 16) & 0x0000FFFF0000FFFFULL, n = (n | n << 8) & 0x00FF00FF00FF00FFULL;
  n = (n | n << 4) & 0x0F0F0F0F0F0F0F0FULL;
  t = (t | t << 24) & 0x000000FF000000FFULL, t = (t | t << 12) & 0x000F000F000F000FULL;
  t = (t | t << 6) & 0x0303030303030303ULL;
  const __m256i ls = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(n | t << 4)));
  const __m256 sc =
      _mm256_mul_ps(_mm256_set1_ps(half_x86(h)), _mm256_cvtepi32_ps(_mm256_sub_epi32(ls, _mm256_set1_epi32(32))));
  const __m512i each2 = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  dw = _mm512_permutexvar_ps(each2, _mm512_castps256_ps512(sc));
}
// Q6_K's super-block as one group (its chunks the blocks), whose codes
// (-32..31) come with a scale per 16 values (int8), which the grouped lanes
// mix (a lane holds codes 0..3, 8..11, 16..19, 24..27 of its block): the
// codes times their scale go in as the int16 values (|q sc| <= 4096, so a
// lane's sixteen products stay below 2^31: 16 x 4096 x 32767), the
// super-block's d as every block's scale; so it takes the grouped loop
// alone (no split form, no tiles) and its lanes are added as floats
// (block_sums). Each of q8_codes' four vectors: the low nibbles by a
// permute of the 128 bytes of them (chunk c's eight from byte 64 (c / 4) +
// 32 (c % 2), the high nibble for c % 4 >= 2), the two high bits by a
// permute of the 64 bytes of them (byte 32 (c / 4), bits 2 (c % 4)), each
// qword shifted by its own count, masked, joined and less 32; widened as
// Q8_0's codes, each run times its chunks' scale (the first 16 codes' or
// the last's) by vpmullw.
struct Q6Picks {
  alignas(64) uint8_t low[4][64], high[4][64];
  alignas(64) uint16_t low_words[4][32], high_words[4][32], lo_scale[32], hi_scale[32];
  alignas(64) int64_t low_shift[8], high_shift[8];
};
constexpr Q6Picks q6_picks() {
  Q6Picks p{};
  for (int v = 0; v < 4; ++v)
    for (int c = 0; c < 8; ++c)
      for (int j = 0; j < 8; ++j) {
        p.low[v][8 * c + j] = uint8_t(64 * (c / 4) + 32 * (c % 2) + kFirstCode[v] + j);
        p.high[v][8 * c + j] = uint8_t(32 * (c / 4) + kFirstCode[v] + j);
      }
  for (int v = 0; v < 4; ++v)
    for (int i = 0; i < 32; ++i)
      p.low_words[v][i] = uint16_t(p.low[v][2 * i] / 2), p.high_words[v][i] = uint16_t(p.high[v][2 * i] / 2);
  for (int i = 0; i < 32; ++i) p.lo_scale[i] = uint16_t(2 * (i / 4)), p.hi_scale[i] = uint16_t(2 * (i / 4) + 1);
  for (int c = 0; c < 8; ++c) p.low_shift[c] = c % 4 >= 2 ? 4 : 0, p.high_shift[c] = 2 * (c % 4);
  return p;
}
static constexpr Q6Picks kQ6Picks = q6_picks();

AVX512_INLINE void q6k_group(const uint8_t* blk, __m512i w[8], __m512& dw) {
  const Q6Picks& k = kQ6Picks;
  const __m512i l0 = _mm512_loadu_si512(blk), l1 = _mm512_loadu_si512(blk + 64), h = _mm512_loadu_si512(blk + 128);
  const __m512i nibble = _mm512_set1_epi8(0x0F), two = _mm512_set1_epi8(3);
  const __m512i low_shift = _mm512_load_si512(k.low_shift), high_shift = _mm512_load_si512(k.high_shift);
  // the chunks' scales as words: qword p chunk p's first-half (lo) or second-half (hi) scale
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192));
  const __m512i sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(bytes));
  const __m512i lo = _mm512_permutexvar_epi16(_mm512_load_si512(k.lo_scale), sc);
  const __m512i hi = _mm512_permutexvar_epi16(_mm512_load_si512(k.hi_scale), sc);
  for (int v = 0; v < 4; ++v) {
    const __m512i lows = permute_bytes(l0, GD_PICKS(k, low[v], low_words[v]), l1);
    const __m512i highs = permute_bytes(h, GD_PICKS(k, high[v], high_words[v]), h);
    const __m512i n = _mm512_and_si512(_mm512_srlv_epi64(lows, low_shift), nibble);
    const __m512i t = _mm512_and_si512(_mm512_srlv_epi64(highs, high_shift), two);
    const __m512i q = _mm512_sub_epi8(_mm512_or_si512(n, _mm512_slli_epi16(t, 4)), _mm512_set1_epi8(32));
    const __m512i s = v % 2 == 0 ? lo : hi;   // (vectors 0 and 2: codes 0..15; 1 and 3: 16..31)
    w[2 * v] = _mm512_mullo_epi16(_mm512_srai_epi16(_mm512_slli_epi16(q, 8), 8), s);
    w[2 * v + 1] = _mm512_mullo_epi16(_mm512_srai_epi16(q, 8), s);
  }
  uint16_t d;
  std::memcpy(&d, blk + 208, 2);
  dw = _mm512_set1_ps(half_x86(d));
}

#undef GD_PICKS

// A group's int8 codes (q8_codes' order): Q8_0's signed, the others'
// unsigned or (Values) as their values (legacy offsets taken off; the
// K-quants' and the formats with minimums' codes are their values already).
template <Format F, bool Values>
AVX512_INLINE void int8_codes(const uint8_t* blk, int blocks, __m512i q[4], __m512& dw, __m512& mw) {
  if constexpr (F == Format::Q4_K || F == Format::Q5_K) k4_codes<F>(blk, q, dw, mw);   // (whole groups always)
  else if constexpr (F == Format::IQ4_XS) xs_codes(blk, q, dw);
  else nibble_codes<F, Values>(blk, blocks, q, dw, mw);
}

// The int8 formats' codes as the grouped loop's int16 values w[0..7]: vector
// j's even bytes into run 2j, its odd ones into run 2j + 1 (grouped_slot's);
// mw: the minimums of the formats with them.
template <Format F>
AVX512_INLINE void int8_group(const uint8_t* blk, int blocks, __m512i w[8], __m512& dw, __m512& mw) {
  if constexpr (F == Format::Q6_K) {
    q6k_group(blk, w, dw);
  } else {
    __m512i q[4];
    // (Q8_0 in the loop over tokens: a branch to q8_codes<true> there, 0.77-0.85x)
    if constexpr (F == Format::Q8_0) q8_codes<false>(blk, blocks, q, dw);
    else int8_codes<F, true>(blk, blocks, q, dw, mw);
    for (int j = 0; j < 4; ++j) {
      w[2 * j] = _mm512_srai_epi16(_mm512_slli_epi16(q[j], 8), 8);
      w[2 * j + 1] = _mm512_srai_epi16(q[j], 8);
    }
  }
}

}  // namespace
}  // namespace gd
#endif
