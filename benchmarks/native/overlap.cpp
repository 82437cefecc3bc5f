// How much of the memory's streaming bandwidth a core keeps while it also
// computes: a pass over 1 GiB (2 MiB pages, as the engine's weights) that
// does W units of vector work per 64-byte line, timed from memory and again
// over 256 KiB that stay in the L2, on each thread's own contiguous half, side
// by side in one run. Where the memory and the work overlapped fully, the
// memory column would read min(in-cache, stream); where a core computes and
// waits in turn, it reads 1 / (1 / in-cache + 1 / stream). Decode's one-token
// kernels sit between the two (docs/performance.md, the Intel Xeon with AMX).
//
// A unit of work: one vpmaddwd and one vpaddd on each of the line's two
// 256-bit halves, into independent accumulators (AVX2, so it runs on every
// x86 machine kind the project is measured on). The line kPrefetch bytes
// ahead is prefetched, as the kernels do (rows.h's kPrefetchAhead); "no
// prefetch" rows leave it to the hardware.
//
//   g++ -O2 -std=c++17 -pthread -Icsrc benchmarks/native/overlap.cpp -o overlap && ./overlap [threads]
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "rows.h"

constexpr size_t kPrefetch = gd::kPrefetchAhead;

template <int W, bool Prefetch>
__attribute__((target("avx2"), noinline)) int pass(const uint8_t* p, size_t n) {
  __m256i acc[2 * (W > 0 ? W : 1)];
  for (auto& a : acc) a = _mm256_setzero_si256();
  const __m256i k = _mm256_set1_epi16(3);
  for (size_t i = 0; i < n; i += 64) {
    if constexpr (Prefetch) __builtin_prefetch(p + i + kPrefetch, 0, 3);
    const __m256i a = _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i));
    const __m256i b = _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32));
    if constexpr (W == 0) {
      acc[0] = _mm256_xor_si256(acc[0], _mm256_xor_si256(a, b));
    } else {
      for (int w = 0; w < W; ++w) {
        acc[2 * w] = _mm256_add_epi32(acc[2 * w], _mm256_madd_epi16(a, k));
        acc[2 * w + 1] = _mm256_add_epi32(acc[2 * w + 1], _mm256_madd_epi16(b, k));
      }
    }
  }
  __m256i s = acc[0];
  for (size_t j = 1; j < sizeof(acc) / sizeof(acc[0]); ++j) s = _mm256_add_epi32(s, acc[j]);
  return _mm256_extract_epi32(s, 0);
}

// GB/s of `reps` passes over [p, p + len), each thread over its own half.
template <int W, bool Prefetch>
double rate(const uint8_t* p, size_t len, int reps, int threads) {
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    std::vector<std::thread> pool;
    std::vector<int> sink(threads);
    const auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const size_t part = len / threads / 64 * 64;
        for (int k = 0; k < reps; ++k) sink[t] += pass<W, Prefetch>(p + t * part, part);
      });
    for (auto& th : pool) th.join();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return double(len) * reps / best / 1e9;
}

struct Buffers {
  const uint8_t *big, *small;
  size_t n_big, n_small;
};

template <int W, bool Prefetch>
void row(const Buffers& b, int threads, double stream) {
  const double mem = rate<W, Prefetch>(b.big, b.n_big, 1, threads);
  const double cache = rate<W, Prefetch>(b.small, b.n_small, int(b.n_big / b.n_small / 4), threads);
  const double serial = 1 / (1 / cache + 1 / stream), full = std::min(cache, stream);
  std::printf("%5d  %-11s %9.1f %9.1f %8.0f%% %10.1f %10.1f\n", W, Prefetch ? "prefetch" : "no prefetch", cache, mem,
              100 * mem / stream, serial, full);
}

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  if (threads < 1 || threads > 256) {
    std::fprintf(stderr, "overlap: threads must be 1..256, got %s\n", argv[1]);
    return 2;
  }
  const size_t n_big = size_t(1) << 30, n_small = size_t(256) << 10;
  uint8_t* big = static_cast<uint8_t*>(std::aligned_alloc(size_t(2) << 20, n_big + kPrefetch));
  uint8_t* small = static_cast<uint8_t*>(std::aligned_alloc(64, n_small + kPrefetch));
  if (!big || !small) {
    std::fprintf(stderr, "overlap: cannot allocate 1 GiB\n");
    return 1;
  }
  madvise(big, n_big, MADV_HUGEPAGE);
  std::memset(big, 1, n_big + kPrefetch);
  std::memset(small, 1, n_small + kPrefetch);
  const Buffers b{big, small, n_big, n_small};
  const double stream = rate<0, true>(big, n_big, 1, threads);
  std::printf("%d threads; the stream (loads only, prefetched): %.1f GB/s\n", threads, stream);
  std::printf("%5s  %-11s %9s %9s %9s %10s %10s\n", "work", "", "in-cache", "memory", "of stream", "if serial",
              "if overlap");
  row<1, false>(b, threads, stream);
  row<1, true>(b, threads, stream);
  row<2, true>(b, threads, stream);
  row<4, true>(b, threads, stream);
  row<6, true>(b, threads, stream);
  row<8, true>(b, threads, stream);
  row<12, true>(b, threads, stream);
  std::free(big);
  std::free(small);
  return 0;
}
