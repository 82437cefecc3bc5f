// Runs one of the kernels' paths and the portable reference on the same
// inputs, built from the extension's own sources (no Python) with the path
// as GD_PATH: Neon for tests/test_neon.py (cross-compiled with
// aarch64-linux-gnu-g++, run under qemu-aarch64), Avx512 for
// tests/test_avx512.py (SIMDe's portable AVX-512 in place of the
// instructions).
//
//   path_check CASES OUT
//
// CASES is a sequence of cases, each a header of little-endian int32s then
// its data; OUT gets, per case, the results of every path as float32:
//   kind 0, a product: fmt, N, K, T, acts (0 f32, 1 i16); N rows of weights
//     (row_bytes each), T x K float activations, N float biases.
//     Writes Y (T x N) for the path, for the reference, and the path token by token.
//   kind 1, attention: T, H, d, cap, KH, dv, pos0, window, has_sinks; then
//     q (T x H x d floats), k and v (KH x cap x d / dv fp16 bits), sinks (H
//     floats, when has_sinks). Writes out (T x H x dv) for the path and the
//     reference.
//   kind 2, the KV store: T, KH, d, dv, cap, pos0; then k (T x KH x d) and v
//     (T x KH x dv) floats. Writes the fp16 bits of the key cache, then the
//     value cache (KH x cap x d / dv, zeros where no position went) for the
//     path and the reference.
#include <cstdint>
#include <cstdio>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention.h"
#include "formats.h"
#include "matmul.h"
#include "threads.h"

#ifndef GD_PATH
#define GD_PATH Neon
#endif

namespace {

constexpr gd::Impl kPath = gd::Impl::GD_PATH;

struct Reader {
  FILE* f;
  int32_t i32() {
    int32_t v;
    if (std::fread(&v, 4, 1, f) != 1) throw std::runtime_error("truncated case file");
    return v;
  }
  template <class T>
  std::vector<T> array(size_t n) {
    std::vector<T> v(n);
    if (n && std::fread(v.data(), sizeof(T), n, f) != n) throw std::runtime_error("truncated case file");
    return v;
  }
};

void write(FILE* out, const std::vector<float>& v) { std::fwrite(v.data(), 4, v.size(), out); }

void product(Reader& r, FILE* out) {
  const gd::Format f = gd::Format(r.i32());
  const size_t N = size_t(r.i32()), K = size_t(r.i32()), T = size_t(r.i32());
  const gd::Acts acts = r.i32() ? gd::Acts::I16 : gd::Acts::F32;
  const auto W = r.array<uint8_t>(N * gd::row_bytes(f, K));
  const auto X = r.array<float>(T * K);
  const auto bias = r.array<float>(N);
  std::vector<float> path(T * N), ref(T * N), alone(T * N);
  gd::matmul(f, W.data(), N, K, X.data(), K, T, path.data(), N, bias.data(), kPath, acts);
  gd::matmul(f, W.data(), N, K, X.data(), K, T, ref.data(), N, bias.data(), gd::Impl::Generic, acts);
  for (size_t t = 0; t < T; ++t)
    gd::matmul(f, W.data(), N, K, X.data() + t * K, K, 1, alone.data() + t * N, N, bias.data(), kPath,
               acts);
  write(out, path);
  write(out, ref);
  write(out, alone);
}

void attention(Reader& r, FILE* out) {
  gd::AttentionArgs a{};
  a.T = size_t(r.i32()), a.H = size_t(r.i32()), a.d = size_t(r.i32());
  a.cap = size_t(r.i32()), a.KH = size_t(r.i32()), a.dv = size_t(r.i32());
  a.pos0 = size_t(r.i32()), a.window = size_t(r.i32());
  const bool sinks = r.i32() != 0;
  const auto q = r.array<float>(a.T * a.H * a.d);
  const auto k = r.array<uint16_t>(a.cap * a.KH * a.d);
  const auto v = r.array<uint16_t>(a.cap * a.KH * a.dv);
  const auto s = r.array<float>(sinks ? a.H : 0);
  a.q = q.data(), a.k = k.data(), a.v = v.data(), a.sinks = sinks ? s.data() : nullptr;
  a.scale = 1.f / std::sqrt(float(a.d));
  std::vector<float> path(a.T * a.H * a.dv), ref(a.T * a.H * a.dv);
  a.out = path.data();
  gd::attention(a, kPath);
  a.out = ref.data();
  gd::attention(a, gd::Impl::Generic);
  write(out, path);
  write(out, ref);
}

void store(Reader& r, FILE* out) {
  const size_t T = size_t(r.i32()), KH = size_t(r.i32()), d = size_t(r.i32()), dv = size_t(r.i32());
  const size_t cap = size_t(r.i32()), pos0 = size_t(r.i32());
  const auto k = r.array<float>(T * KH * d);
  const auto v = r.array<float>(T * KH * dv);
  for (gd::Impl impl : {kPath, gd::Impl::Generic}) {
    std::vector<uint16_t> kc(KH * cap * d), vc(KH * cap * dv);
    gd::store_kv(k.data(), v.data(), T, KH, d, dv, kc.data(), vc.data(), cap, pos0, impl);
    std::fwrite(kc.data(), 2, kc.size(), out);
    std::fwrite(vc.data(), 2, vc.size(), out);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: path_check CASES OUT\n");
    return 2;
  }
  try {
    gd::resolve_impl(kPath);   // (throws where the path does not run here)
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  gd::set_num_threads(2);
  Reader r{std::fopen(argv[1], "rb")};
  FILE* out = std::fopen(argv[2], "wb");
  if (!r.f || !out) {
    std::fprintf(stderr, "cannot open the case or output file\n");
    return 2;
  }
  int cases = 0;
  try {
    for (int kind; std::fread(&kind, 4, 1, r.f) == 1; ++cases) {
      if (kind == 0) product(r, out);
      else if (kind == 1) attention(r, out);
      else if (kind == 2) store(r, out);
      else throw std::runtime_error("unknown case kind " + std::to_string(kind));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "case %d: %s\n", cases, e.what());
    return 1;
  }
  std::fclose(out);
  std::printf("%d cases\n", cases);
  return 0;
}
