// Internal to the x86 row kernels (rows_avx2_i16.cpp, rows_avx512.cpp): what
// both paths share, the unpacking of each block format's codes into 32
// bytes (AVX2 instructions, which the AVX-512 path widens to int16 in one
// step) and MXFP4's scale table; the K-quants' super-block scales by
// vectors (superblock_scales' values, for both paths); and the one-token
// helpers: eight chunks' scales by vector multiplies, eight chunks'
// minimums' terms by vectors.
#pragma once
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "formats.h"
#include "quants.h"
#include "rows.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))

namespace gd {
namespace x86 {

// The scale of an MXFP4 block's sum in the I16 kernels, by table: the
// weight scale e8m0_to_fp32_half(e) = 2^(e - 128) times the activation block
// scale 2^-k, over the 256 the codes carry (see load_codes), is
// 2^(e - 136 - k) = kMxfp4Scale[e + ActView::e[b]] with ActView::e[b] =
// 128 - k. A broadcast load: no multiply and no register broadcast per block.
// The table and the value table below are constants of each file that uses
// them, not shared variables: a shared one is reached through the GOT, and
// GCC reloaded both its address and the value table in every block of the
// one-token MXFP4 loop (9 loads per block where the load ports allow 2 per
// cycle).
struct Mxfp4ScaleTable {
  float v[512];
};
constexpr Mxfp4ScaleTable mxfp4_scale_table() {
  Mxfp4ScaleTable t{};
  double p = 1.0;
  for (int i = 0; i < kMxfp4ScaleOffset; ++i) p /= 2;   // 2^-264, exact in a double
  for (int i = 0; i < 512; ++i, p *= 2) t.v[i] = float(p);
  return t;
}
static constexpr Mxfp4ScaleTable kMxfp4ScaleTable = mxfp4_scale_table();
static constexpr const float* kMxfp4Scale = kMxfp4ScaleTable.v;

// MXFP4's value table (kMxfp4Values) in both 128-bit halves, as an
// immediate constant the compiler keeps in a register across a loop.
AVX2 inline __m256i mxfp4_values256() {
  return _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
                          0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
}


AVX2 inline __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// 16 bytes of 4-bit codes as 32 bytes: the low nibbles (codes 0..15), then
// the high ones (codes 16..31). The bytes loaded into both halves, the
// second half's shifted down by one variable shift (MXFP4's codes took
// this form first; mxfp4_codes8 uses it), where a shift and a lane insert
// took two operations of the pipes that also shift and shuffle: one token
// in the L1, cycles per chunk, Q4_0 5.58 -> 5.29, Q5_0 6.79 -> 6.26, Q4_1
// 6.49 -> 6.19, IQ4_NL 7.51 -> 6.86 (medians of 12 to 16 alternating
// runs; the formats it does not touch moved 0.96-1.02x), 8 tokens
// 0.98-1.08x (AMD EPYC Zen 3). Narrow (cores that split 256-bit
// operations, where a 256-bit variable shift is slow) keeps the shift and
// insert.
template <bool Narrow = false>
AVX2 inline __m256i nibbles16(const uint8_t* qs) {
  if constexpr (Narrow) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(x, 4), x), _mm256_set1_epi8(0x0F));
  }
  const __m256i x = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  return _mm256_and_si256(_mm256_srlv_epi64(x, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}

// 32 bytes' low (shift 0) or high (shift 4) nibbles.
AVX2 inline __m256i nibbles32(const uint8_t* qs, int shift) {
  return _mm256_and_si256(_mm256_srl_epi16(load256(qs), _mm_cvtsi32_si128(shift)), _mm256_set1_epi8(0x0F));
}

// Bits n .. n + width - 1 of each of 32 bytes, in place at bit 0.
AVX2 inline __m256i bits_of(const uint8_t* p, int n, int width) {
  return _mm256_and_si256(_mm256_srl_epi16(load256(p), _mm_cvtsi32_si128(n)), _mm256_set1_epi8(char((1 << width) - 1)));
}

// Bits n .. n + width - 1 of each of 32 bytes, moved to bits to .. to +
// width - 1 (the rest clear) by one 16-bit shift either way and a mask: the
// bits a shift carries across a byte's edge land outside the field (a shift
// up by to - n fills bits below to - n <= to; one down by n - to, bits from
// 8 - (n - to) >= to + width on). Where bits_of and a shift back took two
// shifts: with the chunk loops unrolled (n and to constants), in the L1, 8
// tokens Q5_K 1.12-1.16x, one token 1.02-1.04x; Q6_K 0.99-1.02x (AMD EPYC
// Zen 3; without the unrolling, run-time shifts had lost Q6_K 2x).
AVX2 inline __m256i bits_to(const uint8_t* p, int n, int width, int to) {
  const __m256i v = load256(p);
  const __m256i moved = n >= to ? _mm256_srli_epi16(v, n - to) : _mm256_slli_epi16(v, to - n);
  return _mm256_and_si256(moved, _mm256_set1_epi8(char(((1 << width) - 1) << to)));
}

// Byte j: 0xFF where bit j of x is set.
AVX2 inline __m256i bit_bytes(uint32_t x) {
  const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i sel = _mm256_set1_epi64x(int64_t(0x8040201008040201ULL));
  const __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32(int(x)), shuf);
  return _mm256_cmpeq_epi8(_mm256_and_si256(b, sel), sel);
}

