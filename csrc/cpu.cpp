#include "cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace gd {

bool cpu_has_avx2() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
  }();
  return has;
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#if defined(GOOSEDUMP_AVX512_EMULATED)
  return cpu_has_avx2();   // tests/test_avx512.py: SIMDe's portable AVX-512 stands in for the instructions
#elif defined(__x86_64__) || defined(__i386__)
  static const bool has = [] {
    __builtin_cpu_init();   // (libgcc checks the OS saves the AVX-512 state too)
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  }();
  return has;
#else
  return false;
#endif
}

bool cpu_has_vbmi() {
  static const bool has = [] {
    const char* forced = std::getenv("GOOSEDUMP_AVX512_VBMI");
    const bool off = forced != nullptr && forced[0] == '0';
#if defined(GOOSEDUMP_AVX512_EMULATED)
    return cpu_has_avx512() && !off;   // (SIMDe computes either form)
#elif defined(__x86_64__) || defined(__i386__)
    return cpu_has_avx512() && __builtin_cpu_supports("avx512vbmi") && !off;
#else
    (void)off;
    return false;
#endif
  }();
  return has;
}

bool cpu_has_amx() {
  static const bool has = [] {
    const char* off = std::getenv("GOOSEDUMP_AMX");
    if (off != nullptr && off[0] == '0') return false;
#if defined(GOOSEDUMP_AVX512_EMULATED)
    return cpu_has_avx512();   // tests/test_avx512.py: amx.h computes the tiles' instructions
#elif defined(__linux__) && defined(__x86_64__)
    unsigned a, b, c, d;
    // leaf 7: EDX bit 22 AMX-BF16, bit 24 AMX-TILE; the OS's XCR0 bits 17
    // and 18 (the tiles' configuration and data), then the permission
    if (!cpu_has_avx512() || !__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24)))
      return false;
    unsigned lo, hi;
    asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return false;
    constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
#else
    return false;
#endif
  }();
  return has;
}

bool cpu_splits_256() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool splits = [] {
    const char* forced = std::getenv("GOOSEDUMP_AVX2_HALVES");
    if (forced != nullptr && forced[0] != '\0') return forced[0] != '0';
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
    const bool amd = b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163;     // "AuthenticAMD"
    const bool hygon = b == 0x6f677948 && d == 0x6e65476e && c == 0x656e6975;   // "HygonGenuine"
    if (!(amd || hygon) || !__get_cpuid(1, &a, &b, &c, &d)) return false;
    const unsigned family = ((a >> 8) & 0xF) + ((a >> 20) & 0xFF), model = ((a >> 4) & 0xF) | ((a >> 12) & 0xF0);
    return (amd && family == 0x17 && model < 0x30) || (hygon && family == 0x18);
  }();
  return splits;
#else
  return false;
#endif
}

bool cpu_has_neon() {
#if defined(__aarch64__)
  return true;
#else
  return false;
#endif
}

const char* impl_name(Impl impl) {
  switch (impl) {
    case Impl::Generic: return "generic";
    case Impl::Avx2: return "avx2";
    case Impl::Avx512: return "avx512";
    case Impl::Neon: return "neon";
    default: return "auto";
  }
}

const Impl* available_impls(int& count) {
  static const Impl x86[] = {Impl::Generic, Impl::Avx2, Impl::Avx512};
  static const Impl arm[] = {Impl::Generic, Impl::Neon};
  static const Impl plain[] = {Impl::Generic};
  if (cpu_has_avx512()) return count = 3, x86;
  if (cpu_has_avx2()) return count = 2, x86;
  if (cpu_has_neon()) return count = 2, arm;
  return count = 1, plain;
}

namespace {

// What auto runs: the widest path this CPU has. AVX-512 was measured
// against AVX2 on an AMD EPYC Zen 5 (benchmarks/kernel_paths.py, 2 threads):
// faster on every hot shape, one token and 128 (docs/performance.md, the Zen 5 section's table).
Impl best() {
  int n = 0;
  const Impl* paths = available_impls(n);
  return paths[n - 1];
}

bool runs_here(Impl impl) {
  int n = 0;
  const Impl* paths = available_impls(n);
  return std::find(paths, paths + n, impl) != paths + n;
}

std::string expected() {
  int n = 0;
  const Impl* paths = available_impls(n);
  std::string s = "auto";
  for (int i = 0; i < n; ++i) s += std::string(i + 1 < n ? ", " : " or ") + impl_name(paths[i]);
  return s;
}

}  // namespace

Impl resolve_impl(Impl requested) {
  if (requested == Impl::Generic) return Impl::Generic;
  if (requested != Impl::Auto) {
    if (!runs_here(requested))
      throw std::invalid_argument(std::string("impl='") + impl_name(requested) +
                                  "': this CPU cannot run it; expected " + expected());
    return requested;
  }
  // GOOSEDUMP_ISA=generic|avx2|avx512|neon forces a path (GOOSEDUMP_NO_SIMD=1:
  // generic, the older spelling); unset or auto: the best the CPU has. A path
  // the CPU lacks, or a name not known, is an error at the first kernel call.
  static const Impl chosen = [] {
    const char* no_simd = std::getenv("GOOSEDUMP_NO_SIMD");
    if (no_simd != nullptr && no_simd[0] != '\0' && no_simd[0] != '0') return Impl::Generic;
    const char* isa = std::getenv("GOOSEDUMP_ISA");
    const std::string v = isa ? isa : "";
    if (v.empty() || v == "auto") return best();
    for (Impl i : {Impl::Generic, Impl::Avx2, Impl::Avx512, Impl::Neon})
      if (v == impl_name(i)) return runs_here(i) ? i : Impl::Auto;   // Auto: reported below
    return Impl::Auto;
  }();
  if (chosen == Impl::Auto) {
    const char* isa = std::getenv("GOOSEDUMP_ISA");
    throw std::invalid_argument(std::string("GOOSEDUMP_ISA=") + (isa ? isa : "") + ": expected " + expected() +
                                " on this CPU");
  }
  return chosen;
}

}  // namespace gd
