// Block formats of GGUF weights, as ggml defines them (ggml-common.h):
//   Q8_0:  34 bytes per 32 values: fp16 scale d, 32 int8 q; value = d * q.
//   MXFP4: 17 bytes per 32 values: E8M0 exponent e, 16 bytes of 4-bit codes
//          (byte j: value j in the low nibble, value j+16 in the high one);
//          value = kvalues[code] * 2^(e-128).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu.h"

namespace gd {

constexpr int kBlock = 32;
constexpr int kQ8_0Bytes = 34;
constexpr int kMxfp4Bytes = 17;

// Signed FP4 (E2M1) values, doubled so they fit in int8.
extern const int8_t kMxfp4Values[16];

float fp16_to_fp32(uint16_t h);
// The fp16 nearest to f, ties to even (as F16C's vcvtps2ph, NEON's vcvt and
// numpy's astype(float16)); NaN stays NaN, quiet, with its payload's top bits.
uint16_t fp32_to_fp16(float f);

// 2^(e-128): the E8M0 scale with the 1/2 that undoes the doubled kvalues,
// built from bits (it is on the hot path of every MXFP4 block).
inline float e8m0_to_fp32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : uint32_t(e - 1) << 23;  // e < 2: subnormal
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Dequantize n_blocks blocks into out (32 floats per block).
void dequantize_q8_0(const uint8_t* src, float* out, size_t n_blocks, Impl impl);
void dequantize_mxfp4(const uint8_t* src, float* out, size_t n_blocks, Impl impl);

}  // namespace gd