// The 32 int8 codes of chunk `sub` of a block (formats.cpp's chunk_codes, in
// registers; Narrow: nibbles16's).
template <Format F, bool Narrow = false>
AVX2 inline __m256i codes8(const uint8_t* b, int sub) {
  const __m256i iq4 = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
  if constexpr (F == Format::Q4_0) return _mm256_sub_epi8(nibbles16<Narrow>(b + 2), _mm256_set1_epi8(8));
  if constexpr (F == Format::Q4_1) return nibbles16<Narrow>(b + 4);
  if constexpr (F == Format::Q5_0 || F == Format::Q5_1) {
    constexpr bool one = F == Format::Q5_1;
    uint32_t qh;
    std::memcpy(&qh, b + (one ? 4 : 2), 4);
    const __m256i set = bit_bytes(qh), n = nibbles16<Narrow>(b + (one ? 8 : 6));
    // the fifth bit's 16 where set (Q5_1), or the offset -16 where clear (Q5_0: code - 16)
    if constexpr (one) return _mm256_or_si256(n, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    return _mm256_sub_epi8(n, _mm256_andnot_si256(set, _mm256_set1_epi8(16)));
  }
  if constexpr (F == Format::IQ4_NL) return _mm256_shuffle_epi8(iq4, nibbles16<Narrow>(b + 2));
  if constexpr (F == Format::IQ4_XS) return _mm256_shuffle_epi8(iq4, nibbles16<Narrow>(b + 8 + 16 * sub));
  if constexpr (F == Format::Q2_K) return bits_of(b + 16 + 32 * (sub / 4), 2 * (sub % 4), 2);
  if constexpr (F == Format::Q3_K) {
    const __m256i q = bits_of(b + 32 + 32 * (sub / 4), 2 * (sub % 4), 2);
    const __m256i unset = _mm256_cmpeq_epi8(_mm256_and_si256(load256(b), _mm256_set1_epi8(char(1 << sub))),
                                            _mm256_setzero_si256());
    return _mm256_sub_epi8(q, _mm256_and_si256(unset, _mm256_set1_epi8(4)));
  }
  if constexpr (F == Format::Q4_K) return nibbles32(b + 16 + 32 * (sub / 2), 4 * (sub % 2));
  if constexpr (F == Format::Q5_K)
    return _mm256_or_si256(nibbles32(b + 48 + 32 * (sub / 2), 4 * (sub % 2)), bits_to(b + 16, sub, 1, 4));
  if constexpr (F == Format::Q6_K) {
    const int h = sub / 4, r = sub % 4;
    const __m256i lo = nibbles32(b + 64 * h + 32 * (r & 1), r >= 2 ? 4 : 0);
    const __m256i hi = bits_to(b + 128 + 32 * h, 2 * r, 2, 4);
    return _mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(32));
  }
  return _mm256_setzero_si256();
}

