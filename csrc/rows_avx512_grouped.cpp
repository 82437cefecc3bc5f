// AVX-512's grouped rows (matmul.h's grouped_acts; see rows_avx512.cpp for
// the path and its order of the float steps): eight blocks per vector by vpdpwssd
// (rows_grouped), and at decode's few tokens vpdpbusd on the activations'
// bytes (row_split).
#include "rows_avx512_nibbles.h"
#if defined(__x86_64__) || defined(__i386__)

namespace gd {
namespace {

using namespace x86;

// A tile's grouped activations from one group on (q: 256 int16 per token,
// e, d: eight blocks' scales per token; sd, the formats with minimums':
// eight blocks' sums times their d per token, else null).
struct GroupActs {
  const int16_t* q;
  const int32_t* e;
  const float* d;
  const float* sd;
  GroupActs at(size_t groups, size_t tile) const {
    return {q + 32 * kGroup * groups * tile, e + kGroup * groups * tile, d + kGroup * groups * tile,
            sd ? sd + kGroup * groups * tile : sd};
  }
};

// A group's minimums' terms for one token, after its products (sd: the
// token's eight blocks' sums times their d): m s d, one FMA into the lanes
// of the products' FMA, in that order in every form.
AVX512_INLINE __m512 add_min_terms(__m512 acc, __m512 mw, const float* sd) {
  const __m512i each2 = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  return _mm512_fmadd_ps(mw, _mm512_permutexvar_ps(each2, _mm512_castps256_ps512(_mm256_loadu_ps(sd))), acc);
}

// One group (blocks of it: 8, or fewer for a row's last) of R rows (1 or 2)
// against TT tokens, into one accumulator per token for both rows (lane 2p
// row 0's block p of every group so far, 2p + 1 row 1's): the group's
// activations loaded once for both rows, and a pair's sixteen accumulators
// of 8 tokens halved to eight, which stay in registers (GCC had kept ten
// of sixteen on the stack, a load and a store per add). MXFP4 scales a
// token's block sums by vscalefps (mxfp4_group); Q8_0 multiplies the
// weights' fp16 scales by the activations' 2^-k and adds the sums times
// that by one FMA (the formats with minimums then their terms by a second).
template <Format F, int R, int TT>
AVX512 inline void group_rows(const uint8_t* const blks[R], int blocks, const GroupActs& a, const Mxfp4Consts& c,
                              __m512 (&acc)[TT]) {
  __m512i w[R][8], ew[R];
  __m512 dw[R], mw[R];
  for (int r = 0; r < R; ++r) {
    if constexpr (F == Format::MXFP4) mxfp4_group(blks[r], blocks, c, w[r], ew[r]);
    else int8_group<F>(blks[r], blocks, w[r], dw[r], mw[r]);
  }
  // (each block's scale in its two lanes: the pair's are row 0's in the
  // even lanes, row 1's in the odd ones)
  __m512i ewp = ew[0];
  __m512 dwp = dw[0], mwp = mw[0];
  if constexpr (R == 2) {
    if constexpr (F == Format::MXFP4) ewp = interleave_rows(ew[0], ew[1]);
    else dwp = interleave_rows(dw[0], dw[1]);
    if constexpr (has_min(F)) mwp = interleave_rows(mw[0], mw[1]);
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
      if constexpr (has_min(F)) acc[t] = add_min_terms(acc[t], mwp, a.sd + kGroup * t);
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
  constexpr size_t gb = kGroup * block_bytes(F) / (block_values(F) / kBlock);   // a group's bytes (a K-quant's: one block)
  const Mxfp4Consts c = mxfp4_consts();
  __m512 acc[TT];
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) acc[t] = _mm512_setzero_ps();
  for (size_t g = 0, off = 0; g < n_chunks; g += kGroup, off += gb, a = a.at(1, tile)) {
    const uint8_t* blks[R];
    for (int r = 0; r < R; ++r) blks[r] = rows[r] + off;
    if constexpr (R == 1 && TT <= 2)   // decode streams the row
      prefetch_run(blks[0], gb);
    group_rows<F, R, TT>(blks, int(std::min(kGroup, n_chunks - g)), a, c, acc);
  }
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) {
    float odd;   // (R = 1: the same sum again)
    hsum_rows(acc[t], out[0][t], R == 2 ? out[1][t] : odd);
  }
}

// The byte-coded formats (byte_codes) at up to 3 tokens by vpdpbusd, from
// the activations' split form (SplitGroup), against the codes' low bytes
// (unsigned) and their high bytes (signed); 256 times the second sum plus
// the first is the exact sum of the same sixteen products as group_sums'
// lane, so a row's sums are the same bits as rows_grouped<F, 1, TT>'s.
// vpdpbusd takes one side unsigned: MXFP4's values plus 12 (0..24, as valid
// an unsigned byte as a signed one) against both, less 12 times the lane's
// codes; the other unsigned codes (rows_avx512_nibbles.h) likewise, less
// their offset times the lane's codes; the signed ones (Q8_0's, IQ4's table
// values) as they are against the low bytes and plus 128 (each byte's top
// bit flipped) against the high ones, less 128 times the high bytes' sum.
// Each sum starts from its offset's share. MXFP4's lanes hold the products once,
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
AVX512 inline void row_split(const uint8_t* const rows[R], size_t n_chunks, const SplitGroup* a, const float* sd,
                             float out[2][kTokenTile]) {
  constexpr size_t gb = kGroup * block_bytes(F) / (block_values(F) / kBlock);   // a group's bytes (a K-quant's: one block)
  const Mxfp4Consts c = mxfp4_consts();
  const __m512i table = _mm512_add_epi8(c.table, _mm512_set1_epi8(12));
  __m512 acc[TT];
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) acc[t] = _mm512_setzero_ps();
  // MXFP4 unpacks the next group's codes (nw, new_: its values and scale
  // bytes) before this group's products, a software pipeline one group
  // deep: the unpacking's shuffles, which wait on the loads, then overlap
  // the products, and the products of a group whose lines came late overlap
  // the next group's loads (from memory at one token 1.07-1.16x, 2880 and
  // 5760 rows; in the L3 1.03-1.05x; the 20b's decode 1.01-1.03x in four
  // pairs; Intel Xeon with AMX, 2 threads). Q8_0's codes so: 1.00x.
  __m512i nw[R][4], new_[R];
  if constexpr (F == Format::MXFP4)
    for (int r = 0; r < R; ++r) mxfp4_values(rows[r], int(std::min(kGroup, n_chunks)), c, table, nw[r], new_[r]);
  for (size_t g = 0, off = 0; g < n_chunks; g += kGroup, off += gb, a += TT, sd = sd ? sd + kGroup * TT : sd) {
    const int blocks = int(std::min(kGroup, n_chunks - g));   // (a tail group: zero codes, zero activations)
    __m512i w[R][4], wu[R][4], ew[R];   // the values as the low bytes' and the high bytes' partners
    __m512 dw[R], mw[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = rows[r] + off;
      if constexpr (F != Format::MXFP4) {
        // Q8_0's one row: each line once at each distance, the lines
        // whose start falls in the group's bytes (a prefetch per 64 of
        // them asked for most lines twice at once, a group apart: from
        // memory at one token 1.05-1.08x, 512 to 4096 rows, Intel Xeon with
        // AMX, 2 threads; kPrefetchRetry asks again 1.5 KB later, which
        // does help). MXFP4's row pairs keep their prefetch per 64 bytes:
        // each line once measured 0.91x.
        const uintptr_t a = reinterpret_cast<uintptr_t>(blk);
        for (uintptr_t l = (a + 63) & ~uintptr_t(63); l < a + gb; l += 64) {
          __builtin_prefetch(reinterpret_cast<const void*>(l + kPrefetchAhead), 0, 3);
          __builtin_prefetch(reinterpret_cast<const void*>(l + kPrefetchRetry), 0, 3);
          __builtin_prefetch(reinterpret_cast<const void*>(l + kPrefetchFar), 0, 2);
        }
      } else {
        for (size_t b = 0; b < gb; b += 64) {
          __builtin_prefetch(blk + kPrefetchAhead + b, 0, 3);
          __builtin_prefetch(blk + kPrefetchRetry + b, 0, 3);
          __builtin_prefetch(blk + kPrefetchFar + b, 0, 2);
        }
      }
      if constexpr (F == Format::MXFP4) {
        for (int v = 0; v < 4; ++v) w[r][v] = nw[r][v];
        ew[r] = new_[r];
        if (g + kGroup < n_chunks)
          mxfp4_values(blk + gb, int(std::min(kGroup, n_chunks - g - kGroup)), c, table, nw[r], new_[r]);
        for (int v = 0; v < 4; ++v) wu[r][v] = w[r][v];
      } else {
        if constexpr (!signed_codes(F)) {   // (unsigned codes: both sides)
          int8_codes<F, false>(blk, blocks, w[r], dw[r], mw[r]);
          for (int v = 0; v < 4; ++v) wu[r][v] = w[r][v];
        } else {
          if constexpr (F != Format::Q8_0) int8_codes<F, true>(blk, blocks, w[r], dw[r], mw[r]);
          else if (g + kGroup < n_chunks) q8_codes<true>(blk, blocks, w[r], dw[r]);
          else q8_codes<false>(blk, blocks, w[r], dw[r]);
          for (int v = 0; v < 4; ++v) wu[r][v] = _mm512_xor_si512(w[r][v], _mm512_set1_epi8(int8_t(0x80)));
        }
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
        if constexpr (has_min(F))
          acc[t] = add_min_terms(acc[t], R == 2 ? interleave_rows(mw[0], mw[R - 1]) : mw[0], sd + kGroup * t);
      }
    }
  }
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) {
    float odd;   // (R = 1: the same sum again)
    hsum_rows(acc[t], out[0][t], R == 2 ? out[1][t] : odd);
  }
}

}  // namespace

