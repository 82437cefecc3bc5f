#include "matmul.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "quants.h"
#include "rows.h"
#include "threads.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GD_X86 1
#endif

namespace gd {

namespace {

constexpr int kMaxShift = 126;    // activation block scales 2^-k, |k| <= kMaxShift
constexpr size_t kRowsPerTask = 16;

}  // namespace

ActView::ActView(Acts a, Format f, const float* x, size_t ld, size_t T, size_t K, Impl impl)
    : acts(is_float(f) ? Acts::F32 : a), X(x), ldx(ld), even_odd(even_odd_acts(f, impl)),
      grouped(grouped_acts(f, impl)) {
  // Plain-float weights take fp32 activations: their products are exact
  // floats either way, and int16 codes would only lose precision.
  if (acts == Acts::I16) {
    const size_t blocks = T * (grouped ? grouped_blocks(K / kBlock) : K / kBlock);   // (padding: zero blocks)
    q.resize(blocks * kBlock);
    d.resize(blocks);
    e.resize(blocks);
    if (has_min(f) && !grouped) s.resize(2 * T * K / kBlock);
    quantize_acts_i16(X, ldx, T, K, q.data(), d.data(), e.data(), even_odd, grouped, impl);
    if (has_min(f) && grouped) {   // (groups of eight blocks: eight runs of 32 codes, four of each block's a run)
      sd.resize(blocks);
      for (size_t i = 0; i < blocks; i += kGroup)
        for (size_t p = 0; p < kGroup; ++p) {
          int32_t v = 0;
          for (size_t run = 0; run < kGroup; ++run)
            for (size_t l = 0; l < 4; ++l) v += q[(i + run) * kBlock + p * 4 + l];
          sd[i + p] = float(v) * d[i + p];
        }
    }
#ifdef GD_X86
    if (grouped && T <= split_tokens(f)) {   // (grouped: the AVX-512 path)
      split.resize(blocks / kGroup);
      split_acts_avx512(f, q.data(), d.data(), e.data(), split.size(), split.data());
      split_format = f;
    }
    if (amx_products(f, impl, T)) {
      const size_t nbp = grouped_blocks(K / kBlock), tiles = (T + kAmxTokens - 1) / kAmxTokens;
      amx.resize(tiles * nbp * amx_block_words(f));
      if (f != Format::MXFP4) amx_e.resize(tiles * nbp * kAmxTokens);
      if (!sd.empty()) amx_m.resize(tiles * nbp * kAmxTokens);
      amx_format = f;
      if (!amx_acts(f, q.data(), d.data(), e.data(), sd.empty() ? nullptr : sd.data(), T, K / kBlock, amx.data(),
                    amx_e.data(), amx_m.empty() ? nullptr : amx_m.data(), amx_k))
        amx.clear();
    }
#endif
    if (has_min(f) && !grouped)   // the sum of each half block's codes: the minimums' terms need it
      for (size_t i = 0; i < 2 * T * K / kBlock; ++i) {
        const int16_t* b = &q[16 * (i & ~size_t(1))];   // the half's block
        const int h = int(i & 1);
        int32_t v = 0;
        for (int j = 16 * h; j < 16 * h + 16; ++j) v += b[even_odd ? act_slot(j) : j];
        s[i] = v;
      }
  }
}

bool amx_products(Format f, Impl impl, size_t T) {
  return grouped_acts(f, impl) && byte_codes(f) && T >= kAmxTokens && cpu_has_amx();
}

void matmul_rows(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const ActView& a, size_t T,
                 float* Y, size_t ldy, const float* bias, Impl impl) {
  if (a.acts == Acts::I16) {
    if (a.even_odd != even_odd_acts(f, impl) || a.grouped != grouped_acts(f, impl))
      throw std::logic_error(std::string("matmul_rows: activations quantized for another path than ") +
                             impl_name(impl));
    const bool amx = !a.amx.empty() && a.amx_format == f;
    const I16Acts q{a.q.data(), a.d.data(), a.e.data(), a.s.empty() ? nullptr : a.s.data(), a.even_odd,
                    a.split.empty() || a.split_format != f ? nullptr : a.split.data(), amx ? a.amx.data() : nullptr,
                    amx && !a.amx_e.empty() ? a.amx_e.data() : nullptr, a.amx_k,
                    a.sd.empty() ? nullptr : a.sd.data(), amx && !a.amx_m.empty() ? a.amx_m.data() : nullptr};
#ifdef GD_X86
    if (impl == Impl::Avx512) return rows_avx512_i16(f, W, n0, n1, K, q, T, Y, ldy, bias);
    if (impl == Impl::Avx2) return rows_avx2_i16(f, W, n0, n1, K, q, T, Y, ldy, bias);
#endif
#ifdef __aarch64__
    if (impl == Impl::Neon) return rows_neon_i16(f, W, n0, n1, K, q, T, Y, ldy, bias);
#endif
    return rows_generic_i16(f, W, n0, n1, K, q, T, Y, ldy, bias);
  }
#ifdef GD_X86
  if (impl == Impl::Avx512) return rows_avx512(f, W, n0, n1, K, a.X, a.ldx, T, Y, ldy, bias);
  if (uses_avx2(impl)) return rows_avx2(f, W, n0, n1, K, a.X, a.ldx, T, Y, ldy, bias);
#endif
#ifdef __aarch64__
  if (impl == Impl::Neon) return rows_neon(f, W, n0, n1, K, a.X, a.ldx, T, Y, ldy, bias);
#endif
  rows_generic(f, W, n0, n1, K, a.X, a.ldx, T, Y, ldy, bias);
}

namespace {

// A block's shift k: the largest with amax * 2^k <= 32767 (amax = m 2^p, m in
// [0.5, 1): k = 15 - p, one less when m * 2^15 rounds above 32767), within
// the range whose 2^k and 2^-k are normal floats.
inline int block_shift(float amax) {
  if (!(amax > 0.f)) return 0;   // all zero (or NaN: the products carry it on)
  int p = 0;
  const float m = std::frexp(amax, &p);
  return std::clamp(15 - p - (m * 32768.f > 32767.f ? 1 : 0), -kMaxShift, kMaxShift);
}

void quantize_block_generic(const float* x, int16_t* out, int k, bool even_odd) {
  const float s = pow2(k);   // exact scaling, then one rounding (to nearest even)
  for (int j = 0; j < kBlock; ++j) out[even_odd ? act_slot(j) : j] = int16_t(std::lrint(x[j] * s));
}

#ifdef GD_X86
__attribute__((target("avx2,fma,f16c"))) inline float block_amax_avx2(const float* x) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 m = _mm256_and_ps(_mm256_loadu_ps(x), abs_mask);
  for (int i = 8; i < kBlock; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

// The same numbers as quantize_block_generic: cvtps rounds to nearest even.
__attribute__((target("avx2,fma,f16c"))) inline void quantize_block_avx2(const float* x, int16_t* out, int k,
                                                                          bool even_odd) {
  const __m256 s = _mm256_set1_ps(pow2(k));
  __m256i v[4];
  for (int i = 0; i < 4; ++i) v[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), s));
  // packs interleaves 128-bit halves; the permute puts values 0..15 in order
  __m256i a = _mm256_permute4x64_epi64(_mm256_packs_epi32(v[0], v[1]), 0xD8);
  __m256i b = _mm256_permute4x64_epi64(_mm256_packs_epi32(v[2], v[3]), 0xD8);
  if (even_odd) {
    // per 128-bit half: its 4 even values, then its 4 odd ones; then gather
    // the even quarters first: evens 0..30, odds 1..31 (act_slot's order)
    const __m256i split = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                           0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    a = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(a, split), 0xD8);
    b = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(b, split), 0xD8);
    const __m256i evens = _mm256_permute2x128_si256(a, b, 0x20), odds = _mm256_permute2x128_si256(a, b, 0x31);
    a = evens;
    b = odds;
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), a);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16), b);
}
#endif

}  // namespace

