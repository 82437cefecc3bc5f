// Python bindings: this file only converts arguments and registers functions.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>

#include <stdexcept>

#include "bpe.h"
#include "cpu.h"
#include "gguf_scan.h"
#include "quants.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using Bytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Int64s = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Int32s = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Floats = nb::ndarray<float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

gd::Impl parse_impl(const std::string& impl) {
  if (impl == "auto") return gd::Impl::Auto;
  if (impl == "generic") return gd::Impl::Generic;
  if (impl == "avx2") return gd::Impl::Avx2;
  throw std::invalid_argument("impl must be 'auto', 'generic' or 'avx2', got '" + impl + "'");
}

void dequantize(const std::string& fmt, Bytes raw, Floats out, const std::string& impl) {
  const bool q8 = fmt == "q8_0";
  if (!q8 && fmt != "mxfp4") throw std::invalid_argument("format must be 'q8_0' or 'mxfp4', got '" + fmt + "'");
  const size_t block_bytes = q8 ? gd::kQ8_0Bytes : gd::kMxfp4Bytes;
  if (raw.shape(0) % block_bytes != 0)
    throw std::invalid_argument(fmt + " data of " + std::to_string(raw.shape(0)) +
                                " bytes is not a whole number of " + std::to_string(block_bytes) + "-byte blocks");
  const size_t n_blocks = raw.shape(0) / block_bytes;
  if (out.shape(0) != n_blocks * gd::kBlock)
    throw std::invalid_argument("output holds " + std::to_string(out.shape(0)) + " floats, expected " +
                                std::to_string(n_blocks * gd::kBlock));
  const gd::Impl which = gd::resolve_impl(parse_impl(impl));
  nb::gil_scoped_release release;
  if (q8) gd::dequantize_q8_0(raw.data(), out.data(), n_blocks, which);
  else gd::dequantize_mxfp4(raw.data(), out.data(), n_blocks, which);
}

std::tuple<nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>, nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>, size_t>
scan_string_array(Bytes buf, size_t offset, size_t count) {
  // Each string takes at least its 8-byte length field: bound the allocation.
  if (count > buf.shape(0) / 8 + 1)
    throw std::out_of_range("an array of " + std::to_string(count) + " strings cannot fit in a file of " +
                            std::to_string(buf.shape(0)) + " bytes");
  auto* starts = new int64_t[count];
  auto* lengths = new int64_t[count];
  nb::capsule own_s(starts, [](void* p) noexcept { delete[] static_cast<int64_t*>(p); });
  nb::capsule own_l(lengths, [](void* p) noexcept { delete[] static_cast<int64_t*>(p); });
  gd::StringArrayScan scan;
  {
    nb::gil_scoped_release release;
    scan = gd::scan_string_array(buf.data(), buf.shape(0), offset, count, starts, lengths);
  }
  return {nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>(starts, {count}, own_s),
          nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>(lengths, {count}, own_l), scan.end};
}

nb::list to_list(const std::vector<uint32_t>& ids) {
  PyObject* list = PyList_New(Py_ssize_t(ids.size()));
  if (!list) throw nb::python_error();
  for (size_t i = 0; i < ids.size(); ++i) PyList_SET_ITEM(list, Py_ssize_t(i), PyLong_FromUnsignedLong(ids[i]));
  return nb::steal<nb::list>(list);
}

}  // namespace

NB_MODULE(_kernels, m) {
  m.doc() = "goosedump's native kernels";
  m.def("cpu_has_avx2", &gd::cpu_has_avx2, "True when the CPU supports AVX2, FMA and F16C.");
  m.def("active_impl", [] { return gd::resolve_impl(gd::Impl::Auto) == gd::Impl::Avx2 ? "avx2" : "generic"; },
        "The implementation 'auto' resolves to on this CPU and environment.");
  m.def("dequantize", &dequantize, "fmt"_a, "raw"_a, "out"_a, "impl"_a = "auto",
        "Dequantize Q8_0 or MXFP4 blocks into a float32 array.");
  m.def("scan_string_array", &scan_string_array, "buf"_a, "offset"_a, "count"_a,
        "Offsets and lengths of the strings of a GGUF string array, and the offset after it.");

  nb::class_<gd::Tokenizer>(m, "BPE")
      .def("__init__",
           [](gd::Tokenizer* self, Bytes buf, Int64s starts, Int64s lengths, Int32s types) {
             const size_t n = types.shape(0);
             if (starts.shape(0) != n || lengths.shape(0) != n)
               throw std::invalid_argument("starts, lengths and types must have the same length");
             for (size_t i = 0; i < n; ++i)
               if (starts.data()[i] < 0 || lengths.data()[i] < 0 ||
                   size_t(starts.data()[i] + lengths.data()[i]) > buf.shape(0))
                 throw std::out_of_range("token " + std::to_string(i) + " lies outside the buffer");
             new (self) gd::Tokenizer(buf.data(), starts.data(), lengths.data(), types.data(), n);
           },
           "buf"_a, "starts"_a, "lengths"_a, "types"_a)
      .def("encode",
           [](const gd::Tokenizer& t, std::string_view text, bool allow_special) {
             std::vector<uint32_t> ids;
             {
               nb::gil_scoped_release release;
               ids = t.encode(text, allow_special);
             }
             return to_list(ids);
           },
           "text"_a, "allow_special"_a = false)
      .def("decode",
           [](const gd::Tokenizer& t, Int64s ids) {
             std::string s = t.decode(ids.data(), ids.shape(0));
             return nb::bytes(s.data(), s.size());
           },
           "ids"_a)
      .def("split",
           [](const gd::Tokenizer& t, std::string_view text) {
             auto offs = t.split(text);
             nb::list out;
             for (size_t i = 0; i + 1 < offs.size(); ++i) out.append(nb::bytes(text.data() + offs[i], offs[i + 1] - offs[i]));
             return out;
           },
           "text"_a, "The o200k pre-tokenizer's pieces, as UTF-8 bytes.")
      .def("token_bytes",
           [](const gd::Tokenizer& t, size_t id) {
             if (id >= t.size()) throw std::out_of_range("token id " + std::to_string(id) + " is outside the vocabulary");
             auto b = t.token_bytes(id);
             return nb::bytes(b.data(), b.size());
           })
      .def("is_special", [](const gd::Tokenizer& t, size_t id) {
             if (id >= t.size()) throw std::out_of_range("token id " + std::to_string(id) + " is outside the vocabulary");
             return t.is_special(id);
           })
      .def("__len__", &gd::Tokenizer::size);
}
