// Cycles per block of the AVX2 one-token MXFP4 kernel (row_mxfp4<1>, the
// extension's own source, included) on one core, 8 rows of 2880 weights
// against one token, all in the L1: the kernel's own speed, without the
// memory (docs/performance.md, the Zen 3 and Zen 1 sections; x86_pipes.c
// gives the same operations' rate without their dependences). Both forms:
// the 256-bit one and the one for cores that split 256-bit operations in
// 128-bit halves (AMD Zen 1; cpu_splits_256). Activations at a
// chosen offset from a 64-byte line (bytes; 16 and 48 split half of the
// 32-byte loads). Cycles from core_clock.h.
//
//   g++ -O3 -std=c++17 -ffp-contract=off -Icsrc benchmarks/native/mxfp4_cycles.cpp
//       csrc/formats.cpp csrc/quants.cpp -o mxfp4_cycles && ./mxfp4_cycles [offset]
// (one command line)
#include "rows_avx2_i16.cpp"

#include <cstdio>
#include <cstdlib>
#include <random>
#include <type_traits>
#include <vector>

#include "core_clock.h"

// (what the included file needs from the rest of the extension: not called here)
namespace gd {
Impl resolve_impl(Impl i) { return i; }
[[noreturn]] void float_weights_take_f32(Format) { std::abort(); }
bool cpu_splits_256() { return false; }
}  // namespace gd

int main(int argc, char** argv) {
  const size_t K = 2880, nc = K / 32, rows = 8;
  const size_t offset = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 0;
  if (offset % 2 || offset >= 64) {
    std::fprintf(stderr, "offset: an even number of bytes below 64, got %s\n", argv[1]);
    return 2;
  }
  const double hz = core_hz();
  std::mt19937 rng(1);
  std::vector<uint8_t> W(rows * nc * 17);
  for (auto& b : W) b = uint8_t(rng());
  for (size_t i = 0; i < rows * nc; ++i) W[i * 17] = uint8_t(120 + rng() % 10);   // scales near 2^0
  auto* line = static_cast<int16_t*>(std::aligned_alloc(64, 2 * K + 64));
  int16_t* q = line + offset / 2;
  for (size_t i = 0; i < K; ++i) q[i] = int16_t(rng() % 4001) - 2000;
  std::vector<int32_t> e(nc, gd::kScaleBias - 14);
  std::vector<float> d(nc, 1.f / 16384);
  const gd::I16Acts a{q, d.data(), e.data(), nullptr, true};
  float out[1];
  double sink = 0;
  const int iters = int(20000000 / (rows * nc));
  // best of five runs of the kernel in one of its two forms (Narrow: the
  // codes' halves made apart, for cores that split 256-bit operations)
  auto time = [&](auto narrow) {
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      const double t = now_seconds();
      for (int it = 0; it < iters; ++it)
        for (size_t r = 0; r < rows; ++r) {
          gd::row_mxfp4<1, decltype(narrow)::value>(W.data() + r * nc * 17, nc, a, out);
          sink += out[0];
          __asm__ volatile("" ::: "memory");
        }
      best = std::min(best, now_seconds() - t);
    }
    return best * hz / (double(iters) * rows * nc);
  };
  const double wide = time(std::false_type{}), halves = time(std::true_type{});
  std::printf("core clock %.2f GHz; row_mxfp4<1> in the L1, activations %zu bytes past a line: %.2f cycles per block, "
              "%.2f with the codes' halves made apart (%g)\n",
              hz / 1e9, offset, wide, halves, sink);
  std::free(line);
  return 0;
}