void quantize_acts_i16(const float* X, size_t ldx, size_t T, size_t K, int16_t* q, float* d, int32_t* e,
                       bool even_odd, bool grouped, Impl impl) {
  const size_t nb = K / kBlock, nbp = grouped_blocks(nb);
  [[maybe_unused]] const bool avx2 = uses_avx2(resolve_impl(impl));
  for (size_t t = 0; t < T; ++t) {
    for (size_t b = 0; b < nb; ++b) {
      const float* x = X + t * ldx + b * kBlock;
      const size_t run = grouped ? grouped_block(t, b - b % kGroup, T, nbp) : 0;
      const size_t at = grouped ? run + b % kGroup : act_block(t, b, T, nb);
      int16_t block[kBlock];   // (grouped: the block in natural order, then spread over its group)
      int16_t* out = grouped ? block : q + at * kBlock;
      float amax = 0.f;
#ifdef GD_X86
      if (avx2) amax = block_amax_avx2(x);
      else
#endif
        for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
      const int k = block_shift(amax);
      d[at] = pow2(-k);
      e[at] = grouped ? kGroupedScaleBias - k : kScaleBias - k;
#ifdef GD_X86
      if (avx2) quantize_block_avx2(x, out, k, even_odd);
      else
#endif
        quantize_block_generic(x, out, k, even_odd);
      if (grouped)
        for (size_t v = 0; v < 8; ++v)
          for (size_t i = 0; i < 4; ++i) q[(run + v) * kBlock + (b % kGroup) * 4 + i] = block[grouped_slot(v, i)];
    }
  }
}