// One token, a super-block's eight chunks: the scales d[j][h] * ad[j] of
// each chunk j and half h (chunk_i16's products, by two vector multiplies
// where it formed each as a scalar, stored, and broadcast back).
AVX2 inline void one_token_scales(const float d[8][2], const float* ad, float sc[8][2]) {
  const __m256 v = _mm256_loadu_ps(ad);
  const __m256 lo = _mm256_unpacklo_ps(v, v), hi = _mm256_unpackhi_ps(v, v);   // each twice
  _mm256_store_ps(&sc[0][0], _mm256_mul_ps(_mm256_loadu_ps(&d[0][0]), _mm256_permute2f128_ps(lo, hi, 0x20)));
  _mm256_store_ps(&sc[4][0], _mm256_mul_ps(_mm256_loadu_ps(&d[4][0]), _mm256_permute2f128_ps(lo, hi, 0x31)));
}

// One token, eight consecutive 32-value blocks: their scales d_j * ad[j]
// (the fp16 d_j of each block's first two bytes, converted as block_scales
// converts it; the products chunk_i16 forms one at a time), by one vector
// conversion and multiply.
template <Format F>
AVX2 inline __m256 eight_block_halves(const uint8_t* blk, int at) {   // the fp16 at byte `at` of each
  uint16_t h[8];
  for (int j = 0; j < 8; ++j) std::memcpy(&h[j], blk + j * block_bytes(F) + at, 2);
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
}
template <Format F>
AVX2 inline void eight_block_scales(const uint8_t* blk, const float* ad, float sc[8]) {
  _mm256_storeu_ps(sc, _mm256_mul_ps(eight_block_halves<F>(blk, 0), _mm256_loadu_ps(ad)));
}

// One block's scale for each of a tile's TT tokens, d * ad[t] (as the
// reference rounds them: one multiply each) into out (32-byte aligned), so
// the tokens' steps broadcast each from memory: a load instead of a
// multiply and a shuffle per token; a full tile by one vector multiply.
template <int TT>
AVX2 inline void tile_scales(float d, const float* ad, float* out) {
  if constexpr (TT == 8) {
    _mm256_store_ps(out, _mm256_mul_ps(_mm256_set1_ps(d), _mm256_loadu_ps(ad)));
  } else {
    GD_EACH_TOKEN
    for (int t = 0; t < TT; ++t) out[t] = d * ad[t];
  }
}

// Eight int32 (as float bits) picked from two vectors by a 128-bit-lane
// shuffle (tokens 0, 1, 4, 5 | 2, 3, 6, 7), as floats in token order.
AVX2 inline __m256 in_token_order(__m256 v) {
  return _mm256_cvtepi32_ps(_mm256_permute4x64_epi64(_mm256_castps_si256(v), 0xD8));
}

// Eight floats each twice (both halves of a chunk): out = v0 v0 v1 v1 .. v7 v7.
AVX2 inline void store_twice(float* out, __m256 v) {
  const __m256 lo = _mm256_unpacklo_ps(v, v), hi = _mm256_unpackhi_ps(v, v);
  _mm256_storeu_ps(out, _mm256_permute2f128_ps(lo, hi, 0x20));
  _mm256_storeu_ps(out + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
}

// Sixteen int32 (two vectors) times a scale, as floats, stored in order;
// with flip = -0.f negated after the product (-(scale v)).
AVX2 inline void store_scaled(float* out, __m256i lo, __m256i hi, __m256 scale, float flip = 0.f) {
  const __m256 f = _mm256_set1_ps(flip);
  _mm256_storeu_ps(out, _mm256_xor_ps(_mm256_mul_ps(scale, _mm256_cvtepi32_ps(lo)), f));
  _mm256_storeu_ps(out + 8, _mm256_xor_ps(_mm256_mul_ps(scale, _mm256_cvtepi32_ps(hi)), f));
}

// Sixteen zeros (the minimums of formats without them).
AVX2 inline void store_zeros(float* out) {
  _mm256_storeu_ps(out, _mm256_setzero_ps());
  _mm256_storeu_ps(out + 8, _mm256_setzero_ps());
}

// Q6_K: a super-block's sixteen half-chunk scales (superblock_scales'
// values, bit for bit: d = dd sc, sc int8; no minimums), eight at a time:
// half h of chunk j is scale 2 j + h, so they are stored in their order.
template <class Half>
AVX2 inline void q6k_superblock_scales(const uint8_t* b, float d[8][2], float m[8][2], Half half) {
  uint16_t h;
  std::memcpy(&h, b + 208, 2);
  const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
  store_scaled(&d[0][0], _mm256_cvtepi8_epi32(sc), _mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)),
               _mm256_set1_ps(half(h)));
  store_zeros(&m[0][0]);
}