#ifndef GD_VBMI   // (once: in this file's form without VBMI, which every AVX-512 CPU runs)
// Per group: code vectors 2v and 2v + 1 of the grouped form (32 int16
// each) give the split form's vector v, their low bytes interleaved into
// lo (byte 2j of lo: vector 2v's code j, byte 2j + 1: vector 2v + 1's) and
// their high bytes into hi, word by word by a mask, a shift and an or; lane
// l's sums by vpmaddwd against ones (codes 2l and 2l + 1 of each vector).
AVX512 void split_acts_avx512(Format f, const int16_t* q, const float* d, const int32_t* e, size_t groups,
                              SplitGroup* out) {
  const __m512i low = _mm512_set1_epi16(0x00FF), high = _mm512_set1_epi16(int16_t(0xFF00));
  const __m512i ones = _mm512_set1_epi16(1);
  const __m512i each2 = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  for (size_t g = 0; g < groups; ++g, q += kGroup * 32, d += kGroup, e += kGroup) {
    SplitGroup& s = out[g];
    __m512i sum = _mm512_setzero_si512(), sum_hi = _mm512_setzero_si512();
    for (int v = 0; v < 4; ++v) {
      const __m512i a = _mm512_loadu_si512(q + 64 * v), b = _mm512_loadu_si512(q + 64 * v + 32);
      _mm512_store_si512(s.lo[v], _mm512_or_si512(_mm512_and_si512(a, low), _mm512_slli_epi16(b, 8)));
      _mm512_store_si512(s.hi[v], _mm512_or_si512(_mm512_srli_epi16(a, 8), _mm512_and_si512(b, high)));
      sum = _mm512_add_epi32(sum, _mm512_add_epi32(_mm512_madd_epi16(a, ones), _mm512_madd_epi16(b, ones)));
      sum_hi = _mm512_add_epi32(sum_hi, _mm512_add_epi32(_mm512_madd_epi16(_mm512_srai_epi16(a, 8), ones),
                                                         _mm512_madd_epi16(_mm512_srai_epi16(b, 8), ones)));
    }
    if (!signed_codes(f)) {   // (the formats with minimums: their codes are their values, offset 0)
      const int offset = f == Format::MXFP4 ? 12 : f == Format::Q4_0 || f == Format::Q5_0 ? nibble_offset(f) : 0;
      _mm512_store_si512(s.c, _mm512_mullo_epi32(sum, _mm512_set1_epi32(-offset)));
    }
    if (f == Format::MXFP4) {
      const __m256i e8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(e));
      const __m512i ev = _mm512_permutexvar_epi32(each2, _mm512_castsi256_si512(e8));
      _mm512_store_si512(s.e, _mm512_add_epi32(ev, _mm512_set1_epi32(8)));
    } else {
      if (signed_codes(f)) _mm512_store_si512(s.c, _mm512_slli_epi32(_mm512_sub_epi32(_mm512_setzero_si512(), sum_hi), 15));
      _mm512_store_ps(s.d, _mm512_permutexvar_ps(each2, _mm512_castps256_ps512(_mm256_loadu_ps(d))));
    }
  }
}
#endif

