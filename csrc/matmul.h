// Quantized weights times float activations: Y[t, n] = sum_k W[n, k] X[t, k]
// (+ bias[n]). Weights stay in their block format and are dequantized in
// registers; activations enter as fp32 and are multiplied in the precision
// Acts names (int16 blocks by default, fp32 on request; never 8-bit, which
// sits 50-1000x further from the reference), accumulation is fp32. Rows are
// split over the thread pool; up to 8 tokens share each weight block.
#pragma once
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "cpu.h"
#include "formats.h"

namespace gd {

// Precision of the activations inside a product:
//   F32: fp32 times the dequantized weights, fp32 accumulation;
//   I16: each 32-block of activations scaled to int16 by a power of two
//        (error at most 2^-15 of the block's largest value, 128x finer than
//        llama.cpp's 8-bit blocks and 16x finer than the fp16 KV cache), exact int32 block
//        sums of int16 x weight codes, then fp32 accumulation of the scaled
//        block sums. Half the instructions per weight of F32.
enum class Acts { F32, I16 };

void matmul(Format f, const uint8_t* W, size_t N, size_t K, const float* X, size_t ldx, size_t T,
            float* Y, size_t ldy, const float* bias, Impl impl, Acts acts = Acts::I16);

// Greedy decoding without writing the logits: the row n with the largest
// W[n] . x (+ bias[n]); ties go to the lowest n. Returns (n, value).
struct ArgMax { size_t index; float value; };
ArgMax matvec_argmax(Format f, const uint8_t* W, size_t N, size_t K, const float* x, Impl impl,
                     Acts acts = Acts::I16);

// Whether the I16 form of activations for weights of format f, as the path
// impl (resolved) reads them, holds each block in act_slot's even/odd order:
// MXFP4 on every path but AVX-512's; on AVX2 also the other formats with small codes,
// which it widens by a shift and a mask instead of a cross-lane widening
// (see rows_avx2_i16.cpp's load_codes).
constexpr bool even_odd_acts(Format f, Impl impl) {
  return (f == Format::MXFP4 && impl != Impl::Avx512) || (impl == Impl::Avx2 && small_codes(f));
}

// Whether they are grouped instead: MXFP4, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
// IQ4_NL, Q4_K, Q5_K, IQ4_XS and Q6_K on AVX-512 (not Q2_K and Q3_K, whose
// chunks have two scales, and Q2_K's two minimums, that the lanes mix), whose kernels take eight blocks per vector, four
// activations of each (rows_avx512_grouped.cpp's rows_grouped; a K-quant's
// super-block is one group, its eight 32-value chunks the blocks). Blocks in groups of eight (the row's
// last group padded with zero blocks), each tile's groups one after
// another, a group holding its 256 activations per token: run v of four
// (activations grouped_slot(v, 0..3), v = 0..7) of each of its eight
// blocks in turn, at q[(i + v) * 32 + p * 4 ..] for block p of the group,
// with i = grouped_block(t, 8 g, ..); block p's scale at d[i + p], e[i + p]
// (and for the formats with minimums the sum of its codes times its scale at
// sd[i + p]: exact, an integer below 2^20 times a power of two).
constexpr bool grouped_acts(Format f, Impl impl) {
  switch (f) {
    case Format::MXFP4: case Format::Q8_0: case Format::Q4_0: case Format::Q4_1: case Format::Q5_0:
    case Format::Q5_1: case Format::Q4_K: case Format::Q5_K: case Format::IQ4_NL: case Format::IQ4_XS:
    case Format::Q6_K: return impl == Impl::Avx512;
    default: return false;
  }
}
constexpr size_t kGroup = 8;
// Word i of run v: the block's activations 0, 2, 4, 6, then 1, 3, 5, 7,
// 16..22 even, 17..23 odd, 8..14 even, 9..15 odd, 24..30 even, 25..31 odd
// (the order the kernels widen the codes in: a vpdpwssd lane pairs words
// 0 and 1 or 2 and 3, so each block's products split over two lanes,
// activations 0..3, 8..11, 16..19, 24..27 in the first).
constexpr size_t grouped_slot(size_t v, size_t i) { return 2 * i + (v & 1) + 16 * ((v >> 1) & 1) + 8 * (v >> 2); }
inline size_t grouped_blocks(size_t nb) { return (nb + kGroup - 1) / kGroup * kGroup; }
// Whether a grouped format's products take bytes (its codes, unscaled): all
// but Q6_K's, which go in as int16 (codes times their 16 values' scale);
// only they take the split form and AMX's int8 tiles.
constexpr bool byte_codes(Format f) { return grouped_acts(f, Impl::Avx512) && f != Format::Q6_K; }

// The grouped activations of a few tokens (decode's: split_tokens) split into
// bytes, for the grouped formats' products by vpdpbusd (rows_avx512_grouped.cpp's
// row_split), in the grouped form's order (each group's tokens in turn): per
// group of kGroup blocks, byte i of lane l of vector V belongs to the code
// q = 256 hi + lo that the grouped form holds at 32 (2V + i % 2) + 2 l + i / 2
// of the group's 256 (the same weights meet it). 64-byte aligned: whole-
// vector loads.
constexpr size_t kSplitTokens = 3;   // (the most split_tokens gives)
struct alignas(64) SplitGroup {
  uint8_t lo[4][64];   // each code's low byte (0..255)
  int8_t hi[4][64];    // its high byte (-128..127)
  int32_t c[16];       // the offset's share (MXFP4: -12 times the sum of lane l's
                       // sixteen codes, Q4_0 -8 times, Q5_0 -16 times, the formats
                       // with minimums 0; the signed ones, Q8_0, IQ4_NL, IQ4_XS:
                       // -32768 times the sum of their high bytes)
  union {
    int32_t e[16];     // MXFP4: block l / 2's e (the grouped form's) + 8
    float d[16];       // the others: block l / 2's d
  };
};
// The tokens up to which a format's products take the split form (Q8_0 at
// 3 tokens measured 0.91-0.95x of the grouped form, Q4_0 and Q5_0 1.24-1.41x,
// Intel Xeon with AMX; from 4 on, row pairs).
constexpr size_t split_tokens(Format f) {
  return !byte_codes(f) ? 0 : f == Format::Q8_0 ? 2 : 3;
}

// The grouped formats' products of at least kAmxTokens tokens on the AVX-512
// path run on AMX's tiles where the CPU has them (cpu_has_amx;
// rows_amx.cpp), reading the grouped activations also in AMX's form (amx,
// for amx_format), per tile of 16 tokens and block (blocks in rows_amx.cpp's
// slot order), from the block's int16 codes q = 256 hi + lo: MXFP4's two
// tiles of 16 rows of 64 bytes, bf16 words, the first lo, the second 256 hi,
// row i holding codes 2i and 2i + 1 of each token in turn (tdpbf16ps's
// pairs); Q8_0's (Q4_0's, Q5_0's) two tiles of 8 rows of 64 bytes, the first the lo bytes,
// the second the hi bytes, row i holding codes 4i .. 4i + 3 of each token in
// turn. MXFP4's words are the activations' values, lo and 256 hi times the
// block's scale 2^-k (amx_k: the range of -k); the others' bytes take their
// scale apart, amx_e[(tile nbp + slot) 16 + token]: the block's d. A last
// tile's missing tokens are zeros.
constexpr size_t kAmxTokens = 16;

// The least and greatest power of two that MXFP4's AMX form multiplied its
// blocks' activations by (-k of a scale 2^-k; blocks of zeros aside: none, an
// empty range).
struct AmxExponents {
  int lo = 1, hi = 0;
  bool empty() const { return lo > hi; }
};

bool amx_products(Format f, Impl impl, size_t T);
// The words of amx a block and tile of tokens take: MXFP4's two tiles of 16
// rows of 64 bytes, Q8_0's two of 8 (the second tile starts halfway).
constexpr size_t amx_block_words(Format f) { return (f == Format::MXFP4 ? 2 : 1) * kAmxTokens * 32; }

// An allocator of 64-byte aligned storage: AMX's tile loads of rows that
// straddle two cache lines ran 6x slower (Intel Xeon with AMX).
template <class T>
struct LineAligned {
  using value_type = T;
  LineAligned() = default;
  template <class U>
  LineAligned(const LineAligned<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <class U>
  bool operator==(const LineAligned<U>&) const { return true; }
  template <class U>
  bool operator!=(const LineAligned<U>&) const { return false; }
};

// Activations in the form a product with weights of format f reads: fp32 as
// given, or the I16 form (quantized once, shared by every row; even/odd
// where even_odd_acts says so).
struct ActView {
  Acts acts;
  const float* X;
  size_t ldx;
  bool even_odd = false;
  bool grouped = false;
  std::vector<int16_t> q;
  std::vector<float> d;
  std::vector<int32_t> e;
  std::vector<int32_t> s;   // formats with minimums: each half block's sum of codes
  std::vector<float> sd;    // grouped, with minimums: each block's sum of codes times its d
  std::vector<SplitGroup> split;   // up to split_tokens(f) tokens, grouped: the codes split into bytes
  Format split_format{};           // (the format whose offset and scales it holds)
  std::vector<uint16_t, LineAligned<uint16_t>> amx;   // many tokens on AMX (amx_products): AMX's form
  std::vector<float, LineAligned<float>> amx_e, amx_m;   // (amx_m: sd, in amx_e's places)
  AmxExponents amx_k;
  Format amx_format{};             // (the format whose form it holds)
  ActView(Acts a, Format f, const float* x, size_t ld, size_t T, size_t K, Impl impl);
  // The form a format's products read activations in on the path impl
  // (resolved): fp32, int16 (with half-block sums or without, in natural,
  // even/odd or grouped order); one view serves formats of the same form.
  static int form(Acts a, Format f, Impl impl) {
    if (is_float(f) || a == Acts::F32) return 0;
    return 1 + (has_min(f) ? 1 : 0) + (even_odd_acts(f, impl) ? 2 : 0) + (grouped_acts(f, impl) ? 4 : 0);
  }
};

// Rows [n0, n1) of a product, on the calling thread (for callers that split
// work themselves).
void matmul_rows(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const ActView& a, size_t T,
                 float* Y, size_t ldy, const float* bias, Impl impl);

// The I16 form of activations, in tiles of 8 tokens, each tile block by
// block (a tile's tokens read one run per block): block b of token t at
// q[i*32 ..] with i = act_block(t, b, ..) (matmul.cpp), its scale d[i] = 2^-k,
// a power of two (so that the MXFP4 kernels find a block's whole scale in a
// table: e[i] = 128 - k; the grouped form's -136 - k, rows.h), with k the
// largest that keeps the block's largest value within 32767 (each value
// rounded to within 2^-15 of it).
// With even_odd, activation j of a 32-block sits at act_slot(j): even ones
// first (0, 2, .., 30), then odd ones, the order the AVX2 kernels widen
// small codes in (by a shift and a mask, cheaper there than a cross-lane
// widening).
constexpr int act_slot(int j) { return (j & 1) ? 16 + (j >> 1) : (j >> 1); }

void quantize_acts_i16(const float* X, size_t ldx, size_t T, size_t K, int16_t* q, float* d, int32_t* e,
                       bool even_odd, bool grouped, Impl impl);

// Dequantize whole rows (embedding lookup): out[i] = W[rows[i]].
void get_rows(Format f, const uint8_t* W, size_t K, const int64_t* rows, size_t n_rows, float* out, Impl impl);

}  // namespace gd
