// Run-time CPU feature checks: SIMD kernels are compiled with target
// attributes (x86) or for the architecture's baseline (ARM's Advanced SIMD,
// NEON, is part of every AArch64 CPU) and only called when the CPU has them.
#pragma once

namespace gd {

// True when the CPU (and OS) support AVX2, FMA and F16C.
bool cpu_has_avx2();
// True on AArch64 (NEON with fp16 conversions is baseline there).
bool cpu_has_neon();

// Which implementation a kernel call uses.
enum class Impl { Auto, Generic, Avx2, Neon };

const char* impl_name(Impl impl);   // "generic", "avx2", "neon" ("auto" for Auto)
// The paths this CPU can run: Generic first, the best last.
const Impl* available_impls(int& count);

// Resolve Auto against the CPU and the GOOSEDUMP_ISA (or GOOSEDUMP_NO_SIMD)
// environment variable; throw std::invalid_argument if a path is asked for
// that the CPU lacks or that is not known.
Impl resolve_impl(Impl requested);

}  // namespace gd
