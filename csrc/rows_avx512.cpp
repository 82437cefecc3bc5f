// The int16 row products in AVX-512 (F, BW, VL, VNNI, VBMI: Ice Lake and
// later Xeons, AMD Zen 4 and 5): a chunk's 32 weight codes are one register
// of 32 int16, its 32 activations another, and one vpmaddwd makes the
// chunk's 16 exact pair sums; MXFP4 and Q8_0 take four blocks per
// register and vpdpwssd (row_grouped below). The plain-float rows (fp32
// activations) are AVX2's (rows_avx2.cpp): they are not this path's hot
// kernels. See rows.h for the contract.
//
// Order of the float steps: per token, 16 lanes; lane l of a chunk is the
// exact int32 sum of products 2l and 2l + 1 of the chunk's I16 form, scaled
// (a format whose two halves have their own scales: lanes 0..7 by the first,
// 8..15 by the second) and added into lane l of one of the token's two
// accumulators, even chunks into the first, odd ones into the second; at
// the row's end the two are added, their 16 lanes summed by one fixed
// reduction and the minimums' terms added (MXFP4 and Q8_0: lane l of block
// k holds eight products' exact sum, see group_rows). A token's sums are formed the
// same way alone or in a tile (batch invariance), within the int16 bound of
// the reference, but not its bits: the reference sums a chunk before
// scaling it.
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
// activations (MXFP4 and Q8_0 run row_grouped below).
template <Format F>
AVX512 inline __m512i codes16(const uint8_t* blk, int sub) {
  static_assert(F != Format::MXFP4, "MXFP4 runs row_grouped");
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

// MXFP4, four blocks per vector (the activations grouped: ActView's grouped
// form). A group's 64 code bytes, one block per 128-bit lane (vpermt2b from
// the group's 68 bytes), their low and high nibbles looked up as int8
// values (vpermb) and made int16 times 256 by a shift or a mask (lane k of
// the four vectors holds block k's even values 0..14, odd 1..15, even
// 16..30, odd 17..31: grouped_slot's order), four vpdpwssd per token into
// one int32 vector: lane l of block k the exact sum of eight of its
// products (|sum| < 2^30). Then one conversion (exact: 256 times an integer
// below 2^22) and the group's four
// scales at once: vscalefps by e + ActView::e (kMxfp4Scale's exponent: the
// grouped form's e holds kGroupedScaleBias - k; the scale bytes picked from
// the group by one vpermb), the
// result added into one of the token's two accumulators (even groups, odd
// groups). Per block and token that is one multiply-add instruction where
// the block-per-vector loop spent a vpmaddwd, a vpermw and an FMA, the
// three sharing two ports (AMD EPYC Zen 5: measured). Needs AVX-512 VNNI
// and VBMI, which cpu_has_avx512 asks for.
struct Mxfp4Consts {
  __m512i pick, scales, table, zero;
};

// Block k's codes from the group's first load (bytes 17k + 1 ..) or, for
// block 3, the second (which starts 4 bytes on: bytes 64 + 48 ..); the
// scale bytes (17k: only each dword's low byte is kept).
struct Mxfp4Picks {
  alignas(64) uint8_t pick[64], scales[64];
};
constexpr Mxfp4Picks mxfp4_picks() {
  Mxfp4Picks p{};
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 16; ++j) {
      p.pick[16 * k + j] = uint8_t(k < 3 ? 17 * k + 1 + j : 64 + 48 + j);
      p.scales[16 * k + j] = uint8_t(17 * k);
    }
  return p;
}
static constexpr Mxfp4Picks kMxfp4Picks = mxfp4_picks();

AVX512 inline Mxfp4Consts mxfp4_consts() {
  return {_mm512_load_si512(kMxfp4Picks.pick), _mm512_load_si512(kMxfp4Picks.scales),
          _mm512_broadcast_i32x4(_mm256_castsi256_si128(mxfp4_values256())), _mm512_setzero_si512()};
}

