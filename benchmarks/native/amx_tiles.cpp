// What bounds rows_amx.cpp's MXFP4 loop on a CPU with AMX: the cycles (of
// the TSC) of each tile instruction it uses, of a block's products (two tile
// sets alternating, as the kernel does), of a block's scaling on the vector
// unit alone, and of both together, as the kernel runs them. One thread, data
// in the L1/L2, random bf16 values of the kernel's kinds (zeros run faster).
//
//   g++ -O2 -std=c++17 -I csrc -o /tmp/amx_tiles benchmarks/native/amx_tiles.cpp && /tmp/amx_tiles
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <x86intrin.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>

#include "amx.h"

using namespace gd;
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))

constexpr int kBlocks = 90;   // a 2880-wide row
alignas(64) static uint16_t W[kBlocks * 512], A[kBlocks * 1024];
alignas(64) static float E[kBlocks * 16], EW[16 * kBlocks], C[2][16][16];

template <int S>
inline void products(int b) {   // tile set S: C, A, L, H = S, S + 1, S + 2, S + 3
  amx::zero<S>();
  amx::load<S + 1>(W + b * 512, 64);
  amx::load<S + 2>(A + b * 1024, 64);
  amx::load<S + 3>(A + b * 1024 + 512, 64);
  amx::dot_bf16<S, S + 1, S + 2>();
  amx::dot_bf16<S, S + 1, S + 3>();
  amx::store<S>(C[S / 4], 64);
}

// mode 0: products and scaling; 1: products alone; 2: scaling alone
template <int Mode>
AVX512 __attribute__((noinline)) float loop() {
  __m512 acc[16];
  for (auto& a : acc) a = _mm512_setzero_ps();
  if (Mode != 2) products<0>(0);
  for (int b = 0; b < kBlocks; ++b) {
    if (Mode != 2 && b + 1 < kBlocks) {
      if (b % 2 == 0) products<4>(b + 1);
      else products<0>(b + 1);
    }
    if (Mode == 1) continue;
    const __m512 e = _mm512_load_ps(E + 16 * b);
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r)
      acc[r] = _mm512_add_ps(
          acc[r], _mm512_scalef_ps(_mm512_load_ps(C[b % 2][r]), _mm512_add_ps(e, _mm512_set1_ps(EW[r * kBlocks + b]))));
  }
  __m512 s = acc[0];
  for (int r = 1; r < 16; ++r) s = _mm512_add_ps(s, acc[r]);
  return _mm512_reduce_add_ps(s);
}

template <class F>
double best_tsc(F&& f, int reps = 400) {
  uint64_t best = ~0ull;
  for (int k = 0; k < reps; ++k) {
    const uint64_t t0 = __rdtsc();
    f();
    best = std::min<uint64_t>(best, __rdtsc() - t0);
  }
  return double(best);
}

static uint16_t bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t(u >> 16);
}

int main() {
  if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0) {
    std::puts("no AMX here (or the OS refuses it)");
    return 1;
  }
  std::mt19937 g(1);
  for (auto& w : W) w = bf16(float(int(g() % 25) - 12));
  for (auto& a : A) a = bf16(float(g() % 256));
  for (auto& e : E) e = 0.f;
  for (auto& e : EW) e = 0.f;
  static const amx::TileConfig config = amx::full_tiles();
  amx::configure(config);
  const int n = 1000;
  std::printf("tileloadd  %.1f cycles\n", best_tsc([&] {
                for (int i = 0; i < n; ++i) amx::load<1>(W, 64), amx::load<2>(A, 64), amx::load<3>(A + 512, 64);
              }, 20) / (3 * n));
  std::printf("tdpbf16ps  %.1f cycles (four independent sums)\n", best_tsc([&] {
                for (int i = 0; i < n; ++i) {
                  amx::dot_bf16<0, 1, 2>();
                  amx::dot_bf16<4, 1, 3>();
                  amx::dot_bf16<5, 1, 2>();
                  amx::dot_bf16<6, 1, 3>();
                }
              }, 20) / (4 * n));
  std::printf("tilestored %.1f cycles\n", best_tsc([&] {
                for (int i = 0; i < n; ++i) amx::store<0>(C[0], 64), amx::store<4>(C[1], 64);
              }, 20) / (2 * n));
  float sink = 0;
  const double both = best_tsc([&] { sink += loop<0>(); }) / kBlocks;
  const double tiles = best_tsc([&] { sink += loop<1>(); }) / kBlocks;
  const double vectors = best_tsc([&] { sink += loop<2>(); }) / kBlocks;
  std::printf("a block (16 rows x 16 tokens): products %.1f, scaling %.1f, both %.1f cycles (%g)\n", tiles,
              vectors, both, double(sink) * 0);
  amx::release();
}
