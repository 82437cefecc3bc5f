// Attention over the fp16 KV cache, with GPT-OSS's sinks and sliding window.
#pragma once
#include <cstddef>
#include <cstdint>

#include "cpu.h"

namespace gd {

struct AttentionArgs {
  const float* q;        // [T, H, d] queries, already rotated
  size_t T, H, d;
  // Head-major: a kv head's positions are one contiguous run, so a task (a
  // query and a kv head) reads its keys and values as two sequential streams
  // (position-major, a head's rows lay a whole position apart: at decode,
  // with the cache cold, 1.5x slower).
  const uint16_t* k;     // [KH, cap, d] fp16 keys; position j lives in slot j % cap
  const uint16_t* v;     // [KH, cap, dv] fp16 values
  size_t KH, cap, dv;
  const float* sinks;    // [H] learned logit per head, or nullptr
  size_t pos0;           // position of query 0; query t is at pos0 + t
  size_t window;         // attend to the last `window` positions (0: all)
  float scale;           // 1/sqrt(d)
  float* out;            // [T, H, dv]
};

// For query t (position p) and head h, with kv head h / (H / KH):
//   s_j = scale * q . k_j for j in [max(0, p - window + 1), p]
//   out = sum_j softmax([s..., sink_h])_j v_j   (the sink column has no value)
void attention(const AttentionArgs& a, Impl impl);
// What attention refuses (std::invalid_argument), checked alone: before
// store_kv writes into a cache that the queries could not read.
void check_attention(const AttentionArgs& a);

// New tokens' keys k [T, KH, d] and values v [T, KH, dv] into the cache
// (AttentionArgs' layout, cap positions), position pos0 + t at slot
// (pos0 + t) % cap, as fp16 by fp32_to_fp16 (quants.h): the same bits on
// every path.
void store_kv(const float* k, const float* v, size_t T, size_t KH, size_t d, size_t dv, uint16_t* kc, uint16_t* vc,
              size_t cap, size_t pos0, Impl impl);

}  // namespace gd
