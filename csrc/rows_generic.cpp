// The portable reference of the row products: any format, plain C++, a fixed
// order of summation (the chunks in order). The SIMD kernels are tested
// against these and against float64.
#include <stdexcept>
#include <string>
#include <vector>

#include "formats.h"
#include "matmul.h"
#include "rows.h"

namespace gd {

void float_weights_take_f32(Format f) {
  throw std::invalid_argument(std::string("int16 activations: ") + info(f).name + " takes fp32 ones");
}

// Dequantize one row, then plain fp32 dot products.
void rows_generic(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const float* X, size_t ldx,
                  size_t T, float* Y, size_t ldy, const float* bias) {
  std::vector<float> w(K);
  const size_t rb = row_bytes(f, K);
  for (size_t n = n0; n < n1; ++n) {
    dequantize(f, W + n * rb, w.data(), K, Impl::Generic);
    for (size_t t = 0; t < T; ++t) {
      const float* x = X + t * ldx;
      float acc = 0.f;
      for (size_t k = 0; k < K; ++k) acc += w[k] * x[k];
      Y[t * ldy + n] = acc + (bias ? bias[n] : 0.f);
    }
  }
}

// Chunk by chunk: exact int32 sums of codes times int16 activations per half
// (one sum when both halves share a scale), each scaled by the weight's and
// the activation block's scale; the minimums' terms (m times the sum of the
// half's activation codes) in a second accumulator, added at the end.
void rows_generic_i16(Format f, const uint8_t* W, size_t n0, size_t n1, size_t K, const I16Acts& a, size_t T,
                      float* Y, size_t ldy, const float* bias) {
  const size_t rb = row_bytes(f, K), nc = K / 32;
  const bool split = halves_differ(f), mins = has_min(f), even_odd = a.even_odd;
  int8_t w[32];
  float d[2], m[2];
  for (size_t n = n0; n < n1; ++n) {
    const uint8_t* row = W + n * rb;
    for (size_t t = 0; t < T; ++t) {
      float acc = 0.f, accm = 0.f;
      for (size_t c = 0; c < nc; ++c) {
        int sub;
        const uint8_t* blk = chunk_block(f, row, c, sub);   // (sets sub)
        chunk_codes(f, blk, sub, w, d, m);
        const size_t at = act_block(t, c, T, nc);
        const int16_t* q = a.q + at * 32;
        int32_t s[2] = {0, 0};
        for (int j = 0; j < 32; ++j) s[j / 16] += int32_t(w[j]) * q[even_odd ? act_slot(j) : j];
        const float da = a.d[at];
        if (split) acc += float(s[0]) * (d[0] * da) + float(s[1]) * (d[1] * da);
        else acc += float(s[0] + s[1]) * (d[0] * da);
        if (mins) accm += (m[0] * float(a.s[2 * at]) + m[1] * float(a.s[2 * at + 1])) * da;
      }
      Y[t * ldy + n] = acc + accm + (bias ? bias[n] : 0.f);
    }
  }
}

}  // namespace gd
