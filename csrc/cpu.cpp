#include "cpu.h"

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

Impl resolve_impl(Impl requested) {
  if (requested == Impl::Generic) return Impl::Generic;
  if (requested == Impl::Avx2) {
    if (!cpu_has_avx2()) throw std::invalid_argument("this CPU lacks AVX2/FMA/F16C; use impl='generic'");
    return Impl::Avx2;
  }
  // GOOSEDUMP_ISA=generic|avx2 forces a path (GOOSEDUMP_NO_SIMD=1: generic,
  // the older spelling); unset or auto: the best the CPU has. A path the CPU
  // lacks, or a name not known, is an error at the first kernel call.
  static const Impl chosen = [] {
    const char* no_simd = std::getenv("GOOSEDUMP_NO_SIMD");
    if (no_simd != nullptr && no_simd[0] != '\0' && no_simd[0] != '0') return Impl::Generic;
    const char* isa = std::getenv("GOOSEDUMP_ISA");
    const std::string v = isa ? isa : "";
    if (v.empty() || v == "auto") return cpu_has_avx2() ? Impl::Avx2 : Impl::Generic;
    if (v == "generic") return Impl::Generic;
    if (v == "avx2") {
      if (!cpu_has_avx2()) return Impl::Auto;   // reported below
      return Impl::Avx2;
    }
    return Impl::Auto;
  }();
  if (chosen == Impl::Auto) {
    const char* isa = std::getenv("GOOSEDUMP_ISA");
    throw std::invalid_argument(std::string("GOOSEDUMP_ISA=") + (isa ? isa : "") +
                                ": expected auto, generic or avx2" +
                                (cpu_has_avx2() ? "" : " (this CPU lacks AVX2/FMA/F16C: auto or generic)"));
  }
  return chosen;
}

}  // namespace gd
