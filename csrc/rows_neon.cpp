// The row products in ARM NEON (AArch64 Advanced SIMD). See rows.h for the
// contract.
//
// int16 activations: bit for bit the portable reference (rows_generic_i16).
// Each chunk's integer sums are exact whatever the instructions (int8 codes
// times int16 activations, widened, multiply-accumulated into int32 lanes,
// then added across), and the float steps after them are the reference's own
// scalar expressions in the reference's order. So this path inherits the
// reference's batch invariance, and the tests compare it for equality.
//
// fp32 activations (plain-float weights, or GOOSEDUMP_ACTIVATIONS=f32): eight
// 4-lane accumulators per token (products k = 0..7 of each block's groups of
// four in accumulator k), summed in a fixed order: the same bits for a token
// alone or in a tile, within the float tolerance of the reference.
#if defined(__aarch64__)
#include <arm_neon.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "formats.h"
#include "matmul.h"
#include "quants.h"
#include "rows.h"

namespace gd {
namespace {

// ---- int16 activations -------------------------------------------------------

inline int8x16_t load_s8(const uint8_t* p) { return vld1q_s8(reinterpret_cast<const int8_t*>(p)); }

// 16 bytes of 4-bit codes: low nibbles (codes 0..15) and high ones (16..31).
inline void nibbles(const uint8_t* qs, uint8x16_t& lo, uint8x16_t& hi) {
  const uint8x16_t x = vld1q_u8(qs);
  lo = vandq_u8(x, vdupq_n_u8(0x0F));
  hi = vshrq_n_u8(x, 4);
}

// 32 bytes' nibbles at `shift` (0: low, 4: high), codes 0..31 of a K-quant chunk.
inline void nibbles32(const uint8_t* qs, int shift, int8x16_t& c0, int8x16_t& c1) {
  const uint8x16_t a = vld1q_u8(qs), b = vld1q_u8(qs + 16), m = vdupq_n_u8(0x0F);
  if (shift) {
    c0 = vreinterpretq_s8_u8(vshrq_n_u8(a, 4));
    c1 = vreinterpretq_s8_u8(vshrq_n_u8(b, 4));
  } else {
    c0 = vreinterpretq_s8_u8(vandq_u8(a, m));
    c1 = vreinterpretq_s8_u8(vandq_u8(b, m));
  }
}

template <Format>
constexpr bool kUnpacked = false;

// Bits 0..15 of x as 16 bytes: 0x10 where the bit is set (Q5_0, Q5_1: the
// codes' fifth bit).
inline uint8x16_t fifth_bits(uint32_t x) {
  const uint8x16_t bytes = vcombine_u8(vdup_n_u8(uint8_t(x)), vdup_n_u8(uint8_t(x >> 8)));
  const uint8x16_t sel = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  return vandq_u8(vtstq_u8(bytes, sel), vdupq_n_u8(0x10));
}

// The 32 int8 codes of chunk `sub` as two vectors that multiply the first
// and the second 16 activations of the block's I16 form: codes 0..15 and
// 16..31, or for MXFP4 the even codes and the odd ones (its activations are
// stored even/odd, act_slot; InOrder: codes 0..15 and 16..31, as the fp32
// rows take them). The same codes as the reference's chunk_codes (the tests
// compare the products bit for bit).
template <Format F, bool InOrder = false>
inline void load_codes(const uint8_t* b, int sub, int8x16_t& c0, int8x16_t& c1) {
  if constexpr (F == Format::Q8_0) {
    c0 = load_s8(b + 2);
    c1 = load_s8(b + 18);
  } else if constexpr (F == Format::MXFP4 || F == Format::IQ4_NL || F == Format::IQ4_XS || F == Format::Q4_0 ||
                       F == Format::Q4_1) {
    uint8x16_t lo, hi;
    nibbles(b + (F == Format::MXFP4 ? 1 : F == Format::Q4_1 ? 4 : F == Format::IQ4_XS ? 8 + 16 * sub : 2), lo, hi);
    if constexpr (F == Format::Q4_0 || F == Format::Q4_1) {
      const int8x16_t off = vdupq_n_s8(F == Format::Q4_0 ? 8 : 0);
      c0 = vsubq_s8(vreinterpretq_s8_u8(lo), off);
      c1 = vsubq_s8(vreinterpretq_s8_u8(hi), off);
    } else {
      const int8x16_t table = vld1q_s8(F == Format::MXFP4 ? kMxfp4Values : kIq4nlValues);
      const int8x16_t v0 = vqtbl1q_s8(table, lo), v1 = vqtbl1q_s8(table, hi);
      if constexpr (F == Format::MXFP4 && !InOrder) {
        c0 = vuzp1q_s8(v0, v1);   // codes 0, 2, .., 30
        c1 = vuzp2q_s8(v0, v1);   // codes 1, 3, .., 31
      } else {
        c0 = v0;
        c1 = v1;
      }
    }
  } else if constexpr (F == Format::Q5_0 || F == Format::Q5_1) {
    constexpr bool one = F == Format::Q5_1;
    uint32_t qh;
    std::memcpy(&qh, b + (one ? 4 : 2), 4);
    uint8x16_t lo, hi;
    nibbles(b + (one ? 8 : 6), lo, hi);
    const int8x16_t off = vdupq_n_s8(one ? 0 : 16);
    c0 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, fifth_bits(qh & 0xFFFF))), off);
    c1 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(hi, fifth_bits(qh >> 16))), off);
  } else if constexpr (F == Format::Q2_K || F == Format::Q3_K) {
    const uint8_t* qs = b + (F == Format::Q2_K ? 16 : 32) + 32 * (sub / 4);
    const int8x16_t sh = vdupq_n_s8(int8_t(-2 * (sub % 4)));
    const uint8x16_t three = vdupq_n_u8(3);
    c0 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(vld1q_u8(qs), sh), three));
    c1 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(vld1q_u8(qs + 16), sh), three));
    if constexpr (F == Format::Q3_K) {   // minus 4 where the high-mask bit is clear
      const uint8x16_t bit = vdupq_n_u8(uint8_t(1u << sub)), four = vdupq_n_u8(4);
      c0 = vsubq_s8(c0, vreinterpretq_s8_u8(vbicq_u8(four, vtstq_u8(vld1q_u8(b), bit))));
      c1 = vsubq_s8(c1, vreinterpretq_s8_u8(vbicq_u8(four, vtstq_u8(vld1q_u8(b + 16), bit))));
    }
  } else if constexpr (F == Format::Q5_K) {
    nibbles32(b + 48 + 32 * (sub / 2), 4 * (sub % 2), c0, c1);
    const uint8x16_t bit = vdupq_n_u8(uint8_t(1u << sub)), k16 = vdupq_n_u8(0x10);
    c0 = vorrq_s8(c0, vreinterpretq_s8_u8(vandq_u8(vtstq_u8(vld1q_u8(b + 16), bit), k16)));
    c1 = vorrq_s8(c1, vreinterpretq_s8_u8(vandq_u8(vtstq_u8(vld1q_u8(b + 32), bit), k16)));
  } else if constexpr (F == Format::Q4_K) {
    nibbles32(b + 16 + 32 * (sub / 2), 4 * (sub % 2), c0, c1);
  } else if constexpr (F == Format::Q6_K) {
    const int h = sub / 4, r = sub % 4;
    int8x16_t l0, l1;
    nibbles32(b + 64 * h + 32 * (r & 1), r >= 2 ? 4 : 0, l0, l1);
    const uint8_t* qh = b + 128 + 32 * h;
    const int8x16_t sh = vdupq_n_s8(int8_t(-2 * r)), three = vdupq_n_s8(3), k32 = vdupq_n_s8(32);
    const int8x16_t h0 = vandq_s8(vreinterpretq_s8_u8(vshlq_u8(vld1q_u8(qh), sh)), three);
    const int8x16_t h1 = vandq_s8(vreinterpretq_s8_u8(vshlq_u8(vld1q_u8(qh + 16), sh)), three);
    c0 = vsubq_s8(vorrq_s8(l0, vshlq_n_s8(h0, 4)), k32);
    c1 = vsubq_s8(vorrq_s8(l1, vshlq_n_s8(h1, 4)), k32);
  } else {
    static_assert(kUnpacked<F>, "a block format without NEON unpacking");
  }
}

