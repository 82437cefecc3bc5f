// Python bindings: this file only converts arguments and registers functions
// (a layer's pieces around the products: module_layer.cpp's).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "bpe.h"
#include "cpu.h"
#include "formats.h"
#include "gguf_scan.h"
#include "matmul.h"
#include "module.h"
#include "peak.h"
#include "quants.h"
#include "rows.h"
#include "threads.h"

namespace nb = nanobind;
using namespace nb::literals;

void bind_layer(nb::module_& m);   // module_layer.cpp

namespace {

using namespace gd_bind;

void matmul(const std::string& fmt, Weights W, CMatrix X, Matrix out, std::optional<CFloats> bias,
            const std::string& impl, const std::string& acts) {
  const gd::Format f = parse_format(fmt);
  const size_t N = W.shape(0), T = X.shape(0), K = X.shape(1);
  check_weights(f, W, K);
  if (out.shape(0) != T || out.shape(1) != N)
    throw std::invalid_argument("output has shape " + shape_str(out.shape(0), out.shape(1)) + ", expected " +
                                shape_str(T, N));
  if (bias && bias->shape(0) != N)
    throw std::invalid_argument("bias has " + std::to_string(bias->shape(0)) + " values, expected " + std::to_string(N));
  const gd::Impl which = parse_impl(impl);
  const gd::Acts a = parse_acts(acts);
  const float* b = bias ? bias->data() : nullptr;
  nb::gil_scoped_release release;
  gd::matmul(f, W.data(), N, K, X.data(), K, T, out.data(), N, b, which, a);
}

std::tuple<size_t, float> matvec_argmax(const std::string& fmt, Weights W, CFloats x, const std::string& impl,
                                        const std::string& acts) {
  const gd::Format f = parse_format(fmt);
  check_weights(f, W, x.shape(0));
  const gd::Impl which = parse_impl(impl);
  const gd::Acts a = parse_acts(acts);
  nb::gil_scoped_release release;
  auto r = gd::matvec_argmax(f, W.data(), W.shape(0), x.shape(0), x.data(), which, a);
  return {r.index, r.value};
}

void get_rows(const std::string& fmt, Weights W, Int64s rows, Matrix out, const std::string& impl) {
  const gd::Format f = parse_format(fmt);
  const size_t K = out.shape(1);
  check_weights(f, W, K);
  if (out.shape(0) != rows.shape(0)) throw std::invalid_argument("output rows must match the row ids");
  for (size_t i = 0; i < rows.shape(0); ++i)
    if (rows.data()[i] < 0 || size_t(rows.data()[i]) >= W.shape(0))
      throw std::out_of_range("row id " + std::to_string(rows.data()[i]) + " at position " + std::to_string(i) +
                              " is outside 0.." + std::to_string(W.shape(0) - 1));
  const gd::Impl which = parse_impl(impl);
  nb::gil_scoped_release release;
  gd::get_rows(f, W.data(), K, rows.data(), rows.shape(0), out.data(), which);
}

// Sum of all bytes, read by every thread in parallel: a streaming read for
// measuring memory bandwidth (benchmarks/vs_llamacpp.py).
uint64_t stream_read(Bytes buf) {
  const uint8_t* p = buf.data();
  const size_t n = buf.shape(0), chunk = size_t(1) << 20, tasks = (n + chunk - 1) / chunk;
  std::vector<uint64_t> sums(tasks, 0);
  {
    nb::gil_scoped_release release;
    gd::parallel_for(tasks, [&](size_t t) {
      const size_t a = t * chunk, b = std::min(n, a + chunk);
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      size_t i = a;
      // Four independent sums keep the loads flowing, and a line is
      // prefetched as far ahead as the kernels prefetch (rows.h): without it
      // the probe read 25 GB/s where the Q8_0 kernel streamed 29.5 (AMD
      // EPYC, 2 threads), a bound the engine would pass.
      for (; i + 64 <= b; i += 64) {
        __builtin_prefetch(p + i + gd::kPrefetchAhead, 0, 3);
        uint64_t w[8];
        std::memcpy(w, p + i, 64);
        s0 += w[0] + w[4]; s1 += w[1] + w[5]; s2 += w[2] + w[6]; s3 += w[3] + w[7];
      }
      for (; i < b; ++i) s0 += p[i];
      sums[t] = s0 + s1 + s2 + s3;
    });
  }
  uint64_t total = 0;
  for (auto v : sums) total += v;
  return total;
}

void dequantize(const std::string& fmt, Bytes raw, Floats out, const std::string& impl) {
  const gd::Format f = parse_format(fmt);
  const size_t block_bytes = size_t(gd::block_bytes(f)), block = size_t(gd::block_values(f));
  if (raw.shape(0) % block_bytes != 0)
    throw std::invalid_argument(fmt + " data of " + std::to_string(raw.shape(0)) +
                                " bytes is not a whole number of " + std::to_string(block_bytes) + "-byte blocks");
  const size_t n_values = raw.shape(0) / block_bytes * block;
  if (out.shape(0) != n_values)
    throw std::invalid_argument("output holds " + std::to_string(out.shape(0)) + " floats, expected " +
                                std::to_string(n_values));
  if (!gd::is_float(f) && n_values % 32)
    throw std::invalid_argument(fmt + ": dequantization goes by whole blocks");
  const gd::Impl which = gd::resolve_impl(parse_impl(impl));
  nb::gil_scoped_release release;
  gd::dequantize(f, raw.data(), out.data(), n_values, which);
}

std::tuple<nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>, nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>, size_t>
scan_string_array(Bytes buf, size_t offset, size_t count) {
  // Each string takes at least its 8-byte length field: bound the allocation
  // by the bytes after offset.
  const size_t left = offset < buf.shape(0) ? buf.shape(0) - offset : 0;
  if (count > left / 8)
    throw std::out_of_range("an array of " + std::to_string(count) + " strings cannot fit in the " +
                            std::to_string(left) + " bytes after byte " + std::to_string(offset) + " (the file has " +
                            std::to_string(buf.shape(0)) + ")");
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
  bind_layer(m);
  // Objects still held by daemon threads (the engine's worker) at interpreter
  // exit are not leaks worth a warning on every server shutdown.
  nb::set_leak_warnings(false);
  m.def("cpu_has_avx2", &gd::cpu_has_avx2, "True when the CPU supports AVX2, FMA and F16C.");
  m.def("cpu_has_avx512", &gd::cpu_has_avx512, "True when the CPU supports AVX-512 F, BW, VL and VNNI besides AVX2.");
  m.def("cpu_has_vbmi", &gd::cpu_has_vbmi,
        "True where the AVX-512 path's grouped kernels (MXFP4, Q8_0, the 4- and 5-bit formats, Q6_K) take their form with VBMI's byte permutes (Ice Lake, "
        "Zen 4 and later); else (Cascade Lake, Cooper Lake, or GOOSEDUMP_AVX512_VBMI=0) the form by qword and word permutes, "
        "the same bits.");
  m.def("cpu_has_neon", &gd::cpu_has_neon, "True on AArch64 (Advanced SIMD).");
  m.def("active_impl", [] { return gd::impl_name(gd::resolve_impl(gd::Impl::Auto)); },
        "The implementation 'auto' resolves to on this CPU and environment.");
  m.def("cpu_splits_256", &gd::cpu_splits_256,
        "True where the AVX2 kernels take their forms for cores that split 256-bit operations in two (AMD Zen 1; "
        "GOOSEDUMP_AVX2_HALVES=1 or 0 decides instead).");
  m.def("cpu_has_amx", &gd::cpu_has_amx,
        "True where the AVX-512 path runs MXFP4's, Q8_0's, Q4_0's and Q5_0's products of 16 tokens and more on AMX's tiles, the same bits "
        "(Intel Sapphire Rapids and later, the OS permitting; GOOSEDUMP_AMX=0 keeps them off).");
  m.attr("NUMERICS") = gd::kNumerics;
  m.def("available_impls", [] {
    int n = 0;
    const gd::Impl* paths = gd::available_impls(n);
    nb::list out;
    for (int i = 0; i < n; ++i) out.append(gd::impl_name(paths[i]));
    return out;
  }, "The implementations this CPU can run: 'generic' first, the best last.");
  m.def("dequantize", &dequantize, "fmt"_a, "raw"_a, "out"_a, "impl"_a = "auto",
        "Dequantize blocks of any weight format (formats()) into a float32 array.");
  m.def("formats", [] {
    nb::list out;
    for (int i = 0; i <= int(gd::Format::MXFP4); ++i) out.append(gd::info(gd::Format(i)).name);
    return out;
  }, "The weight formats the kernels take.");
  m.def("matmul", &matmul, "fmt"_a, "weights"_a, "x"_a, "out"_a, "bias"_a = nb::none(), "impl"_a = "auto",
        "acts"_a = "i16",
        "out[t, n] = weights[n] . x[t] (+ bias[n]) for quantized weight rows; activations as int16 blocks "
        "(acts='i16') or fp32 (acts='f32').");
  m.def("matvec_argmax", &matvec_argmax, "fmt"_a, "weights"_a, "x"_a, "impl"_a = "auto", "acts"_a = "i16",
        "(n, value) of the largest weights[n] . x, without writing the products.");
  m.def("get_rows", &get_rows, "fmt"_a, "weights"_a, "rows"_a, "out"_a, "impl"_a = "auto",
        "Dequantize the given weight rows into out.");
  // Keys and values are fp16 bits (pass float16 arrays as .view(uint16)); no
  // implicit conversion, which would turn half floats into integers.
  m.def("peak_int16_macs", [](const std::string& impl, uint64_t iterations) {
    const gd::Impl which = parse_impl(impl);
    gd::PeakRate r;
    {
      nb::gil_scoped_release release;
      r = gd::peak_int16_macs(which, iterations);
    }
    return std::make_tuple(r.macs_per_s, std::string(r.instruction), r.macs_per_instruction);
  }, "impl"_a = "auto", "iterations"_a = 20000000,
        "(int16 multiply-accumulates per second on one thread, the instruction, MACs per instruction): the peak "
        "of the instruction the path's int16 products use, measured.");
  m.def("peak_amx_macs", [](uint64_t iterations) {
    gd::PeakRate r;
    {
      nb::gil_scoped_release release;
      r = gd::peak_amx_macs(iterations);
    }
    return std::make_tuple(r.macs_per_s, std::string(r.instruction), r.macs_per_instruction);
  }, "iterations"_a = 1000000,
        "(int16 multiply-accumulates per second on one thread, the instruction, int16 products per instruction): "
        "AMX's tiles' peak where the AVX-512 path runs its many-token products on them, measured; else a rate of 0.");
  m.def("stream_read", &stream_read, "buf"_a, "Read every byte on all threads (a bandwidth probe).");
  m.def("set_num_threads", &gd::set_num_threads, "n"_a, "Threads for the kernels (0: one per core).");
  m.def("num_threads", &gd::num_threads);
  m.def("pool_stats", [] {
    const gd::PoolStats st = gd::pool_stats();
    nb::dict d;
    d["parallel"] = st.parallel;
    d["inline_small"] = st.inline_small;
    d["inline_contended"] = st.inline_contended;
    d["contended_events"] = st.contended_events;
    return d;
  }, "Regions the thread pool ran in parallel, on the caller (too small; while contended), and the times "
     "contention turned it to the caller.");
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
