// The products benchmarks/neon_instructions.py counts: one format's
// product of an N x K matrix (realistic scales, random codes) times T
// tokens, REPS times, on one thread, on the path GOOSEDUMP_ISA names, with
// int16 activations (the default) or fp32 ones (ACTS f32).
//
//   neon_count FORMAT N K T REPS [i16|f32]
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "formats.h"
#include "matmul.h"
#include "threads.h"

int main(int argc, char** argv) {
  if (argc != 6 && argc != 7) {
    std::fprintf(stderr, "usage: neon_count FORMAT N K T REPS [i16|f32]\n");
    return 2;
  }
  const std::string a = argc == 7 ? argv[6] : "i16";
  if (a != "i16" && a != "f32") {
    std::fprintf(stderr, "neon_count: ACTS must be i16 or f32, got %s\n", a.c_str());
    return 2;
  }
  const gd::Acts acts = a == "f32" ? gd::Acts::F32 : gd::Acts::I16;
  const gd::Format f = gd::parse_format(argv[1]);
  const size_t N = std::strtoul(argv[2], nullptr, 10), K = std::strtoul(argv[3], nullptr, 10);
  const size_t T = std::strtoul(argv[4], nullptr, 10), reps = std::strtoul(argv[5], nullptr, 10);
  gd::set_num_threads(1);
  std::mt19937 rng(1);
  std::vector<uint8_t> W(N * gd::row_bytes(f, K));
  for (auto& b : W) b = uint8_t(rng());
  // finite scales where a block starts with one: MXFP4's E8M0 near 2^0, Q8_0's fp16 0x2000
  const size_t bb = size_t(gd::block_bytes(f));
  for (size_t i = 0; i < W.size(); i += bb) {
    if (f == gd::Format::MXFP4) W[i] = uint8_t(120 + rng() % 10);
    if (f == gd::Format::Q8_0) W[i] = 0, W[i + 1] = 0x20;
  }
  std::vector<float> X(T * K), Y(T * N);
  std::normal_distribution<float> normal;
  for (auto& x : X) x = normal(rng);
  for (size_t r = 0; r < reps; ++r)
    gd::matmul(f, W.data(), N, K, X.data(), K, T, Y.data(), N, nullptr, gd::Impl::Auto, acts);
  std::printf("%g\n", double(Y[0]));
  return 0;
}