// A group's four blocks' int16 values (w[0..3]) and scale bytes e (each
// block's in its four lanes), from its 68 bytes; a tail group of
// `blocks` < 4 reads only its own bytes (the rest as zeros: zero codes).
AVX512 inline void mxfp4_group(const uint8_t* blk, int blocks, const Mxfp4Consts& c, __m512i w[4], __m512i& ew) {
  __m512i a, b;
  if (blocks == 4) {
    a = _mm512_loadu_si512(blk), b = _mm512_loadu_si512(blk + 4);
  } else {   // masked loads (a copy to a zeroed buffer stalled the loads on the stores: 0.87x)
    const int n = 17 * blocks;
    a = _mm512_maskz_loadu_epi8(~__mmask64(0) >> (64 - n), blk);
    b = _mm512_maskz_loadu_epi8(~__mmask64(0) >> (64 - (n - 4)), blk + 4);
  }
  const __m512i q = _mm512_permutex2var_epi8(a, c.pick, b);
  // vpermb reads an index's low six bits and the table holds the 16 values
  // four times: each byte's low nibble, and after the word shift its high
  // one, pick their values without masking off the bits above
  const __m512i lo = _mm512_permutexvar_epi8(q, c.table);
  const __m512i hi = _mm512_permutexvar_epi8(_mm512_srli_epi16(q, 4), c.table);
  // each word's values as int16 times 256: its low byte's shifted up, its
  // high byte's with the low byte cleared (shifts and masks, where
  // interleaving with zeros took four shuffles)
  const __m512i high = _mm512_set1_epi16(int16_t(0xFF00));
  w[0] = _mm512_slli_epi16(lo, 8), w[1] = _mm512_and_si512(lo, high);
  w[2] = _mm512_slli_epi16(hi, 8), w[3] = _mm512_and_si512(hi, high);
  ew = _mm512_maskz_permutexvar_epi8(0x1111111111111111ULL, c.scales, a);
}

// Q8_0 in the same grouped form: a group's four 34-byte blocks (136 bytes)
// from four loads, codes 0..15 of each block into its 128-bit lane by one
// vpermt2b and codes 16..31 by another, each byte widened to int16 in place
// (even bytes by two shifts, odd ones by one: the grouped_slot order), and
// the four fp16 scales, each in its block's four lanes, by a third vpermt2b
// and one conversion. Lane l of block k then sums eight products exactly
// (|sum| < 2^25, so the conversion rounds only sums beyond 2^24), as
// MXFP4's; the activations are MXFP4's grouped form.
struct Q8Picks {
  alignas(64) uint8_t lo[64], hi[64], scales[64];
};
constexpr Q8Picks q8_picks() {
  Q8Picks p{};
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 16; ++j) {
      // lo: byte b of the loads from 0 and 64 at index b; hi: of those from 8 and 72 at b - 8
      p.lo[16 * k + j] = uint8_t(34 * k + 2 + j);
      p.hi[16 * k + j] = uint8_t(34 * k + 10 + j);
    }
  for (int l = 0; l < 16; ++l) {   // word l: block l / 4's scale (bytes 34k, 34k + 1)
    p.scales[2 * l] = uint8_t(34 * (l / 4));
    p.scales[2 * l + 1] = uint8_t(34 * (l / 4) + 1);
  }
  return p;
}
static constexpr Q8Picks kQ8Picks = q8_picks();

AVX512 inline __m512i load_bytes(const uint8_t* p, int n) {   // n of the 64 bytes (the rest zeros)
  if (n >= 64) return _mm512_loadu_si512(p);
  return n > 0 ? _mm512_maskz_loadu_epi8(~__mmask64(0) >> (64 - n), p) : _mm512_setzero_si512();
}

AVX512 inline void q8_group(const uint8_t* blk, int blocks, __m512i w[4], __m512& dw) {
  const int n = 34 * blocks;
  const __m512i l0 = load_bytes(blk, n), l1 = load_bytes(blk + 64, n - 64);
  const __m512i m0 = load_bytes(blk + 8, n - 8), m1 = load_bytes(blk + 72, n - 72);
  const __m512i lo = _mm512_permutex2var_epi8(l0, _mm512_load_si512(kQ8Picks.lo), l1);
  const __m512i hi = _mm512_permutex2var_epi8(m0, _mm512_load_si512(kQ8Picks.hi), m1);
  w[0] = _mm512_srai_epi16(_mm512_slli_epi16(lo, 8), 8), w[1] = _mm512_srai_epi16(lo, 8);
  w[2] = _mm512_srai_epi16(_mm512_slli_epi16(hi, 8), 8), w[3] = _mm512_srai_epi16(hi, 8);
  const __m512i h = _mm512_permutex2var_epi8(l0, _mm512_load_si512(kQ8Picks.scales), l1);
  dw = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
}