// The exact int32 sums of 16 codes times 16 int16 activations.
inline int32_t dot16(int8x16_t c, const int16_t* q) {
  const int16x8_t w0 = vmovl_s8(vget_low_s8(c)), w1 = vmovl_high_s8(c);
  const int16x8_t a0 = vld1q_s16(q), a1 = vld1q_s16(q + 8);
  int32x4_t s = vmull_s16(vget_low_s16(w0), vget_low_s16(a0));
  s = vmlal_high_s16(s, w0, a0);
  s = vmlal_s16(s, vget_low_s16(w1), vget_low_s16(a1));
  s = vmlal_high_s16(s, w1, a1);
  return vaddvq_s32(s);
}

// An fp16 scale by the hardware's conversion (exact, as the reference's
// fp16_to_fp32: a call per block there, a third of the one-token loop's
// instructions for Q8_0). An object, not a function: passed to the scale
// helpers as a pointer to a function (and even called directly) GCC left
// it a call out of line in every block, which also made the loops save
// and reload their vector registers around it.
struct HalfNeon {
  float operator()(uint16_t h) const { return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0); }
};
constexpr HalfNeon half_neon{};

// e8m0_to_fp32_half of every byte, one load instead of its branch-free bit
// arithmetic (tested equal: the products match the reference bit for bit).
struct E8m0Table {
  float v[256];
};
constexpr E8m0Table e8m0_half_table() {
  E8m0Table t{};
  double p = 1.0;
  for (int i = 0; i < 128; ++i) p /= 2;   // 2^-128, exact in a double and (subnormal) in a float
  for (int e = 0; e < 256; ++e, p *= 2) t.v[e] = float(p);
  return t;
}
constexpr E8m0Table kE8m0Half = e8m0_half_table();

