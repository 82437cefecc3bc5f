// Cycles per token and block of the AVX2 MXFP4 products at several token
// counts on one core, two forms alternating in one process: the kernels'
// entry (rows_avx2_i16, the extension's own source, included: full 8-token
// tiles in stretches of 32 blocks over a group of rows) and the form before
// it (each row's whole length per tile, row_mxfp4 through
// rows_i16_by_tiles, in the entry's form: 256-bit or halves'). A matrix of `rows` rows of 2880 weights in tasks of
// 16 rows, as matmul deals them (docs/performance.md, the Zen 3 section).
// Each count's outputs are checked against the one-token loop's, token by
// token (batch invariance), and the two forms against each other.
// The entry runs the forms the extension runs on this CPU (csrc/cpu.cpp's
// cpu_splits_256: those for cores that split 256-bit operations on AMD Zen
// 1); GOOSEDUMP_AVX2_HALVES=1 or 0 picks them, as it does for the
// extension. The one-token check runs the entry's one-token form, so in
// the halves' forms it also checks their one-token rows against the tiles.
//
//   g++ -O3 -std=c++17 -ffp-contract=off -Icsrc benchmarks/native/mxfp4_tiles.cpp
//       csrc/formats.cpp csrc/quants.cpp csrc/cpu.cpp -o mxfp4_tiles && ./mxfp4_tiles [rows] [tokens ...]
// (one command line; default 2880 rows, 16 32 64 256 tokens)
#include "rows_avx2_i16.cpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "core_clock.h"

// (what the included file needs from the rest of the extension: not called here)
namespace gd {
[[noreturn]] void float_weights_take_f32(Format) { std::abort(); }
}  // namespace gd

int main(int argc, char** argv) {
  const size_t K = 2880, nc = K / 32;
  const long rows_arg = argc > 1 ? std::strtol(argv[1], nullptr, 10) : 2880;
  if (rows_arg < 1 || rows_arg > 65536) {
    std::fprintf(stderr, "rows: 1 to 65536, got %s\n", argv[1]);
    return 2;
  }
  const size_t N = size_t(rows_arg);
  std::vector<size_t> counts;
  for (int i = 2; i < argc; ++i) {
    const long t = std::strtol(argv[i], nullptr, 10);
    if (t < 1 || t > 4096) {
      std::fprintf(stderr, "tokens: 1 to 4096, got %s\n", argv[i]);
      return 2;
    }
    counts.push_back(size_t(t));
  }
  if (counts.empty()) counts = {16, 32, 64, 256};
  const double hz = core_hz();
  std::mt19937 rng(1);
  std::vector<uint8_t> W(N * nc * 17);
  for (auto& b : W) b = uint8_t(rng());
  for (size_t i = 0; i < N * nc; ++i) W[i * 17] = uint8_t(120 + rng() % 10);   // scales near 2^0
  std::printf("core clock %.2f GHz; MXFP4, %zu x %zu, one thread, tasks of 16 rows; the entry's %s forms\n", hz / 1e9,
              N, K, gd::cpu_splits_256() ? "halves'" : "256-bit");
  for (const size_t T : counts) {
    // activations of T tokens in the tiled layout (act_block); random codes and exponents
    std::vector<int16_t> q(K * T);
    for (auto& x : q) x = int16_t(int(rng() % 65535) - 32767);
    std::vector<int32_t> e(nc * T);
    for (auto& x : e) x = gd::kScaleBias - 14 + int(rng() % 5);
    std::vector<float> d(nc * T, 0.f);
    const gd::I16Acts a{q.data(), d.data(), e.data(), nullptr, true};
    std::vector<float> Y(T * N), one(N);
    auto all = [&] {
      for (size_t n0 = 0; n0 < N; n0 += 16)
        gd::rows_avx2_i16(gd::Format::MXFP4, W.data(), n0, std::min(N, n0 + 16), K, a, T, Y.data(), N, nullptr);
    };
    all();
    for (size_t t = 0; t < T; ++t) {   // token t alone: its blocks' activations out of the tile
      std::vector<int16_t> qt(K);
      std::vector<int32_t> et(nc);
      for (size_t b = 0; b < nc; ++b) {
        const size_t at = gd::act_block(t, b, T, nc);
        std::memcpy(&qt[b * 32], &q[at * 32], 64);
        et[b] = e[at];
      }
      const gd::I16Acts at{qt.data(), d.data(), et.data(), nullptr, true};
      gd::rows_avx2_i16(gd::Format::MXFP4, W.data(), 0, N, K, at, 1, one.data(), N, nullptr);
      if (std::memcmp(one.data(), &Y[t * N], N * sizeof(float))) {
        std::fprintf(stderr, "%zu tokens: token %zu differs from its one-token products\n", T, t);
        return 1;
      }
    }
    std::vector<float> Yrow(T * N);
    auto by_rows = [&] {
      for (size_t n0 = 0; n0 < N; n0 += 16)
        gd::rows_i16_by_tiles(gd::Format::MXFP4, W.data(), n0, std::min(N, n0 + 16), K, a, T, Yrow.data(), N, nullptr,
                              [](auto, auto TT, auto... args) {
                                if (gd::cpu_splits_256()) gd::row_mxfp4<decltype(TT)::value, true>(args...);
                                else gd::row_mxfp4<decltype(TT)::value, false>(args...);
                              });
    };
    by_rows();
    if (std::memcmp(Yrow.data(), Y.data(), Y.size() * sizeof(float))) {
      std::fprintf(stderr, "%zu tokens: the two forms differ\n", T);
      return 1;
    }
    const int iters = int(2e9 / double(N * K * T)) + 1;
    double best[2] = {1e30, 1e30};
    for (int rep = 0; rep < 9; ++rep)
      for (int f = 0; f < 2; ++f) {
        const int form = rep % 2 ? 1 - f : f;   // the order turns each round
        const double t0 = now_seconds();
        for (int it = 0; it < iters; ++it) {
          if (form == 0) by_rows();
          else all();
          __asm__ volatile("" ::: "memory");
        }
        best[form] = std::min(best[form], now_seconds() - t0);
      }
    const double per = hz / (double(iters) * N * nc * T);
    std::printf("  %4zu tokens: rows whole %.2f, entry %.2f cycles per token and block: %.2fx (the same bits)\n", T,
                best[0] * per, best[1] * per, best[0] / best[1]);
  }
  return 0;
}
