#include "quants.h"

#include <cmath>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GD_X86 1
#endif

namespace gd {

const int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;  // signed zero
  } else {
    // Subnormal half: value = man * 2^-24, exact in float.
    float f = std::ldexp(float(man), -24);
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

uint16_t fp32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000);
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7E00 | uint16_t((a >> 13) & 0x3FF);   // NaN
  if (a >= 0x477FF000u) return sign | 0x7C00;   // from 65520 on (a tie of 65504's odd code and 2^16): inf
  if (a >= 0x38800000u) {                       // a normal fp16 (from 2^-14): rebias 127 -> 15, round 13 bits
    const uint32_t r = a - 0x38000000u;
    return sign | uint16_t((r + 0xFFFu + ((r >> 13) & 1)) >> 13);
  }
  if (a <= 0x33000000u) return sign;            // up to 2^-25 (a tie with zero's even code): zero
  // a subnormal fp16, in units of 2^-24: the significand m (value m 2^(e - 150)) shifted right
  const int e = int(a >> 23), shift = 126 - e;  // e 102 .. 112: shift 24 .. 14
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  return sign | uint16_t(q + (rem > half || (rem == half && (q & 1))));
}

// ---- portable reference ---------------------------------------------------

static void dequantize_q8_0_generic(const uint8_t* src, float* out, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; ++b, src += kQ8_0Bytes, out += kBlock) {
    uint16_t h;
    std::memcpy(&h, src, 2);
    const float d = fp16_to_fp32(h);
    const int8_t* q = reinterpret_cast<const int8_t*>(src + 2);
    for (int i = 0; i < kBlock; ++i) out[i] = d * float(q[i]);
  }
}

static void dequantize_mxfp4_generic(const uint8_t* src, float* out, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; ++b, src += kMxfp4Bytes, out += kBlock) {
    const float d = e8m0_to_fp32_half(src[0]);
    const uint8_t* qs = src + 1;
    for (int j = 0; j < 16; ++j) {
      out[j] = d * float(kMxfp4Values[qs[j] & 0x0F]);
      out[j + 16] = d * float(kMxfp4Values[qs[j] >> 4]);
    }
  }
}

// ---- AVX2 -----------------------------------------------------------------
#ifdef GD_X86
__attribute__((target("avx2,fma,f16c")))
static void dequantize_q8_0_avx2(const uint8_t* src, float* out, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; ++b, src += kQ8_0Bytes, out += kBlock) {
    uint16_t h;
    std::memcpy(&h, src, 2);
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2));
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; ++k) {
      const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k]));
      _mm256_storeu_ps(out + 8 * k, _mm256_mul_ps(d, f));
    }
  }
}

__attribute__((target("avx2,fma,f16c")))
static void dequantize_mxfp4_avx2(const uint8_t* src, float* out, size_t n_blocks) {
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Values));
  const __m128i mask = _mm_set1_epi8(0x0F);
  for (size_t b = 0; b < n_blocks; ++b, src += kMxfp4Bytes, out += kBlock) {
    const __m256 d = _mm256_set1_ps(e8m0_to_fp32_half(src[0]));
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 1));
    const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(qs, mask));                   // values 0..15
    const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(qs, 4), mask));  // values 16..31
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; ++k) {
      const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k]));
      _mm256_storeu_ps(out + 8 * k, _mm256_mul_ps(d, f));
    }
  }
}
#endif

void dequantize_q8_0(const uint8_t* src, float* out, size_t n_blocks, Impl impl) {
#ifdef GD_X86
  if (uses_avx2(resolve_impl(impl))) return dequantize_q8_0_avx2(src, out, n_blocks);
#endif
  dequantize_q8_0_generic(src, out, n_blocks);
}

void dequantize_mxfp4(const uint8_t* src, float* out, size_t n_blocks, Impl impl) {
#ifdef GD_X86
  if (uses_avx2(resolve_impl(impl))) return dequantize_mxfp4_avx2(src, out, n_blocks);
#endif
  dequantize_mxfp4_generic(src, out, n_blocks);
}

}  // namespace gd