// The scales and offsets of chunk `sub` of a block, as the reference finds
// them (the int16 rows' super-blocks take superblock_scales, all eight
// chunks' at once).
template <Format F>
inline void scales(const uint8_t* b, int sub, float d[2], float m[2]) {
  if constexpr (F == Format::MXFP4) {
    d[0] = d[1] = kE8m0Half.v[b[0]];
    m[0] = m[1] = 0.f;
  } else if constexpr (F == Format::Q8_0) {
    uint16_t h;
    std::memcpy(&h, b, 2);
    d[0] = d[1] = half_neon(h);
    m[0] = m[1] = 0.f;
  } else {
    chunk_scales(F, b, sub, d, m, half_neon);
  }
}

// The exact int32 sum of 32 codes (c0: the first 16, c1: the rest) times 32
// int16 activations, for formats whose halves share a scale: one
// accumulator, one sum across lanes.
inline int32_t dot32(int8x16_t c0, int8x16_t c1, const int16_t* q) {
  const int16x8_t w[4] = {vmovl_s8(vget_low_s8(c0)), vmovl_high_s8(c0), vmovl_s8(vget_low_s8(c1)),
                          vmovl_high_s8(c1)};
  int32x4_t s = vdupq_n_s32(0);
  for (int i = 0; i < 4; ++i) {
    const int16x8_t x = vld1q_s16(q + 8 * i);
    s = vmlal_high_s16(vmlal_s16(s, vget_low_s16(w[i]), vget_low_s16(x)), w[i], x);
  }
  return vaddvq_s32(s);
}

// One chunk against TT tokens (a: the tile's activations of the chunk, block
// by block: act_block), the reference's float steps (rows_generic_i16) for
// each token in turn.
template <Format F, int TT>
inline void chunk_i16(const uint8_t* blk, int sub, const float d[2], const float m[2], const I16Acts& a,
                      float* acc, float* accm) {
  int8x16_t c0, c1;
  load_codes<F>(blk, sub, c0, c1);
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) {
    const int16_t* q = a.q + t * 32;
    const float da = a.d[t];
    if constexpr (halves_differ(F)) {
      acc[t] += float(dot16(c0, q)) * (d[0] * da) + float(dot16(c1, q + 16)) * (d[1] * da);
    } else {
      acc[t] += float(dot32(c0, c1, q)) * (d[0] * da);
    }
    if constexpr (has_min(F)) accm[t] += (m[0] * float(a.s[2 * t]) + m[1] * float(a.s[2 * t + 1])) * da;
  }
}

// One row against TT tokens, chunk by chunk; super-blocks unpack their
// scales once for their eight chunks (as the reference's chunk_scales gives
// them: the same products).
template <Format F, int TT>
inline void row_tile_i16(const uint8_t* row, size_t n_chunks, const I16Acts& a, float* out) {
  float acc[TT], accm[TT];
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) acc[t] = accm[t] = 0.f;
  if constexpr (block_values(F) == 256) {
    float d[8][2], m[8][2];
    for (size_t c0 = 0; c0 < n_chunks; c0 += 8) {
      const uint8_t* blk = row + (c0 / 8) * block_bytes(F);
      superblock_scales(F, blk, d, m, half_neon);
      for (int sub = 0; sub < 8; ++sub)
        chunk_i16<F, TT>(blk, sub, d[sub], m[sub], acts_from(a, (c0 + sub) * TT), acc, accm);
    }
  } else {
    float d[2], m[2];
    for (size_t c = 0; c < n_chunks; ++c) {
      const uint8_t* blk = row + c * block_bytes(F);
      scales<F>(blk, 0, d, m);
      chunk_i16<F, TT>(blk, 0, d, m, acts_from(a, c * TT), acc, accm);
    }
  }
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) out[t] = acc[t] + accm[t];
}

