// The small per-token pieces around the big products: RMS norm, RoPE and
// the MoE router. Native so that a decoded token does not pay numpy's per-call
// overhead 72 times per pass; each row is computed alone, in a fixed order
// (batch-invariant, like the products).
#pragma once
#include <cstddef>
#include <cstdint>

#include "cpu.h"

namespace gd {

// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, rows of D floats.
void rms_norm(const float* x, const float* w, size_t T, size_t D, float eps, float* out, Impl impl);
// x[t] += add[t] (the residual stream), then out[t] the rms_norm of it:
// one call where decode's Python took two, each slow with the caches cold.
void add_rms_norm(float* x, const float* add, const float* w, size_t T, size_t D, float eps, float* out, Impl impl);

// NeoX RoPE in place on x [T, H, d]: each head's first half pairs with its
// second half, by cos and sin [T, d/2] of the token's position.
void rope(float* x, size_t T, size_t H, size_t d, const float* cos, const float* sin);

// A layer's router on h [T, D] with W [E, D] and bias [E]: per token, the
// logits W h + bias, the k largest in descending order (ties: the lowest
// index first) into top [T, k], and their softmax into weights [T, k].
void route(const float* W, const float* bias, size_t E, size_t D, const float* h, size_t T, size_t k,
           int64_t* top, float* weights, Impl impl);

}  // namespace gd
