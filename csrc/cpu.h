// Run-time CPU feature checks: SIMD kernels are compiled with target
// attributes (x86) or for the architecture's baseline (ARM's Advanced SIMD,
// NEON, is part of every AArch64 CPU) and only called when the CPU has them.
#pragma once

namespace gd {

// True when the CPU (and OS) support AVX2, FMA and F16C.
bool cpu_has_avx2();
// True when the CPU (and OS) support AVX-512 F, BW, VL and VNNI besides
// AVX2 (Intel Cascade Lake and later, AMD Zen 4 and later; Skylake-SP lacks
// VNNI, and runs AVX2).
bool cpu_has_avx512();
// True when the AVX-512 path's grouped kernels (matmul.h's grouped_acts) take their form with
// VBMI's byte permutes (Ice Lake and later, Zen 4 and later; Cascade Lake
// and Cooper Lake lack VBMI and take the form by qword and word permutes,
// the same bits). GOOSEDUMP_AVX512_VBMI=0 takes the form without VBMI anywhere.
bool cpu_has_vbmi();
// True when the CPU has AMX's tiles and their bf16 products (Intel Sapphire
// Rapids and later Xeons) and the OS lets this process use them (Linux asks
// for it: arch_prctl's ARCH_REQ_XCOMP_PERM, requested here once). The
// AVX-512 path then runs MXFP4's, Q8_0's, Q4_0's and Q5_0's products of many tokens on
// them (rows_amx.cpp), the same bits; GOOSEDUMP_AMX=0 keeps them off.
bool cpu_has_amx();
// True where the core runs each 256-bit operation as two 128-bit halves
// (AMD Zen 1 and Zen+: family 17h below model 30h, and Hygon's Dhyana), for
// the AVX2 kernels' forms tuned to it. GOOSEDUMP_AVX2_HALVES=1 or 0 decides
// instead (the tests run both forms on any AVX2 CPU).
bool cpu_splits_256();
// True on AArch64 (NEON with fp16 conversions is baseline there).
bool cpu_has_neon();

// Which implementation a kernel call uses.
enum class Impl { Auto, Generic, Avx2, Avx512, Neon };

// The revision of the kernels' arithmetic: raised whenever a path's order of
// operations changes, so results saved by an earlier build (the prompt
// cache's keys and values) are not taken for this one's.
constexpr int kNumerics = 13;

// The AVX-512 path runs the AVX2 kernels where it has none of its own.
inline bool uses_avx2(Impl impl) { return impl == Impl::Avx2 || impl == Impl::Avx512; }

const char* impl_name(Impl impl);   // "generic", "avx2", "avx512", "neon" ("auto" for Auto)
// The paths this CPU can run: Generic first, the widest last (what auto
// runs: see cpu.cpp's best()).
const Impl* available_impls(int& count);

// Resolve Auto against the CPU and the GOOSEDUMP_ISA (or GOOSEDUMP_NO_SIMD)
// environment variable; throw std::invalid_argument if a path is asked for
// that the CPU lacks or that is not known.
Impl resolve_impl(Impl requested);

}  // namespace gd