// Q2_K: a super-block's sixteen minimums (k23_superblock_scales' m, bit for
// bit), chunk j's first half's in lane j of m0 and its second's in m1.
template <class Half>
AVX2 inline void q2k_minimums(const uint8_t* b, Half half, __m256& m0, __m256& m1) {
  uint16_t h;
  std::memcpy(&h, b + 82, 2);
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  // the high nibbles, the even bytes' first (chunk j's first half is byte 2j)
  const __m128i mn = _mm_shuffle_epi8(_mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F)),
                                      _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
  const __m256 dmin = _mm256_set1_ps(half(h)), flip = _mm256_set1_ps(-0.f);   // m = -(dmin mn)
  m0 = _mm256_xor_ps(_mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn))), flip);
  m1 = _mm256_xor_ps(_mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(mn, 8)))), flip);
}

// Q3_K's sixteen 6-bit scales (q3k_scales' bytes) in a register: words
// w0, w1 of the packed twelve bytes and their high nibbles, each with two
// bits of the third word on top. (q3k_scales' bytes stored and loaded back
// as one vector missed the store-to-load forwarding: two 8-byte stores
// under one 16-byte load.)
AVX2 inline __m128i q3k_scales_sse(const uint8_t* packed) {
  uint32_t tmp;
  std::memcpy(&tmp, packed + 8, 4);
  const __m128i w = _mm_shuffle_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(packed)), 0x44);   // w0 w1 w0 w1
  const __m128i low = _mm_and_si128(_mm_srlv_epi32(w, _mm_setr_epi32(0, 0, 4, 4)), _mm_set1_epi8(0x0F));
  const __m128i top = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(int(tmp)), _mm_setr_epi32(0, 2, 4, 6)),
                                    _mm_set1_epi8(0x03));
  return _mm_or_si128(low, _mm_slli_epi32(top, 4));
}

// Q2_K and Q3_K likewise (superblock_scales' values, bit for bit): Q2_K's
// sixteen bytes hold a scale (low nibble, d = dd sc) and a minimum (high
// nibble, m = -(dmin mn)); Q3_K's sixteen 6-bit scales (unpacked as ggml
// does) less 32, times dd.
template <class Half>
AVX2 inline void k23_superblock_scales(Format f, const uint8_t* b, float d[8][2], float m[8][2], Half half) {
  uint16_t h[2];
  if (f == Format::Q2_K) {
    std::memcpy(h, b + 80, 4);
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), low = _mm_set1_epi8(0x0F);
    const __m128i sc = _mm_and_si128(bytes, low), mn = _mm_and_si128(_mm_srli_epi16(bytes, 4), low);
    store_scaled(&d[0][0], _mm256_cvtepu8_epi32(sc), _mm256_cvtepu8_epi32(_mm_srli_si128(sc, 8)),
                 _mm256_set1_ps(half(h[0])));
    store_scaled(&m[0][0], _mm256_cvtepu8_epi32(mn), _mm256_cvtepu8_epi32(_mm_srli_si128(mn, 8)),
                 _mm256_set1_ps(half(h[1])), -0.f);   // m = -(dmin mn)
  } else {   // Q3_K
    std::memcpy(h, b + 108, 2);
    const __m128i v = q3k_scales_sse(b + 96);
    const __m256i k32 = _mm256_set1_epi32(32);
    store_scaled(&d[0][0], _mm256_sub_epi32(_mm256_cvtepi8_epi32(v), k32),
                 _mm256_sub_epi32(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)), k32), _mm256_set1_ps(half(h[0])));
    store_zeros(&m[0][0]);
  }
}