// A group's four vpdpwssd for one row and token, converted (exact below 2^24).
AVX512 inline __m512 group_sums(const __m512i w[4], const __m512i av[4], __m512i zero) {
  __m512i s = _mm512_dpwssd_epi32(zero, w[0], av[0]);
  s = _mm512_dpwssd_epi32(s, w[1], av[1]);
  s = _mm512_dpwssd_epi32(s, w[2], av[2]);
  return _mm512_cvtepi32_ps(_mm512_dpwssd_epi32(s, w[3], av[3]));
}

// A tile's grouped activations from one group on (q: 128 int16 per token,
// e, d: four blocks' scales per token).
struct GroupActs {
  const int16_t* q;
  const int32_t* e;
  const float* d;
  GroupActs at(size_t groups, size_t tile) const {
    return {q + 128 * groups * tile, e + 4 * groups * tile, d + 4 * groups * tile};
  }
};

// One group (blocks of it: 4, or fewer for a row's last) of R rows (1 or 2)
// against TT tokens, into their accumulators: the group's activations
// loaded once for both rows. MXFP4 scales a token's sums by vscalefps
// (mxfp4_group); Q8_0 multiplies the weights' fp16 scales by the
// activations' 2^-k and adds the sums times that by one FMA. (Named arrays
// of accumulators, one per call: an index chosen at run time put them on
// the stack.)
template <Format F, int R, int TT>
AVX512 inline void group_rows(const uint8_t* const blks[R], int blocks, const GroupActs& a, const Mxfp4Consts& c,
                              __m512 (&acc0)[TT], __m512 (&acc1)[TT]) {   // rows 0 and 1 (R = 1: acc1 unused)
  __m512(*acc[2])[TT] = {&acc0, &acc1};
  static_assert(F == Format::MXFP4 || F == Format::Q8_0);
  __m512i w[R][4], ew[R];
  __m512 dw[R];
  for (int r = 0; r < R; ++r) {
    if constexpr (F == Format::MXFP4) mxfp4_group(blks[r], blocks, c, w[r], ew[r]);
    else q8_group(blks[r], blocks, w[r], dw[r]);
  }
  const __m512i each4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) {
    const int16_t* qt = a.q + 128 * t;
    const __m512i av[4] = {_mm512_loadu_si512(qt), _mm512_loadu_si512(qt + 32), _mm512_loadu_si512(qt + 64),
                           _mm512_loadu_si512(qt + 96)};
    if constexpr (F == Format::MXFP4) {
      const __m512i et = _mm512_permutexvar_epi32(
          each4, _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.e + 4 * t))));
      for (int r = 0; r < R; ++r) {
        const __m512 x = _mm512_scalef_ps(group_sums(w[r], av, c.zero), _mm512_cvtepi32_ps(_mm512_add_epi32(ew[r], et)));
        (*acc[r])[t] = _mm512_add_ps((*acc[r])[t], x);
      }
    } else {
      const __m512 dt = _mm512_permutexvar_ps(each4, _mm512_castps128_ps512(_mm_loadu_ps(a.d + 4 * t)));
      for (int r = 0; r < R; ++r)
        (*acc[r])[t] = _mm512_fmadd_ps(group_sums(w[r], av, c.zero), _mm512_mul_ps(dw[r], dt), (*acc[r])[t]);
    }
  }
}