// ---- fp32 activations ---------------------------------------------------------

// 32 weights of one block (or of 32 plain floats) as 8 x 4 floats: the plain
// floats converted exactly, block formats dequantized as the reference does.
template <Format F>
inline void load_block(const uint8_t* blk, int sub, float32x4_t w[8]) {
  if constexpr (F == Format::F32) {
    for (int k = 0; k < 8; ++k) w[k] = vld1q_f32(reinterpret_cast<const float*>(blk) + 4 * k);
  } else if constexpr (F == Format::F16) {
    for (int k = 0; k < 8; ++k) w[k] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t*>(blk) + 4 * k)));
  } else if constexpr (F == Format::BF16) {
    for (int k = 0; k < 8; ++k)
      w[k] = vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(reinterpret_cast<const uint16_t*>(blk) + 4 * k), 16));
  } else {
    // The chunk's codes by the int16 rows' unpacking (load_codes, MXFP4's in
    // order here, not even and odd) and its scales as the reference finds
    // them, each weight d q (+ m) in the reference's two roundings. Through
    // the reference's chunk_codes, a call per block (formats.cpp, its fp16
    // conversion in software), a block had cost 139 (Q8_0) to 800 (Q2_K)
    // executed instructions.
    int8x16_t c[2];
    float d[2], m[2];
    load_codes<F, true>(blk, sub, c[0], c[1]);
    scales<F>(blk, sub, d, m);
    for (int h = 0; h < 2; ++h) {   // codes 16 h .. 16 h + 15, with their half's scales
      const int16x8_t s0 = vmovl_s8(vget_low_s8(c[h])), s1 = vmovl_high_s8(c[h]);
      const int32x4_t q[4] = {vmovl_s16(vget_low_s16(s0)), vmovl_high_s16(s0), vmovl_s16(vget_low_s16(s1)),
                              vmovl_high_s16(s1)};
      for (int k = 0; k < 4; ++k) {
        const float32x4_t v = vmulq_n_f32(vcvtq_f32_s32(q[k]), d[h]);
        w[4 * h + k] = has_min(F) ? vaddq_f32(v, vdupq_n_f32(m[h])) : v;
      }
    }
  }
}

// One row against TT (1 or 2) tokens, eight accumulators each.
template <Format F, int TT>
inline void row_tile(const uint8_t* row, size_t n_blocks, const float* X, size_t ldx, float* out) {
  float32x4_t acc[TT][8];
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t)
    for (int k = 0; k < 8; ++k) acc[t][k] = vdupq_n_f32(0.f);
  for (size_t b = 0; b < n_blocks; ++b) {
    float32x4_t w[8];
    int sub;
    const uint8_t* blk = chunk_block(F, row, b, sub);   // (sets sub)
    load_block<F>(blk, sub, w);
    GD_EACH_TOKEN
    for (int t = 0; t < TT; ++t) {
      const float* x = X + t * ldx + b * kBlock;
      for (int k = 0; k < 8; ++k) acc[t][k] = vfmaq_f32(acc[t][k], w[k], vld1q_f32(x + 4 * k));
    }
  }
  GD_EACH_TOKEN
  for (int t = 0; t < TT; ++t) {
    float32x4_t s = vaddq_f32(vaddq_f32(vaddq_f32(acc[t][0], acc[t][1]), vaddq_f32(acc[t][2], acc[t][3])),
                              vaddq_f32(vaddq_f32(acc[t][4], acc[t][5]), vaddq_f32(acc[t][6], acc[t][7])));
    out[t] = vaddvq_f32(s);
  }
}


}  // namespace

void rows_neon_i16(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const I16Acts& a, size_t T,
                   float* Y, size_t ldy, const float* bias) {
  rows_i16_by_tiles(f, W, n0, n1, K, a, T, Y, ldy, bias, [](auto F, auto TT, auto... args) {
    row_tile_i16<decltype(F)::value, decltype(TT)::value>(args...);
  });
}

void rows_neon(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const float* X, size_t ldx, size_t T,
               float* Y, size_t ldy, const float* bias) {
  with_format(f, [&](auto F) {
    constexpr Format G = decltype(F)::value;
    rows_by_float_tiles(f, W, n0, n1, K, X, ldx, T, Y, ldy, bias,
                        [&](auto TT, const uint8_t* row, const float* x, float* out) {
                          row_tile<G, decltype(TT)::value>(row, K / 32, x, ldx, out);
                        });
  });
}

}  // namespace gd
#endif