void matmul(Format f, const uint8_t* W, size_t N, size_t K, const float* X, size_t ldx, size_t T, float* Y,
            size_t ldy, const float* bias, Impl impl, Acts acts) {
  const Impl which = resolve_impl(impl);
  const ActView a(acts, f, X, ldx, T, K, which);
  const size_t n_tasks = (N + kRowsPerTask - 1) / kRowsPerTask;
  parallel_for(n_tasks, [&](size_t task) {
    const size_t n0 = task * kRowsPerTask, n1 = std::min(N, n0 + kRowsPerTask);
    matmul_rows(f, W, n0, n1, K, a, T, Y, ldy, bias, which);
  }, row_bytes(f, K) * N * T);
}

ArgMax matvec_argmax(Format f, const uint8_t* W, size_t N, size_t K, const float* x, Impl impl, Acts acts) {
  const Impl which = resolve_impl(impl);
  const ActView a(acts, f, x, K, 1, K, which);
  constexpr size_t kRows = 256;
  const size_t n_tasks = (N + kRows - 1) / kRows;
  std::vector<ArgMax> best(n_tasks, {0, -std::numeric_limits<float>::infinity()});
  parallel_for(n_tasks, [&](size_t task) {
    const size_t n0 = task * kRows, n1 = std::min(N, n0 + kRows);
    float y[kRows];
    matmul_rows(f, W + n0 * row_bytes(f, K), 0, n1 - n0, K, a, 1, y, 1, nullptr, which);
    ArgMax b{n0, y[0]};
    for (size_t n = n0 + 1; n < n1; ++n)
      if (y[n - n0] > b.value) b = {n, y[n - n0]};
    best[task] = b;
  }, row_bytes(f, K) * N);
  ArgMax out = best[0];
  for (const auto& b : best)
    if (b.value > out.value) out = b;
  return out;
}

void get_rows(Format f, const uint8_t* W, size_t K, const int64_t* idx, size_t n_rows, float* out, Impl impl) {
  const Impl which = resolve_impl(impl);
  const size_t rb = row_bytes(f, K);
  for (size_t i = 0; i < n_rows; ++i) dequantize(f, W + size_t(idx[i]) * rb, out + i * K, K, which);
}

}  // namespace gd