namespace {

// One format's rows [n0, n1) (rows_avx512_grouped's contract), a function
// of its own per format.
template <Format F>
__attribute__((noinline)) AVX512 void grouped_rows(const uint8_t* W, size_t n0, size_t n1, size_t K,
                                                   const I16Acts& a, size_t T, float* Y, size_t ldy,
                                                   const float* bias) {
  const size_t nc = K / 32, nbp = grouped_blocks(nc), rb = row_bytes(F, K);
  // Rows in pairs where a pair shares each group's activations. The
  // grouped form pairs from 4 tokens on (with eight blocks per group one
  // row's weights fill eight registers, and one row against 8 tokens
  // measured 0.70x of a pair on AMD Zen 4); below that its rows stream
  // from memory alone (two interleaved streams had prefetched worse: MXFP4
  // four blocks per group 0.82x). Decode's split form (T <= kSplitTokens:
  // one tile) pairs MXFP4's rows, whose loads set the pace, and keeps the
  // others' alone (row_split; Q4_0's and Q5_0's in pairs 0.85-0.96x at one
  // and two tokens, Intel Xeon with AMX).
  const size_t pair = a.split ? (F == Format::MXFP4 ? 2 : 1) : (T >= 4 ? 2 : 1);
  float out[2][kTokenTile];
  for (size_t t0 = 0; t0 < T; t0 += kTokenTile) {
    const size_t tt = std::min(kTokenTile, T - t0);
    const GroupActs ga{a.q + t0 * nbp * 32, a.e + t0 * nbp, a.d + t0 * nbp, a.sd ? a.sd + t0 * nbp : a.sd};
    for (size_t n = n0; n < n1; n += pair) {
      const size_t R = std::min(pair, n1 - n);
      const uint8_t* rows[2] = {W + n * rb, W + (n + R - 1) * rb};
      with_tile(tt, [&](auto TT) {
        constexpr int tt_ = decltype(TT)::value;
        if (a.split) {
          if constexpr (tt_ <= kSplitTokens && byte_codes(F)) {
            if (R == 1) row_split<F, 1, tt_>(rows, nc, a.split, a.sd, out);
            else if constexpr (F == Format::MXFP4) row_split<F, 2, tt_>(rows, nc, a.split, a.sd, out);
          }
        } else if (R == 2) {
          rows_grouped<F, 2, tt_>(rows, nc, ga, tt, out);
        } else {
          rows_grouped<F, 1, tt_>(rows, nc, ga, tt, out);
        }
      });
      for (size_t r = 0; r < R; ++r)
        for (size_t t = 0; t < tt; ++t) Y[(t0 + t) * ldy + n + r] = out[r][t] + (bias ? bias[n + r] : 0.f);
    }
  }
}

}  // namespace

