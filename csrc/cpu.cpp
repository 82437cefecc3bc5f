#include "cpu.h"

#include <cstdlib>
#include <stdexcept>

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
  static const bool disabled = [] {
    const char* v = std::getenv("GOOSEDUMP_NO_SIMD");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }();
  return (!disabled && cpu_has_avx2()) ? Impl::Avx2 : Impl::Generic;
}

}  // namespace gd
