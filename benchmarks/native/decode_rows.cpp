// The AVX-512 one-token kernel (row_split: the extension's own source,
// included) over a gigabyte of 2880-wide rows in 2 MiB pages, from memory,
// three ways side by side in one run: called row by row in a loop of its
// own, through rows_avx512_grouped 16 rows a call (as matmul's tasks), and
// through gd::matmul and its pool, one 2880-row matrix a call (as decode).
// Each thread sweeps its own half. Where the first reads faster than the
// third, the engine's path costs the difference, not the kernel
// (docs/performance.md, the twenty-ninth session: MXFP4's row pairs 28.3, 26.0-26.7
// and 24.5-25.0 GB/s on 2 threads, Intel Xeon with AMX). Also the kernel's
// rate over 1 MiB that stays in the L2. The kernels' form with VBMI (the
// file's own, included with GD_VBMI); needs AVX-512 F/BW/VL/VNNI/VBMI.
//
//   g++ -O3 -std=c++17 -ffp-contract=off -pthread -Icsrc benchmarks/native/decode_rows.cpp
//       csrc/formats.cpp csrc/cpu.cpp csrc/quants.cpp csrc/matmul.cpp csrc/threads.cpp csrc/peak.cpp
//       csrc/rows_generic.cpp csrc/rows_avx2.cpp csrc/rows_avx2_i16.cpp csrc/rows_avx512.cpp
//       csrc/rows_avx512_grouped.cpp csrc/rows_avx512_float.cpp csrc/rows_amx.cpp -o decode_rows && ./decode_rows [threads] [mxfp4|q8_0] [rounds]
// (one command line)
#define GD_VBMI 1
#include "rows_avx512_grouped.cpp"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu.h"
#include "threads.h"

using namespace gd;

