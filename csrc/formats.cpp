// The generic unpacking of every block format, and dequantization through it.
// Compiled with -ffp-contract=off: d * q + m must round twice, as ggml's
// dequantize_row_* and gguf-py do, not fuse into one FMA.
#include "formats.h"

#include <cstring>
#include <stdexcept>

#include "quants.h"

namespace gd {

const int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

namespace {

constexpr Format F(int i) { return Format(i); }
#define INFO(i, name) {name, block_values(F(i)), block_bytes(F(i))}
const FormatInfo kInfo[] = {
    INFO(0, "f32"),   INFO(1, "f16"),   INFO(2, "bf16"),  INFO(3, "q4_0"),    INFO(4, "q4_1"),    INFO(5, "q5_0"),
    INFO(6, "q5_1"),  INFO(7, "q8_0"),  INFO(8, "q2_k"),  INFO(9, "q3_k"),    INFO(10, "q4_k"),   INFO(11, "q5_k"),
    INFO(12, "q6_k"), INFO(13, "iq4_nl"), INFO(14, "iq4_xs"), INFO(15, "mxfp4"),
};
#undef INFO
constexpr int kFormats = int(sizeof(kInfo) / sizeof(kInfo[0]));

inline float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}

inline void nibbles(const uint8_t* qs, const int8_t* table, int8_t q[32]) {
  for (int j = 0; j < 16; ++j) {
    q[j] = table ? table[qs[j] & 0xF] : int8_t(qs[j] & 0xF);
    q[j + 16] = table ? table[qs[j] >> 4] : int8_t(qs[j] >> 4);
  }
}

}  // namespace

const FormatInfo& info(Format f) { return kInfo[int(f)]; }

std::string format_names() {
  std::string s;
  for (int i = 0; i < kFormats; ++i) s += (i ? ", " : "") + std::string(kInfo[i].name);
  return s;
}

Format parse_format(const std::string& name) {
  for (int i = 0; i < kFormats; ++i)
    if (name == kInfo[i].name) return Format(i);
  throw std::invalid_argument("format must be one of " + format_names() + ", got '" + name + "'");
}

size_t row_bytes(Format f, size_t K) {
  const FormatInfo& fi = info(f);
  return K / size_t(fi.block) * size_t(fi.bytes);
}

void chunk_codes(Format f, const uint8_t* b, int sub, int8_t q[32], float d[2], float m[2]) {
  if (f == Format::MXFP4) {
    d[0] = d[1] = e8m0_to_fp32_half(b[0]);
    m[0] = m[1] = 0.f;
  } else {
    chunk_scales(f, b, sub, d, m, fp16_to_fp32);
  }
  switch (f) {
    case Format::Q4_0:
      nibbles(b + 2, nullptr, q);
      for (int j = 0; j < 32; ++j) q[j] = int8_t(q[j] - 8);
      return;
    case Format::Q4_1:
      nibbles(b + 4, nullptr, q);
      return;
    case Format::Q5_0:
    case Format::Q5_1: {
      const bool one = f == Format::Q5_1;
      uint32_t qh;
      std::memcpy(&qh, b + (one ? 4 : 2), 4);
      nibbles(b + (one ? 8 : 6), nullptr, q);
      for (int j = 0; j < 32; ++j) q[j] = int8_t(q[j] + int(((qh >> j) & 1) << 4) - (one ? 0 : 16));
      return;
    }
    case Format::Q8_0:
      std::memcpy(q, b + 2, 32);
      return;
    case Format::IQ4_NL:
      nibbles(b + 2, kIq4nlValues, q);
      return;
    case Format::MXFP4:
      nibbles(b + 1, kMxfp4Values, q);
      return;
    case Format::Q2_K: {
      const uint8_t* qs = b + 16 + 32 * (sub / 4);
      for (int l = 0; l < 32; ++l) q[l] = int8_t((qs[l] >> (2 * (sub % 4))) & 3);
      return;
    }
    case Format::Q3_K: {
      const uint8_t* qs = b + 32 + 32 * (sub / 4);
      const uint8_t bit = uint8_t(1u << sub);
      for (int l = 0; l < 32; ++l) q[l] = int8_t(((qs[l] >> (2 * (sub % 4))) & 3) - ((b[l] & bit) ? 0 : 4));
      return;
    }
    case Format::Q4_K:
    case Format::Q5_K: {
      const bool five = f == Format::Q5_K;
      const uint8_t* qs = b + (five ? 48 : 16) + 32 * (sub / 2);
      const int shift = 4 * (sub % 2);
      for (int l = 0; l < 32; ++l) {
        int v = (qs[l] >> shift) & 0xF;
        if (five) v += ((b[16 + l] >> sub) & 1) << 4;
        q[l] = int8_t(v);
      }
      return;
    }
    case Format::Q6_K: {
      const int h = sub / 4, r = sub % 4;
      const uint8_t* ql = b + 64 * h + 32 * (r & 1);
      const uint8_t* qh = b + 128 + 32 * h;
      for (int l = 0; l < 32; ++l)
        q[l] = int8_t((((ql[l] >> (r >= 2 ? 4 : 0)) & 0xF) | (((qh[l] >> (2 * r)) & 3) << 4)) - 32);
      return;
    }
    case Format::IQ4_XS:
      nibbles(b + 8 + 16 * sub, kIq4nlValues, q);
      return;
    default:
      throw std::invalid_argument(std::string("chunk_codes: ") + info(f).name + " is not a block format");
  }
}

void dequantize(Format f, const uint8_t* src, float* out, size_t n_values, Impl impl) {
  if (f == Format::Q8_0) return dequantize_q8_0(src, out, n_values / 32, impl);
  if (f == Format::MXFP4) return dequantize_mxfp4(src, out, n_values / 32, impl);
  if (f == Format::F32) {
    std::memcpy(out, src, n_values * 4);
    return;
  }
  if (f == Format::F16) {
    for (size_t i = 0; i < n_values; ++i) out[i] = half(src + 2 * i);
    return;
  }
  if (f == Format::BF16) {
    for (size_t i = 0; i < n_values; ++i) {
      const uint32_t bits = uint32_t(src[2 * i] | (src[2 * i + 1] << 8)) << 16;
      std::memcpy(out + i, &bits, 4);
    }
    return;
  }
  int8_t q[32];
  float d[2], m[2];
  for (size_t c = 0; c < n_values / 32; ++c) {
    int sub;
    const uint8_t* blk = chunk_block(f, src, c, sub);
    chunk_codes(f, blk, sub, q, d, m);
    // (an offset only where the format has one: d q + 0 would turn ggml's -0 into +0)
    if (has_min(f))
      for (int j = 0; j < 32; ++j) out[32 * c + j] = d[j / 16] * float(q[j]) + m[j / 16];
    else
      for (int j = 0; j < 32; ++j) out[32 * c + j] = d[j / 16] * float(q[j]);
  }
}

}  // namespace gd