#ifdef GD_VBMI
void rows_avx512_grouped_vbmi(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const I16Acts& a,
                              size_t T, float* Y, size_t ldy, const float* bias) {
#else
void rows_avx512_grouped_bw(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const I16Acts& a, size_t T,
                            float* Y, size_t ldy, const float* bias) {
#endif
  switch (f) {
    case Format::MXFP4: return grouped_rows<Format::MXFP4>(W, n0, n1, K, a, T, Y, ldy, bias);
    case Format::Q8_0: return grouped_rows<Format::Q8_0>(W, n0, n1, K, a, T, Y, ldy, bias);
    case Format::Q4_0: return grouped_rows<Format::Q4_0>(W, n0, n1, K, a, T, Y, ldy, bias);
    case Format::Q4_1: return grouped_rows<Format::Q4_1>(W, n0, n1, K, a, T, Y, ldy, bias);
    case Format::Q5_1: return grouped_rows<Format::Q5_1>(W, n0, n1, K, a, T, Y, ldy, bias);
    case Format::Q4_K: return grouped_rows<Format::Q4_K>(W, n0, n1, K, a, T, Y, ldy, bias);
    case Format::Q5_K: return grouped_rows<Format::Q5_K>(W, n0, n1, K, a, T, Y, ldy, bias);
    case Format::IQ4_NL: return grouped_rows<Format::IQ4_NL>(W, n0, n1, K, a, T, Y, ldy, bias);
    case Format::IQ4_XS: return grouped_rows<Format::IQ4_XS>(W, n0, n1, K, a, T, Y, ldy, bias);
    case Format::Q6_K: return grouped_rows<Format::Q6_K>(W, n0, n1, K, a, T, Y, ldy, bias);
    default: return grouped_rows<Format::Q5_0>(W, n0, n1, K, a, T, Y, ldy, bias);   // (grouped_acts: no other)
  }
}

}  // namespace gd
#endif
