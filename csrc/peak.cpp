#include "peak.h"

#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#ifndef GOOSEDUMP_AVX512_EMULATED
#include "amx.h"
#endif
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace gd {
namespace {

constexpr int kChains = 8;   // independent accumulators: the latency hidden, the throughput measured

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2,fma,f16c"))) int32_t madd_avx2(uint64_t n) {
  __m256i acc[kChains], a[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_setzero_si256(), a[i] = _mm256_set1_epi16(int16_t(i + 1));
  __m256i b = _mm256_set1_epi16(3);
  for (uint64_t k = 0; k < n; ++k) {
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(a[i], b));
    __asm__ volatile("" : "+x"(b));   // keeps the loop from being folded
  }
  __m256i s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm256_add_epi32(s, acc[i]);
  return _mm256_extract_epi32(s, 0);
}

#ifndef GOOSEDUMP_AVX512_EMULATED
__attribute__((target("avx512f,avx512bw"))) int32_t madd_avx512(uint64_t n) {
  __m512i acc[kChains], a[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_setzero_si512(), a[i] = _mm512_set1_epi16(int16_t(i + 1));
  __m512i b = _mm512_set1_epi16(3);
  for (uint64_t k = 0; k < n; ++k) {
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_add_epi32(acc[i], _mm512_madd_epi16(a[i], b));
    __asm__ volatile("" : "+v"(b));
  }
  __m512i s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_epi32(s, acc[i]);
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, s);
  return lanes[0];
}
#endif
#endif

#if defined(__aarch64__)
int32_t mlal_neon(uint64_t n) {
  int32x4_t acc[kChains];
  int16x8_t a[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = vdupq_n_s32(0), a[i] = vdupq_n_s16(int16_t(i + 1));
  int16x8_t b = vdupq_n_s16(3);
  for (uint64_t k = 0; k < n; ++k) {
    for (int i = 0; i < kChains; ++i) acc[i] = vmlal_high_s16(vmlal_s16(acc[i], vget_low_s16(a[i]), vget_low_s16(b)), a[i], b);
    __asm__ volatile("" : "+w"(b));
  }
  int32x4_t s = acc[0];
  for (int i = 1; i < kChains; ++i) s = vaddq_s32(s, acc[i]);
  return vgetq_lane_s32(s, 0);
}
#endif

int32_t madd_generic(uint64_t n) {
  int32_t acc[kChains] = {};
  volatile int16_t vb = 3;
  const int16_t b = vb;
  for (uint64_t k = 0; k < n; ++k)
    for (int i = 0; i < kChains; ++i) acc[i] += int32_t(int16_t(i + 1 + int(k & 1))) * b;
  int32_t s = 0;
  for (int i = 0; i < kChains; ++i) s += acc[i];
  return s;
}

}  // namespace

PeakRate peak_int16_macs(Impl impl, uint64_t iterations) {
  const Impl which = resolve_impl(impl);
  PeakRate r{0.0, "scalar multiply-add", 1};
  int per_round = 1;   // MACs per chain per round of the loop
  volatile int32_t sink = 0;
  const auto t0 = std::chrono::steady_clock::now();
#if defined(__x86_64__) || defined(__i386__)
#ifndef GOOSEDUMP_AVX512_EMULATED
  if (which == Impl::Avx512) {
    sink = madd_avx512(iterations);
    r.instruction = "vpmaddwd zmm (+ vpaddd)", r.macs_per_instruction = 32, per_round = 32;
  } else
#endif
  if (which == Impl::Avx2) {
    sink = madd_avx2(iterations);
    r.instruction = "vpmaddwd ymm (+ vpaddd)", r.macs_per_instruction = 16, per_round = 16;
  } else
#endif
#if defined(__aarch64__)
  if (which == Impl::Neon) {
    sink = mlal_neon(iterations);
    r.instruction = "smlal/smlal2 (int16 -> int32)", r.macs_per_instruction = 4, per_round = 8;
  } else
#endif
    sink = madd_generic(iterations);
  (void)sink;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.macs_per_s = double(iterations) * kChains * per_round / s;
  return r;
}

PeakRate peak_amx_macs(uint64_t iterations) {
  PeakRate r{0.0, "tdpbf16ps (AMX; an int16 product takes two bf16 ones)", 4096};
#if (defined(__x86_64__) || defined(__i386__)) && !defined(GOOSEDUMP_AVX512_EMULATED)
  if (resolve_impl(Impl::Auto) != Impl::Avx512 || !cpu_has_amx()) return r;
  static const amx::TileConfig config = amx::full_tiles();
  amx::configure(config);
  alignas(64) static uint16_t ones[16 * 32];   // bf16 1.0 (zeros multiply faster)
  for (auto& v : ones) v = 0x3F80;
  amx::load<1>(ones, 64);
  amx::load<2>(ones, 64);
  amx::load<3>(ones, 64);
  amx::zero<0>();
  amx::zero<4>();
  amx::zero<5>();
  amx::zero<6>();
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t k = 0; k < iterations; ++k) {
    amx::dot_bf16<0, 1, 2>();
    amx::dot_bf16<4, 1, 3>();
    amx::dot_bf16<5, 1, 2>();
    amx::dot_bf16<6, 1, 3>();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  amx::release();
  r.macs_per_s = double(iterations) * 4 * r.macs_per_instruction / s;
#endif
  return r;
}

}  // namespace gd
