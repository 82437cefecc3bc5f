// A layer's mixture of experts in one native call: tokens grouped by the
// experts routed to them, every chosen expert's gate and up rows in one
// parallel region, SwiGLU, every down row in a second region, then the
// weighted sum. Decode touches 4 experts per layer; doing them together keeps
// both threads streaming weights instead of waiting on 12 small regions.
#pragma once
#include <cstddef>
#include <cstdint>

#include "cpu.h"
#include "matmul.h"

namespace gd {

struct MoeArgs {
  Format gate_fmt, up_fmt, down_fmt;              // each matrix its own (llama-quantize mixes them)
  const uint8_t* gate;  const float* gate_bias;  // [E][F rows of D], [E][F]
  const uint8_t* up;    const float* up_bias;
  const uint8_t* down;  const float* down_bias;  // [E][D rows of F], [E][D]
  size_t E, F, D;
  const float* h;                                 // [T, D]
  size_t T, k;
  const int64_t* experts;                          // [T, k] chosen experts
  const float* weights;                            // [T, k] their weights
  float* out;                                      // [T, D], overwritten
  float alpha, limit;                              // SwiGLU: 1.702, 7
};

void moe(const MoeArgs& a, Impl impl, Acts acts);

}  // namespace gd
