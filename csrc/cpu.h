// Run-time CPU feature checks: SIMD kernels are compiled with target
// attributes and only called when the CPU has the features.
#pragma once

namespace gd {

// True when the CPU (and OS) support AVX2, FMA and F16C.
bool cpu_has_avx2();

// Which implementation a kernel call uses.
enum class Impl { Auto, Generic, Avx2 };

// Resolve Auto against the CPU and the GOOSEDUMP_NO_SIMD environment
// variable; throw std::invalid_argument if Avx2 is asked for but missing.
Impl resolve_impl(Impl requested);

}  // namespace gd
