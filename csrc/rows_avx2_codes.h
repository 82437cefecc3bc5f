// Internal to rows_avx2_i16.cpp (through rows_avx2_mxfp4.h): the int16
// rows' shared steps in AVX2: a block's codes as int16 (load_codes), a
// chunk's exact sums for one token (block_sums) and their scales.
#pragma once
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "formats.h"
#include "rows.h"
#include "rows_x86.h"
#include "vecmath.h"

namespace gd {
namespace {

using namespace x86;

// An MXFP4 block's 32 codes through the value table as int8, in one 256-bit
// shuffle: the low nibbles (codes 0..15) index the table in the first
// half, the high ones (codes 16..31) in the second (nibbles16's 256-bit
// form). (Cores that split 256-bit operations run rows_avx2_halves.h's.)
AVX2 inline __m256i mxfp4_codes8(const uint8_t* blk) {
  return _mm256_shuffle_epi8(mxfp4_values256(), nibbles16(blk + 1));
}

// The 32 weight codes of a chunk as two vectors of 16 int16 that multiply
// the first and the second 16 activations of the block's I16 form. Small
// codes (small_codes: all but Q8_0's and IQ4's): codes 0, 2, .., 30 and 1,
// 3, .., 31 (the activations are in that order, see act_slot), each times
// 256: a 16-bit lane's low byte shifted up is the even code times 256, its
// high byte masked is the odd code times 256 (a shift and an and, where the
// sign-extending widening of both 128-bit halves took an extract and two
// cross-lane conversions: one token Q5_0 10.3 -> 8.2, Q4_K 12.5 -> 10.4
// cycles per chunk, AMD EPYC Zen 2). The factor 256 is exact all the way (a
// lane sums 4 products below 2^30; a float of 256 s is 256 times the float
// of s): the row's sum divides it out at the end (kMxfp4Scale for MXFP4).
// MXFP4's codes come from its value table (mxfp4_codes8). Q8_0 and IQ4:
// codes 0..15 and 16..31, widened from bytes.
template <Format F, bool Narrow = false>
AVX2 inline void load_codes(const uint8_t* blk, int sub, __m256i& first, __m256i& second) {
  if constexpr (F == Format::Q8_0) {
    first = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2)));
    second = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18)));
  } else if constexpr (small_codes(F)) {
    const __m256i v = F == Format::MXFP4 ? mxfp4_codes8(blk) : codes8<F, Narrow>(blk, sub);
    first = _mm256_slli_epi16(v, 8);                                        // even codes x 256
    second = _mm256_and_si256(v, _mm256_set1_epi16(int16_t(0xFF00)));       // odd codes x 256
  } else {
    const __m256i v = codes8<F, Narrow>(blk, sub);
    first = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v));
    second = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1));
  }
}

// What the rows' sums of a format carry beyond the true sum: small codes
// enter the products times 256 (load_codes). Dividing by a power of two is
// exact (short of the float range's ends).
template <Format F>
constexpr float codes_factor_inverse() { return small_codes(F) ? 1.f / 256.f : 1.f; }

// A token's accumulator: 8 lanes, or 4 in the halves' form (rows_avx2_halves.h).
// (Not std::conditional_t: a vector type as a template argument loses its
// attributes, which GCC warns of.)
template <bool Narrow>
struct Acc {
  using type = __m256;
};
template <>
struct Acc<true> {
  using type = __m128;
};
template <bool Narrow>
using AccOf = typename Acc<Narrow>::type;

// A chunk's sums for one token as floats (qt: its 32 activations): each
// lane the exact int32 sum of four products (codes as load_codes gives them).
AVX2 inline __m256 block_sums(__m256i first, __m256i second, const int16_t* qt) {
  const __m256i s0 = _mm256_madd_epi16(first, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qt)));
  const __m256i s1 = _mm256_madd_epi16(second, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qt + 16)));
  return _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1));
}

// A chunk's scale for block_sums' lanes (h0, h1: its halves' scales): with
// small codes in load_codes' even/odd order, lanes 0..3 sum the first half's
// products and 4..7 the second's, so a format whose halves differ blends the
// two.
template <Format F>
AVX2 inline __m256 lane_scales(const float* h0, const float* h1) {
  if constexpr (halves_differ(F)) {
    static_assert(small_codes(F), "the halves' lanes assume load_codes' even/odd order");
    return _mm256_blend_ps(_mm256_broadcast_ss(h0), _mm256_broadcast_ss(h1), 0xF0);
  } else {
    return _mm256_broadcast_ss(h0);
  }
}

}  // namespace
}  // namespace gd
#endif
