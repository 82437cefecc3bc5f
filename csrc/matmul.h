// Quantized weights times float activations: Y[t, n] = sum_k W[n, k] X[t, k]
// (+ bias[n]). Weights stay in their block format and are dequantized in
// registers; activations and accumulation are fp32 (the reference's numbers:
// no 8-bit activations). Rows are split over the thread pool; up to 8 tokens
// share each dequantized weight block.
#pragma once
#include <cstddef>
#include <cstdint>

#include "cpu.h"

namespace gd {

enum class Format { Q8_0, MXFP4 };

size_t row_bytes(Format f, size_t K);

void matmul(Format f, const uint8_t* W, size_t N, size_t K, const float* X, size_t ldx, size_t T,
            float* Y, size_t ldy, const float* bias, Impl impl);

// Greedy decoding without writing the logits: the row n with the largest
// W[n] . x (+ bias[n]); ties go to the lowest n. Returns (n, value).
struct ArgMax { size_t index; float value; };
ArgMax matvec_argmax(Format f, const uint8_t* W, size_t N, size_t K, const float* x, Impl impl);

// Dequantize whole rows (embedding lookup): out[i] = W[rows[i]].
void get_rows(Format f, const uint8_t* W, size_t K, const int64_t* rows, size_t n_rows, float* out, Impl impl);

}  // namespace gd
