// Internal to rows_amx.cpp: Intel AMX's tiles (eight 2-D registers of up to
// 16 rows of 64 bytes, and a multiply unit beside the vector ones), the few
// instructions the MXFP4 products use, by inline assembly (GCC 12's
// intrinsics take the tile's number as a macro token, not a template's
// constant, and have no memory clobbers). tests/test_avx512.py builds them
// with GOOSEDUMP_AVX512_EMULATED: then each instruction is computed here,
// element by element as Intel's pseudo-code does it, so the kernel runs on
// any CPU.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace gd::amx {

// Palette 1's configuration: tile t has rows[t] rows of colsb[t] bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
constexpr size_t kRows = 16, kRowBytes = 64;
// Every tile 16 rows of 64 bytes (bf16 products: 32 values a row).
constexpr TileConfig full_tiles() {
  TileConfig c{};
  for (int t = 0; t < 8; ++t) c.colsb[t] = kRowBytes, c.rows[t] = kRows;
  return c;
}

#ifndef GOOSEDUMP_AVX512_EMULATED

inline void configure(const TileConfig& c) { asm volatile("ldtilecfg (%0)" ::"r"(&c) : "memory"); }
inline void release() { asm volatile("tilerelease" ::: "memory"); }
template <int T>
inline void zero() { asm volatile("tilezero %%tmm%c0" ::"i"(T)); }
template <int T>
inline void load(const void* p, size_t stride) {
  asm volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(p), "r"(stride), "i"(T) : "memory");
}
template <int T>
inline void store(void* p, size_t stride) {
  asm volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(p), "r"(stride), "i"(T) : "memory");
}
// C += A . B in bf16 pairs, fp32 sums: tdpbf16ps.
template <int C, int A, int B>
inline void dot_bf16() { asm volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(C), "i"(A), "i"(B)); }
// C += A . B in groups of four bytes, int32 sums, A signed and B unsigned
// (tdpbsud) or both signed (tdpbssd).
template <int C, int A, int B>
inline void dot_su8() { asm volatile("tdpbsud %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(C), "i"(A), "i"(B)); }
template <int C, int A, int B>
inline void dot_ss8() { asm volatile("tdpbssd %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(C), "i"(A), "i"(B)); }

#else

// The emulation: each thread's eight tiles as bytes, and the configuration
// that shapes them (a tile's bytes past its shape read as zeros, as the
// instructions' do).
struct Tiles {
  TileConfig config;
  alignas(64) uint8_t t[8][kRows][kRowBytes];
};
inline Tiles& tiles() {
  static thread_local Tiles s;
  return s;
}
inline void configure(const TileConfig& c) {
  std::memset(tiles().t, 0, sizeof(tiles().t));
  tiles().config = c;
}
inline void release() {}
template <int T>
inline void zero() { std::memset(tiles().t[T], 0, sizeof(tiles().t[T])); }
template <int T>
inline void load(const void* p, size_t stride) {
  auto& s = tiles();
  std::memset(s.t[T], 0, sizeof(s.t[T]));
  for (size_t r = 0; r < s.config.rows[T]; ++r)
    std::memcpy(s.t[T][r], static_cast<const uint8_t*>(p) + r * stride, s.config.colsb[T]);
}
template <int T>
inline void store(void* p, size_t stride) {
  auto& s = tiles();
  for (size_t r = 0; r < s.config.rows[T]; ++r)
    std::memcpy(static_cast<uint8_t*>(p) + r * stride, s.t[T][r], s.config.colsb[T]);
}
// (the instruction reads denormal bf16 as zeros and writes denormal sums as
// zeros: rows_amx.cpp keeps its numbers clear of both, fold_fits)
inline float flush(float v) { return std::fabs(v) < 0x1p-126f ? std::copysign(0.f, v) : v; }
inline float bf16_at(const uint8_t* row, size_t i) {
  uint16_t h;
  std::memcpy(&h, row + 2 * i, 2);
  if ((h & 0x7F80) == 0) h &= 0x8000;
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
// Intel's pseudo-code: for each row m of C, group k of A's row (K = A's
// bytes a row / 4) and column n (C's bytes a row / 4), the products of A's
// group k with B's row k at column n added into C[m][n] by add(c, a, b) (c:
// C[m][n]'s four bytes, a and b the groups' four bytes each).
template <int C, int A, int B, class Add>
inline void dot(Add&& add) {
  auto& s = tiles();
  const TileConfig& c = s.config;
  for (size_t m = 0; m < c.rows[C]; ++m)
    for (size_t k = 0; k < c.colsb[A] / 4u; ++k)
      for (size_t n = 0; n < c.colsb[C] / 4u; ++n) add(s.t[C][m] + 4 * n, s.t[A][m] + 4 * k, s.t[B][k] + 4 * n);
}
// bf16 pairs: one product after the other (every value the kernels meet is
// an integer below 2^24 times one power of two, where any order is exact).
template <int C, int A, int B>
inline void dot_bf16() {
  dot<C, A, B>([](uint8_t* c, const uint8_t* a, const uint8_t* b) {
    float v;
    std::memcpy(&v, c, 4);
    v = flush(v + bf16_at(a, 0) * bf16_at(b, 0));
    v = flush(v + bf16_at(a, 1) * bf16_at(b, 1));
    std::memcpy(c, &v, 4);
  });
}
// Bytes: four int32 products (A's bytes signed, B's as BSigned says).
template <bool BSigned, int C, int A, int B>
inline void dot_8() {
  dot<C, A, B>([](uint8_t* c, const uint8_t* a, const uint8_t* b) {
    int32_t v;
    std::memcpy(&v, c, 4);
    for (size_t i = 0; i < 4; ++i) v += int32_t(int8_t(a[i])) * (BSigned ? int32_t(int8_t(b[i])) : int32_t(b[i]));
    std::memcpy(c, &v, 4);
  });
}
template <int C, int A, int B>
inline void dot_su8() { dot_8<false, C, A, B>(); }
template <int C, int A, int B>
inline void dot_ss8() { dot_8<true, C, A, B>(); }

#endif

}  // namespace gd::amx
