// Every weight format of a published gpt-oss GGUF file, as ggml defines it
// (ggml-common.h, ggml-quants.c), and the one form the products read them in.
//
// Block formats hold 32 values (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4)
// or 256 (the K-quants Q2_K..Q6_K and IQ4_XS: super-blocks of 8 or 16
// sub-blocks with their own scales). Either way a row splits into chunks of
// 32 values, and each chunk is integer codes q[32] with a scale and an
// offset per half of 16:
//
//     value[j] = d[j / 16] * q[j] + m[j / 16]
//
// (m is 0 but in Q4_1, Q5_1, Q2_K, Q4_K, Q5_K, which store minimums). That
// is exactly the float arithmetic of ggml's dequantize_row_* (the same
// products in the same order), so dequantization through chunks is bit-exact,
// and a product with int16 activations is exact integer sums per half,
// scaled once (matmul.cpp). F32, F16 and BF16 rows are plain floats.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "cpu.h"

namespace gd {

enum class Format { F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS,
                    MXFP4 };

struct FormatInfo {
  const char* name;   // as the Python side names it: "q4_k"
  int block;          // values per block (1 for plain floats)
  int bytes;          // bytes per block
};

const FormatInfo& info(Format f);
// "q4_k" -> Format::Q4_K; throws std::invalid_argument naming the known ones.
Format parse_format(const std::string& name);
std::string format_names();   // "f32, f16, ..." for error messages

constexpr bool is_float(Format f) { return f == Format::F32 || f == Format::F16 || f == Format::BF16; }
// Formats with a minimum per sub-block (value = d q + m, m != 0).
constexpr bool has_min(Format f) {
  return f == Format::Q4_1 || f == Format::Q5_1 || f == Format::Q2_K || f == Format::Q4_K || f == Format::Q5_K;
}
// Formats whose halves of a chunk may have different scales (sub-blocks of 16).
constexpr bool halves_differ(Format f) { return f == Format::Q2_K || f == Format::Q3_K || f == Format::Q6_K; }
// Formats whose integer codes lie within -32..32 (all but Q8_0's and the
// IQ4 tables' 8-bit ones, and the plain floats): times 256 they stay int16,
// and four products with int16 activations stay below 2^30.
constexpr bool small_codes(Format f) {
  return f == Format::Q4_0 || f == Format::Q4_1 || f == Format::Q5_0 || f == Format::Q5_1 || f == Format::Q2_K ||
         f == Format::Q3_K || f == Format::Q4_K || f == Format::Q5_K || f == Format::Q6_K || f == Format::MXFP4;
}
// Values and bytes per block.
constexpr int block_values(Format f) {
  switch (f) {
    case Format::F32: case Format::F16: case Format::BF16: return 1;
    case Format::Q2_K: case Format::Q3_K: case Format::Q4_K: case Format::Q5_K: case Format::Q6_K:
    case Format::IQ4_XS: return 256;
    default: return 32;
  }
}
constexpr int block_bytes(Format f) {
  switch (f) {
    case Format::F32: return 4;
    case Format::F16: case Format::BF16: return 2;
    case Format::Q4_0: case Format::IQ4_NL: return 18;
    case Format::Q4_1: return 20;
    case Format::Q5_0: return 22;
    case Format::Q5_1: return 24;
    case Format::Q8_0: return 34;
    case Format::Q2_K: return 84;
    case Format::Q3_K: return 110;
    case Format::Q4_K: return 144;
    case Format::Q5_K: return 176;
    case Format::Q6_K: return 210;
    case Format::IQ4_XS: return 136;
    case Format::MXFP4: return 17;
  }
  return 0;
}

size_t row_bytes(Format f, size_t K);
// Where chunk c (32 values) of a row starts: its block, and its index inside
// the block (0 for 32-value blocks, 0..7 in a super-block).
inline const uint8_t* chunk_block(Format f, const uint8_t* row, size_t c, int& sub) {
  const size_t bv = size_t(block_values(f)), first = 32 * c;
  sub = int(first % bv / 32);
  return row + first / bv * size_t(block_bytes(f));
}

// The codes, scales and offsets of chunk `sub` of a block (a block format's
// generic unpacking: the reference the SIMD kernels are tested against).
void chunk_codes(Format f, const uint8_t* blk, int sub, int8_t q[32], float d[2], float m[2]);

// Rows of any format to floats (embedding lookups, tests): n_values of
// consecutive values, a whole number of blocks.
void dequantize(Format f, const uint8_t* src, float* out, size_t n_values, Impl impl);

extern const int8_t kIq4nlValues[16];

// Q4_K and Q5_K: the 6-bit scale and minimum of sub-block j (ggml's get_scale_min_k4).
inline void scale_min_k4(int j, const uint8_t* q, int& sc, int& mn) {
  if (j < 4) {
    sc = q[j] & 63;
    mn = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q3_K: the sixteen 6-bit scales, unpacked from 12 bytes (as ggml does).
inline void q3k_scales(const uint8_t* packed, int8_t out[16]) {
  constexpr uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
  uint32_t aux[4];
  std::memcpy(aux, packed, 12);
  const uint32_t tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
  aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
  aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
  aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
  std::memcpy(out, aux, 16);
}

// The scales and offsets of chunk `sub` of a block: value = d[h] q + m[h] for
// the chunk's half h. `half` turns fp16 bits into a float (the generic
// conversion, or one instruction where the CPU has it).
template <class Half>
inline void chunk_scales(Format f, const uint8_t* b, int sub, float d[2], float m[2], Half half) {
  auto h16 = [&](const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return half(v);
  };
  m[0] = m[1] = 0.f;
  switch (f) {
    case Format::Q4_1:
    case Format::Q5_1:
      m[0] = m[1] = h16(b + 2);
      d[0] = d[1] = h16(b);
      return;
    case Format::Q2_K: {   // scales[16], qs[64], d, dmin
      const float dd = h16(b + 80), dmin = h16(b + 82);
      const int h = sub / 4, j = sub % 4;
      for (int k = 0; k < 2; ++k) {
        const uint8_t sc = b[8 * h + 2 * j + k];
        d[k] = dd * float(sc & 0xF);
        m[k] = -(dmin * float(sc >> 4));
      }
      return;
    }
    case Format::Q3_K: {   // hmask[32], qs[64], scales[12], d
      int8_t sc[16];
      q3k_scales(b + 96, sc);
      const float dd = h16(b + 108);
      const int h = sub / 4, j = sub % 4;
      d[0] = dd * float(sc[8 * h + 2 * j] - 32);
      d[1] = dd * float(sc[8 * h + 2 * j + 1] - 32);
      return;
    }
    case Format::Q4_K:
    case Format::Q5_K: {   // d, dmin, scales[12], ...
      int sc, mn;
      scale_min_k4(sub, b + 4, sc, mn);
      d[0] = d[1] = h16(b) * float(sc);
      m[0] = m[1] = -(h16(b + 2) * float(mn));
      return;
    }
    case Format::Q6_K: {   // ql[128], qh[64], scales[16] (int8), d
      const float dd = h16(b + 208);
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * (sub / 4);
      d[0] = dd * float(sc[2 * (sub % 4)]);
      d[1] = dd * float(sc[2 * (sub % 4) + 1]);
      return;
    }
    case Format::IQ4_XS: {   // d, scales_h (16 bits), scales_l[4], qs[128]
      uint16_t sh;
      std::memcpy(&sh, b + 2, 2);
      const int ls = ((b[4 + sub / 2] >> (4 * (sub % 2))) & 0xF) | (((sh >> (2 * sub)) & 3) << 4);
      d[0] = d[1] = h16(b) * float(ls - 32);
      return;
    }
    default:   // Q4_0, Q5_0, Q8_0, IQ4_NL: one fp16 scale first (MXFP4's E8M0 is the caller's)
      d[0] = d[1] = h16(b);
      return;
  }
}

// The scales and offsets of every chunk of a super-block at once (what
// chunk_scales gives chunk by chunk, the same products, the shared parts
// unpacked once): d[sub][half], m[sub][half].
template <class Half>
inline void superblock_scales(Format f, const uint8_t* b, float d[8][2], float m[8][2], Half half) {
  auto h16 = [&](const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return half(v);
  };
  switch (f) {
    case Format::Q2_K: {
      const float dd = h16(b + 80), dmin = h16(b + 82);
      for (int i = 0; i < 16; ++i) {
        d[i / 2][i % 2] = dd * float(b[i] & 0xF);
        m[i / 2][i % 2] = -(dmin * float(b[i] >> 4));
      }
      return;
    }
    case Format::Q3_K: {
      int8_t sc[16];
      q3k_scales(b + 96, sc);
      const float dd = h16(b + 108);
      for (int i = 0; i < 16; ++i) d[i / 2][i % 2] = dd * float(sc[i] - 32), m[i / 2][i % 2] = 0.f;
      return;
    }
    case Format::Q4_K:
    case Format::Q5_K: {
      const float dd = h16(b), dmin = h16(b + 2);
      for (int j = 0; j < 8; ++j) {
        int sc, mn;
        scale_min_k4(j, b + 4, sc, mn);
        d[j][0] = d[j][1] = dd * float(sc);
        m[j][0] = m[j][1] = -(dmin * float(mn));
      }
      return;
    }
    case Format::Q6_K: {
      const float dd = h16(b + 208);
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      for (int i = 0; i < 16; ++i) d[i / 2][i % 2] = dd * float(sc[i]), m[i / 2][i % 2] = 0.f;
      return;
    }
    default:   // IQ4_XS
      for (int j = 0; j < 8; ++j) chunk_scales(f, b, j, d[j], m[j], half);
      return;
  }
}

}  // namespace gd
