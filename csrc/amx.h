// Internal to rows_amx.cpp: Intel AMX's tiles (eight 2-D registers of up to
// 16 rows of 64 bytes, and a multiply unit beside the vector ones), the few
// instructions the MXFP4 products use, by inline assembly (GCC 12's
// intrinsics take the tile's number as a macro token, not a template's
// constant, and have no memory clobbers). tests/test_avx512.py builds them
// with GOOSEDUMP_AVX512_EMULATED: then each instruction is computed here,
// element by element as Intel's pseudo-code does it, so the kernel runs on
// any CPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace gd::amx {

// Palette 1's configuration: every tile 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};
constexpr size_t kRows = 16, kRowBytes = 64;

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

#else

// The emulation: each thread's eight tiles as bytes.
struct Tiles {
  alignas(64) uint8_t t[8][kRows][kRowBytes];
};
inline Tiles& tiles() {
  static thread_local Tiles s;
  return s;
}
inline void configure(const TileConfig&) { std::memset(&tiles(), 0, sizeof(Tiles)); }
inline void release() {}
template <int T>
inline void zero() { std::memset(tiles().t[T], 0, sizeof(tiles().t[T])); }
template <int T>
inline void load(const void* p, size_t stride) {
  for (size_t r = 0; r < kRows; ++r) std::memcpy(tiles().t[T][r], static_cast<const uint8_t*>(p) + r * stride, kRowBytes);
}
template <int T>
inline void store(void* p, size_t stride) {
  for (size_t r = 0; r < kRows; ++r) std::memcpy(static_cast<uint8_t*>(p) + r * stride, tiles().t[T][r], kRowBytes);
}
inline float bf16_at(const uint8_t* row, size_t i) {
  uint16_t h;
  std::memcpy(&h, row + 2 * i, 2);
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
// Intel's pseudo-code: for each row m, pair k and column n, the two products
// added to C[m][n] one after the other (every value the kernel meets is an
// integer below 2^24, where any order is exact).
template <int C, int A, int B>
inline void dot_bf16() {
  auto& s = tiles();
  for (size_t m = 0; m < kRows; ++m)
    for (size_t k = 0; k < kRowBytes / 4; ++k)
      for (size_t n = 0; n < kRowBytes / 4; ++n) {
        float c;
        std::memcpy(&c, s.t[C][m] + 4 * n, 4);
        c += bf16_at(s.t[A][m], 2 * k) * bf16_at(s.t[B][k], 2 * n);
        c += bf16_at(s.t[A][m], 2 * k + 1) * bf16_at(s.t[B][k], 2 * n + 1);
        std::memcpy(s.t[C][m] + 4 * n, &c, 4);
      }
}

#endif

}  // namespace gd::amx
