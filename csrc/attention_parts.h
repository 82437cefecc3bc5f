// Internal to attention.cpp and attention_avx512.cpp: how a task walks the
// KV cache's slots and prefetches it, and the AVX-512 kernel's entry.
#pragma once
#include <cstddef>
#include <cstdint>

#include "attention.h"

namespace gd {

// The KV slot after `slot` in a cache of `cap` positions (slots wrap): a
// loop over positions steps its slot instead of dividing (a 64-bit modulo
// per position cost as much as the position's dot products).
inline size_t next_slot(size_t slot, size_t cap) { return slot + 1 == cap ? 0 : slot + 1; }
// The slot `steps` positions after `slot`.
inline size_t slot_after(size_t slot, size_t steps, size_t cap) {
  slot += steps;
  while (slot >= cap) slot -= cap;
  return slot;
}

// At decode the KV cache is cold (the weights streamed since the layer last
// ran have evicted it): the scores' loop prefetches the key row kKvAhead
// positions on and the value row of the position at hand (the values' pass
// comes after the softmax, then from the L2).
constexpr size_t kKvAhead = 16;

inline void prefetch_row(const uint16_t* row, size_t values) {
  for (size_t b = 0; b < values * sizeof(uint16_t); b += 64) __builtin_prefetch(reinterpret_cast<const char*>(row) + b);
}

// The prefetches of position j (at `slot`) in the scores' loop of kv head kh.
inline void prefetch_kv(const AttentionArgs& a, size_t kh, size_t j, size_t n, size_t slot) {
  if (j + kKvAhead < n) prefetch_row(a.k + (kh * a.cap + slot_after(slot, kKvAhead, a.cap)) * a.d, a.d);
  prefetch_row(a.v + (kh * a.cap + slot) * a.dv, a.dv);
}

// AVX-512's values' pass takes the positions in blocks of kValueBlock, each
// block's value rows read once from the L2 into the L1 and kept there
// while both 32-dimension slices of the output pass over them (a task's
// partial sums wait in its output between blocks: the same sums in the
// same order). One pass per slice over all positions read each value row
// once per slice, from the L2 or, past 2 MB of a head's keys and values
// (8,000 positions), from the L3: blocks 1.03-1.07x over 8,192 positions
// (Intel Xeon with AMX).
constexpr size_t kValueBlock = 256;

#if defined(__x86_64__) || defined(__i386__)
// AVX-512's form of the group-of-8 kernel (8 query heads per kv head, d a
// multiple of 8 up to kMaxHeadDim, dv a multiple of 32): two positions a
// vector, the same bits as attend_group8_avx2 (attention_avx512.cpp).
constexpr size_t kMaxHeadDim = 256;
void attend_group8_avx512(const AttentionArgs& a, size_t t, size_t kh, size_t lo, size_t n, float* scores);
#endif

}  // namespace gd