// The eight 6-bit scales (s[0..1]) or minimums (s[2..3]) of a Q4_K or Q5_K
// super-block, four bytes a word, unpacked as ggml does from its three words.
inline void k4_fields(const uint8_t* b, uint32_t s[4]) {
  uint32_t u[3];
  std::memcpy(u, b + 4, 12);
  constexpr uint32_t k6 = 0x3f3f3f3f, k4 = 0x0f0f0f0f, k2 = 0x03030303;
  s[0] = u[0] & k6;                                      // scales 0..3
  s[1] = (u[2] & k4) | (((u[0] >> 6) & k2) << 4);        // scales 4..7
  s[2] = u[1] & k6;                                      // minimums 0..3
  s[3] = ((u[2] >> 4) & k4) | (((u[1] >> 6) & k2) << 4); // minimums 4..7
}

// Eight bytes (one per chunk) times a super-block's fp16 factor at p, as floats;
// with flip = -0.f negated after the product (-(factor v)).
template <class Half>
AVX2 inline __m256 scaled_bytes(const uint32_t s[2], const uint8_t* p, Half half, float flip = 0.f) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s))));
  return _mm256_xor_ps(_mm256_mul_ps(_mm256_set1_ps(half(h)), v), _mm256_set1_ps(flip));
}

// Q4_K and Q5_K: a super-block's eight chunk scales and minimums
// (superblock_scales' values, bit for bit: d = dd sc, m = -(dmin mn)) by
// vectors: the 6-bit fields unpacked as ggml does (three 32-bit words), then
// converted, multiplied and stored eight at a time. The scalar unpacking had
// cost 3.7 cycles per 32-value chunk of the one-token Q4_K loop's 15.
template <class Half>
AVX2 inline void k4_superblock_scales(const uint8_t* b, float d[8][2], float m[8][2], Half half) {
  uint32_t s[4];
  k4_fields(b, s);
  store_twice(&d[0][0], scaled_bytes(s, b, half));
  store_twice(&m[0][0], scaled_bytes(s + 2, b + 2, half, -0.f));   // m = -(dmin mn)
}

// Q4_K and Q5_K: a super-block's eight minimums alone, chunk j in lane j
// (k4_superblock_scales' values).
template <class Half>
AVX2 inline __m256 k4_minimums(const uint8_t* b, Half half) {
  uint32_t s[4];
  k4_fields(b, s);
  return scaled_bytes(s + 2, b + 2, half, -0.f);
}

// fp16 bits to a float by F16C, for the scale helpers' Half parameter. An
// object, not a function: passed as a pointer to a function, the conversion
// inlined only where GCC first inlined the helper into the caller; a
// pointer to an AVX-512 function (a target the AVX2 helpers lack) stayed a
// call out of line, one or two a Q2_K or Q3_K super-block. The object's call
// inlines wherever the helper does (the same bits).
struct HalfX86 {
  AVX2 float operator()(uint16_t h) const { return _cvtsh_ss(h); }
};
constexpr HalfX86 half_x86{};

// One token, eight consecutive chunks from c0 on (mv0, mv1: their halves'
// minimums, chunk j in lane j): their minimums' terms, lane j chunk j's
// scalar expression, (m0 s0 + m1 s1) d, in its own steps.
AVX2 inline __m256 eight_min_terms(__m256 mv0, __m256 mv1, const I16Acts& a, size_t c0) {
  const __m256 lo = _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.s + 2 * c0)));
  const __m256 hi = _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.s + 2 * c0 + 8)));
  const __m256 s0 = in_token_order(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)));
  const __m256 s1 = in_token_order(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm256_mul_ps(_mm256_add_ps(_mm256_mul_ps(mv0, s0), _mm256_mul_ps(mv1, s1)), _mm256_loadu_ps(a.d + c0));
}

