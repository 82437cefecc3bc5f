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

}  // namespace gd
