// Internal to the bindings (module.cpp, module_layer.cpp): the array types
// they take and the parsing of their string arguments.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "cpu.h"
#include "formats.h"
#include "matmul.h"

namespace gd_bind {

namespace nb = nanobind;

using Bytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Int64s = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Int32s = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Floats = nb::ndarray<float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Weights = nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Matrix = nb::ndarray<float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using CMatrix = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using CFloats = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Half3 = nb::ndarray<uint16_t, nb::ndim<3>, nb::c_contig, nb::device::cpu>;
using CFloats3 = nb::ndarray<const float, nb::ndim<3>, nb::c_contig, nb::device::cpu>;
using Floats3 = nb::ndarray<float, nb::ndim<3>, nb::c_contig, nb::device::cpu>;

inline gd::Impl parse_impl(const std::string& impl) {
  if (impl == "auto") return gd::Impl::Auto;
  if (impl == "generic") return gd::Impl::Generic;
  if (impl == "avx2") return gd::Impl::Avx2;
  if (impl == "avx512") return gd::Impl::Avx512;
  if (impl == "neon") return gd::Impl::Neon;
  throw std::invalid_argument("impl must be 'auto', 'generic', 'avx2', 'avx512' or 'neon', got '" + impl + "'");
}

inline gd::Format parse_format(const std::string& fmt) { return gd::parse_format(fmt); }

inline std::string shape_str(size_t a, size_t b) { return "(" + std::to_string(a) + ", " + std::to_string(b) + ")"; }

// W: (N, row bytes) quantized rows, checked against K columns of format f.
inline void check_weights(gd::Format f, const Weights& W, size_t K) {
  const size_t block = std::max<size_t>(32, size_t(gd::block_values(f)));
  if (K % block) throw std::invalid_argument("activations have " + std::to_string(K) + " columns, not a multiple of " +
                                             std::to_string(block) + " (" + gd::info(f).name + ")");
  if (W.shape(1) != gd::row_bytes(f, K))
    throw std::invalid_argument("weight rows are " + std::to_string(W.shape(1)) + " bytes, expected " +
                                std::to_string(gd::row_bytes(f, K)) + " for " + std::to_string(K) + " columns");
}

inline gd::Acts parse_acts(const std::string& acts) {
  if (acts == "i16") return gd::Acts::I16;
  if (acts == "f32") return gd::Acts::F32;
  throw std::invalid_argument("acts must be 'i16' or 'f32', got '" + acts + "'");
}

}  // namespace gd_bind
