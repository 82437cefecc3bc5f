// The peak rate of the int16 products' multiply-accumulate instruction on one
// core, measured: how fast a path's products could go if they did nothing
// else, the yardstick benchmarks set prefill against.
#pragma once
#include <cstdint>

#include "cpu.h"

namespace gd {

struct PeakRate {
  double macs_per_s;     // int16 x int16 -> int32 multiply-accumulates per second, one thread
  const char* instruction;
  int macs_per_instruction;
};

// Runs `iterations` rounds of independent chains of the instruction the
// path's int16 products use (AVX2 vpmaddwd + vpaddd, NEON smlal, generic:
// scalar multiply-adds), timed.
PeakRate peak_int16_macs(Impl impl, uint64_t iterations);

// Where the AVX-512 path's many-token products run on AMX's tiles
// (cpu_has_amx): the tiles' peak for int16 products, from `iterations`
// rounds of four independent tdpbf16ps (16 x 16 x 32 bf16 products each; an
// int16 product takes two, its lo and 256 hi halves: 4,096 a tdpbf16ps).
// Elsewhere a rate of 0.
PeakRate peak_amx_macs(uint64_t iterations);

}  // namespace gd