// The halves' minimums equal (mv0 = mv1 = mv).
AVX2 inline __m256 eight_min_terms(__m256 mv, const I16Acts& a, size_t c0) { return eight_min_terms(mv, mv, a, c0); }

// The minimums' terms of one chunk (m: its halves' minimums; a: the tile's
// activations from the chunk on) for each of a tile's TT tokens, added into
// accm[t]: (m0 s0 + m1 s1) d, one token at a time, or a full tile (8
// tokens) at once, lane t the scalar expression's own steps (the same
// bits): the tokens' half sums come interleaved (t0 h0, t0 h1, t1 h0, ..),
// split into two vectors.
template <int TT>
AVX2 inline void add_tile_min_terms(const float m[2], const I16Acts& a, float* accm) {
  if constexpr (TT != 8) {
    GD_EACH_TOKEN
    for (int t = 0; t < TT; ++t) accm[t] += (m[0] * float(a.s[2 * t]) + m[1] * float(a.s[2 * t + 1])) * a.d[t];
    return;
  }
  const __m256 lo = _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.s)));
  const __m256 hi = _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.s + 8)));
  const __m256 s0 = in_token_order(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)));
  const __m256 s1 = in_token_order(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1)));
  const __m256 terms = _mm256_mul_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(m[0]), s0),
                                                   _mm256_mul_ps(_mm256_set1_ps(m[1]), s1)),
                                     _mm256_loadu_ps(a.d));
  _mm256_storeu_ps(accm, _mm256_add_ps(_mm256_loadu_ps(accm), terms));
}

// IQ4_XS: a super-block's eight scales (superblock_scales' values, bit for
// bit: d = dd (ls - 32), ls the 4 low bits of scales_l's nibble j and the 2
// high bits of scales_h's pair j) by vectors, no minimums. The scalar form
// had called the fp16 conversion once a chunk, out of line (the generic
// template cannot inline an AVX2 function): in the L1, one token 8.5 -> 7.1
// cycles a chunk, 8 tokens 1.16x (AMD EPYC Zen 3).
template <class Half>
AVX2 inline void iq4xs_superblock_scales(const uint8_t* b, float d[8][2], float m[8][2], Half half) {
  uint16_t dd, sh;
  uint32_t sl;
  std::memcpy(&dd, b, 2);
  std::memcpy(&sh, b + 2, 2);
  std::memcpy(&sl, b + 4, 4);
  const __m256i low = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(sl)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                       _mm256_set1_epi32(0xF));
  const __m256i high = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(sh), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                        _mm256_set1_epi32(3));
  const __m256i ls = _mm256_or_si256(low, _mm256_slli_epi32(high, 4));
  store_twice(&d[0][0], _mm256_mul_ps(_mm256_set1_ps(half(dd)), _mm256_cvtepi32_ps(_mm256_sub_epi32(ls, _mm256_set1_epi32(32)))));
  store_zeros(&m[0][0]);
}

// A super-block's scales and minimums for the AVX2 kernels: the formats
// above by vectors.
template <Format F, class Half>
AVX2 inline void superblock_scales_avx2(const uint8_t* b, float d[8][2], float m[8][2], Half half) {
  if constexpr (F == Format::Q4_K || F == Format::Q5_K) k4_superblock_scales(b, d, m, half);
  else if constexpr (F == Format::Q6_K) q6k_superblock_scales(b, d, m, half);
  else if constexpr (F == Format::Q2_K || F == Format::Q3_K) k23_superblock_scales(F, b, d, m, half);
  else if constexpr (F == Format::IQ4_XS) iq4xs_superblock_scales(b, d, m, half);
  else superblock_scales(F, b, d, m, half);
}

}  // namespace x86
}  // namespace gd
#endif
