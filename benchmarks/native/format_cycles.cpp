// Cycles per 32-value chunk of each block format's AVX2 int16 row kernel
// (row_tile_i16, and row_mxfp4 for MXFP4: the extension's own source,
// included) on one core, 8 rows of 2816 weights against a tile of 1 or 8
// tokens, all in the L1: each format's own speed without the memory, the
// numbers docs/performance.md gives per format (the Zen 3 section). The
// 256-bit forms; mxfp4_cycles.cpp times MXFP4's two forms. Two builds side
// by side (a change's A/B): build each from its own source tree and run
// them alternating, several times; the machines are noisy, compare medians.
// Weights random but for each block's scales (fp16 1 and 1/8: no
// infinities, no subnormals); cycles from core_clock.h.
//
//   g++ -O3 -std=c++17 -ffp-contract=off -Icsrc benchmarks/native/format_cycles.cpp
//       csrc/formats.cpp csrc/quants.cpp -o format_cycles && ./format_cycles [tokens: 1 or 8]
// (one command line)
#include "rows_avx2_i16.cpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "core_clock.h"

// (what the included file needs from the rest of the extension: not called here)
namespace gd {
Impl resolve_impl(Impl i) { return i; }
[[noreturn]] void float_weights_take_f32(Format) { std::abort(); }
bool cpu_splits_256() { return false; }
}  // namespace gd

namespace {

using gd::Format;

// Where a block keeps its fp16 factors (the rest of its bytes are codes or
// 6-bit fields, random here): byte offsets, -1 for none.
struct Factors {
  int d, m;
};
constexpr Factors factors(Format f) {
  switch (f) {
    case Format::Q4_1: case Format::Q5_1: case Format::Q4_K: case Format::Q5_K: return {0, 2};
    case Format::Q2_K: return {80, 82};
    case Format::Q3_K: return {108, -1};
    case Format::Q6_K: return {208, -1};
    default: return {0, -1};   // Q8_0, Q4_0, Q5_0, IQ4_NL, IQ4_XS
  }
}

template <Format F, int TT>
double cycles(double hz, size_t K) {
  constexpr size_t rows = 8;
  const size_t nc = K / 32, blocks = K / gd::block_values(F), rb = blocks * gd::block_bytes(F);
  std::mt19937 rng(1);
  std::vector<uint8_t> W(rows * rb);
  for (auto& b : W) b = uint8_t(rng());
  for (size_t i = 0; i < rows * blocks; ++i) {
    uint8_t* b = W.data() + i * gd::block_bytes(F);
    if constexpr (F == Format::MXFP4) {
      b[0] = uint8_t(120 + rng() % 10);   // scales near 2^0
    } else {
      const uint16_t one = 0x3c00, eighth = 0x3000;
      std::memcpy(b + factors(F).d, &one, 2);
      if (factors(F).m >= 0) std::memcpy(b + factors(F).m, &eighth, 2);
    }
  }
  auto* q = static_cast<int16_t*>(std::aligned_alloc(64, 2 * K * TT));
  for (size_t i = 0; i < K * TT; ++i) q[i] = int16_t(rng() % 4001) - 2000;
  std::vector<int32_t> e(nc * TT, gd::kScaleBias - 14), s(2 * nc * TT, 1000);
  std::vector<float> d(nc * TT, 1.f / 16384);
  const gd::I16Acts a{q, d.data(), e.data(), s.data(), true};
  float out[TT];
  double sink = 0;
  const int iters = int(20000000 / (rows * nc * TT));
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const double t = now_seconds();
    for (int it = 0; it < iters; ++it)
      for (size_t r = 0; r < rows; ++r) {
        if constexpr (F == Format::MXFP4) gd::row_mxfp4<TT, false>(W.data() + r * rb, nc, a, out);
        else gd::row_tile_i16<F, TT, false>(W.data() + r * rb, nc, a, out);
        sink += out[0];
        __asm__ volatile("" ::: "memory");
      }
    best = std::min(best, now_seconds() - t);
  }
  std::free(q);
  if (sink == 12345.678) std::puts("");   // (keeps the sums live)
  return best * hz / (double(iters) * rows * nc * TT);
}

template <int TT>
void each_format(double hz) {
  constexpr size_t K = 2816;   // 11 super-blocks of 256, 88 chunks
  std::printf("mxfp4  %.2f\n", cycles<Format::MXFP4, TT>(hz, K));
  std::printf("q8_0   %.2f\n", cycles<Format::Q8_0, TT>(hz, K));
  std::printf("q4_0   %.2f\n", cycles<Format::Q4_0, TT>(hz, K));
  std::printf("q4_1   %.2f\n", cycles<Format::Q4_1, TT>(hz, K));
  std::printf("q5_0   %.2f\n", cycles<Format::Q5_0, TT>(hz, K));
  std::printf("q5_1   %.2f\n", cycles<Format::Q5_1, TT>(hz, K));
  std::printf("iq4_nl %.2f\n", cycles<Format::IQ4_NL, TT>(hz, K));
  std::printf("iq4_xs %.2f\n", cycles<Format::IQ4_XS, TT>(hz, K));
  std::printf("q2_k   %.2f\n", cycles<Format::Q2_K, TT>(hz, K));
  std::printf("q3_k   %.2f\n", cycles<Format::Q3_K, TT>(hz, K));
  std::printf("q4_k   %.2f\n", cycles<Format::Q4_K, TT>(hz, K));
  std::printf("q5_k   %.2f\n", cycles<Format::Q5_K, TT>(hz, K));
  std::printf("q6_k   %.2f\n", cycles<Format::Q6_K, TT>(hz, K));
}

}  // namespace

int main(int argc, char** argv) {
  const int tokens = argc > 1 ? std::atoi(argv[1]) : 1;
  if (tokens != 1 && tokens != 8) {
    std::fprintf(stderr, "tokens: 1 or 8, got %s\n", argv[1]);
    return 2;
  }
  const double hz = core_hz();
  std::printf("core clock %.2f GHz; cycles per 32-value chunk and token, %d token(s), 8 rows of 2816 in the L1\n",
              hz / 1e9, tokens);
  if (tokens == 1) each_format<1>(hz);
  else each_format<8>(hz);
  return 0;
}