// One row against TT tokens (a: the tile's grouped activations from the
// row's first group on): a token's even groups into one accumulator, its
// odd ones into another, added at the row's end, whatever the tile.
template <Format F, int TT>
AVX512 inline void row_grouped(const uint8_t* row, size_t n_chunks, GroupActs a, size_t tile, float* out) {
  constexpr size_t gb = 4 * block_bytes(F);   // a group's bytes
  const Mxfp4Consts c = mxfp4_consts();
  __m512 acc0[TT], acc1[TT];
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) acc0[t] = acc1[t] = _mm512_setzero_ps();
  const uint8_t* blk = row;
  size_t g = 0;
  for (; g + 8 <= n_chunks; g += 8, blk += 2 * gb, a = a.at(2, tile)) {
    if constexpr (TT <= 2)   // decode streams the row: two groups a pass
      for (size_t b = 0; b < 2 * gb; b += 64) __builtin_prefetch(blk + kPrefetchAhead + b, 0, 3);
    const uint8_t* first[1] = {blk};
    const uint8_t* second[1] = {blk + gb};
    group_rows<F, 1, TT>(first, 4, a, c, acc0, acc0);
    group_rows<F, 1, TT>(second, 4, a.at(1, tile), c, acc1, acc1);
  }
  if (g < n_chunks) {   // one or two groups left, the last maybe short
    const int blocks = int(std::min<size_t>(4, n_chunks - g));
    const uint8_t* first[1] = {blk};
    const uint8_t* second[1] = {blk + gb};
    group_rows<F, 1, TT>(first, blocks, a, c, acc0, acc0);
    if (g + 4 < n_chunks) group_rows<F, 1, TT>(second, int(n_chunks - g - 4), a.at(1, tile), c, acc1, acc1);
  }
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) out[t] = hsum16(_mm512_add_ps(acc0[t], acc1[t]));
}

// Two rows against TT tokens at once, the same sums as row_grouped's for
// each (its even groups' accumulator, then its odd groups', added at the
// end): the even groups in one pass, the odd ones in a second, so that two
// rows' accumulators fit the registers. Where a product reads its rows
// again for several tiles (they are in the L2 then), each tile's
// activations (46 KB of int16 for 8 tokens of a 2880-wide row) are read
// once for both rows.
template <Format F, int TT>
AVX512 inline void pair_pass(const uint8_t* const rows[2], size_t n_chunks, const GroupActs& a, size_t tile,
                             size_t parity, __m512 (&sums)[2][TT]) {
  constexpr size_t gb = 4 * block_bytes(F);
  const Mxfp4Consts c = mxfp4_consts();
  // (two named arrays: one two-row array, or a memcpy of it, kept it in
  // memory, a store after every add)
  __m512 acc0[TT], acc1[TT];
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) acc0[t] = acc1[t] = _mm512_setzero_ps();
  for (size_t g = 4 * parity; g < n_chunks; g += 8) {
    const uint8_t* blks[2] = {rows[0] + g / 4 * gb, rows[1] + g / 4 * gb};
    group_rows<F, 2, TT>(blks, int(std::min<size_t>(4, n_chunks - g)), a.at(g / 4, tile), c, acc0, acc1);
  }
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) sums[0][t] = acc0[t], sums[1][t] = acc1[t];
}

template <Format F, int TT>
AVX512 inline void row_pair_grouped(const uint8_t* const rows[2], size_t n_chunks, const GroupActs& a, size_t tile,
                                    float out[2][kTokenTile]) {
  __m512 even[2][TT], odd[2][TT];
  pair_pass<F, TT>(rows, n_chunks, a, tile, 0, even);
  pair_pass<F, TT>(rows, n_chunks, a, tile, 1, odd);
  for (int r = 0; r < 2; ++r) {
    GD_EACH_TOKEN
    for (int t = 0; t < TT; ++t) out[r][t] = hsum16(_mm512_add_ps(even[r][t], odd[r][t]));
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

void rows_avx512_i16(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const I16Acts& a, size_t T,
                     float* Y, size_t ldy, const float* bias) {
  if (grouped_acts(f, Impl::Avx512)) {   // MXFP4 and Q8_0: grouped activations (ActView::grouped)
    const size_t nc = K / 32, nbp = grouped_blocks(nc), rb = row_bytes(f, K);
    // Two rows at a time where several tiles read the rows (see
    // row_pair_grouped); a product of fewer tokens streams its rows from
    // memory once, and two interleaved streams prefetched worse (MXFP4: one
    // token 0.82x; 8 tokens 0.78x with one accumulator per token).
    const size_t pair = T >= 2 * kTokenTile ? 2 : 1;
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
            if (R == 2) row_pair_grouped<f_, tt_>(rows, nc, ga, tt, out);
            else row_grouped<f_, tt_>(rows[0], nc, ga, tt, out[0]);
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