namespace {

constexpr size_t kK = 2880, kMatrix = 2880;   // a matrix's width and rows (decode's experts, attention)

// Rows [0, rows) of W one row_split call at a time (MXFP4's in pairs, Q8_0's
// alone, as rows_avx512_grouped pairs them), their sums added up: no stores
// to an output (a store per 16 rows into lines not in the cache cost this
// loop 6-7%; the other two ways store as the engine does).
template <Format F>
float direct(const uint8_t* W, size_t rows, const SplitGroup* a) {
  constexpr int R = F == Format::MXFP4 ? 2 : 1;
  const size_t rb = row_bytes(F, kK);
  float out[2][kTokenTile], sum = 0.f;
  for (size_t n = 0; n < rows; n += R) {
    const uint8_t* pair[2] = {W + n * rb, W + (n + R - 1) * rb};
    row_split<F, R, 1>(pair, kK / 32, a, nullptr, out);
    sum += out[0][0];
  }
  return sum;
}

// The same rows through rows_avx512_grouped, 16 rows a call.
void tasks(Format f, const uint8_t* W, size_t rows, const I16Acts& a, float* y) {
  for (size_t n0 = 0; n0 < rows; n0 += 16)
    rows_avx512_grouped(f, W, n0, std::min(rows, n0 + 16), kK, a, 1, y, rows, nullptr);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (!cpu_has_avx512() || !cpu_has_vbmi()) {
    std::fprintf(stderr, "decode_rows: this CPU lacks the AVX-512 path's instructions with VBMI (F/BW/VL/VNNI/VBMI)\n");
    return 2;
  }
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const std::string fmt = argc > 2 ? argv[2] : "mxfp4";
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 5;
  if (threads < 1 || (fmt != "mxfp4" && fmt != "q8_0") || rounds < 1) {
    std::fprintf(stderr, "usage: decode_rows [threads >= 1] [mxfp4|q8_0] [rounds >= 1]\n");
    return 2;
  }
  const Format f = fmt == "q8_0" ? Format::Q8_0 : Format::MXFP4;
  const size_t rb = row_bytes(f, kK), matrix = kMatrix * rb;
  const size_t n_mats = (size_t(1) << 30) / matrix, total = n_mats * matrix;
  auto* big = static_cast<uint8_t*>(std::aligned_alloc(size_t(2) << 20, (total + (size_t(2) << 20) - 1) &
                                                                           ~((size_t(2) << 20) - 1)));
  madvise(big, total, MADV_HUGEPAGE);
  // valid blocks: random codes, scales of the weights' own range
  std::mt19937 rng(1);
  for (size_t i = 0; i + 4 <= total; i += 4) {
    const uint32_t r = rng();
    std::memcpy(big + i, &r, 4);
  }
  for (size_t i = 0; i + block_bytes(f) <= total; i += block_bytes(f)) {
    if (f == Format::MXFP4) {
      big[i] = uint8_t(120 + (big[i] & 7));
    } else {
      const uint16_t h = uint16_t(0x2000 | big[i]);
      std::memcpy(big + i, &h, 2);
    }
  }
  std::vector<float> x(kK);
  for (auto& v : x) v = float(rng() % 2001) / 1000.f - 1.f;
  set_num_threads(threads);
  const ActView acts(Acts::I16, f, x.data(), kK, 1, kK, Impl::Avx512);
  const I16Acts ia{acts.q.data(), acts.d.data(), acts.e.data(), nullptr, acts.even_odd, acts.split.data()};
  const size_t share = kMatrix / threads / 2 * 2;   // each thread's rows of a matrix (even: whole pairs)

  // One way over the gigabyte: each thread its share of every matrix, a
  // barrier after each matrix (as the engine's regions); GB/s of weights.
  auto own_threads = [&](auto sweep) {
    std::atomic<int> arrived{0};
    std::vector<std::thread> pool;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < threads; ++i)
      pool.emplace_back([&, i] {
        std::vector<float> y(kMatrix);
        for (size_t m = 0; m < n_mats; ++m) {
          sweep(big + m * matrix + i * share * rb, share, y.data());
          arrived.fetch_add(1);
          while (arrived.load() < int((m + 1) * threads)) _mm_pause();
        }
      });
    for (auto& t : pool) t.join();
    return double(n_mats * share * threads * rb) / seconds_since(t0) / 1e9;
  };
  auto by_matmul = [&] {
    std::vector<float> y(kMatrix);
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t m = 0; m < n_mats; ++m)
      matmul(f, big + m * matrix, kMatrix, kK, x.data(), kK, 1, y.data(), kMatrix, nullptr, Impl::Avx512);
    return double(total) / seconds_since(t0) / 1e9;
  };
  auto in_l2 = [&] {   // one thread, 1 MiB of rows again and again
    const size_t rows = ((size_t(1) << 20) / rb) / 2 * 2;
    volatile float sink = 0.f;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < 300; ++r)
      sink = sink + (f == Format::MXFP4 ? direct<Format::MXFP4>(big, rows, acts.split.data())
                                        : direct<Format::Q8_0>(big, rows, acts.split.data()));
    return 300.0 * double(rows * rb) / seconds_since(t0) / 1e9;
  };

  std::vector<double> a, b, c, l2;
  for (int round = 0; round < rounds; ++round) {
    a.push_back(own_threads([&](const uint8_t* W, size_t rows, float* y) {
      y[0] = f == Format::MXFP4 ? direct<Format::MXFP4>(W, rows, acts.split.data())
                                : direct<Format::Q8_0>(W, rows, acts.split.data());
    }));
    b.push_back(own_threads([&](const uint8_t* W, size_t rows, float* y) { tasks(f, W, rows, ia, y); }));
    c.push_back(by_matmul());
    l2.push_back(in_l2());
    std::printf("round %d: row_split alone %5.1f, 16 rows a call %5.1f, gd::matmul %5.1f GB/s from memory; "
                "alone in the L2 (1 thread) %5.1f\n",
                round + 1, a.back(), b.back(), c.back(), l2.back());
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  std::printf("%s, %d thread(s), medians of %d rounds: row_split alone %.1f GB/s, 16 rows a call %.1f (%.2fx), "
              "gd::matmul %.1f (%.2fx); in the L2 %.1f on one thread\n",
              fmt.c_str(), threads, rounds, median(a), median(b), median(b) / median(a), median(c),
              median(c) / median(a), median(l2));
  std::free(big);
  return 0;
}
