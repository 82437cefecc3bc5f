// Python bindings: this file only converts arguments and registers functions.
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

#include "attention.h"
#include "bpe.h"
#include "cpu.h"
#include "gguf_scan.h"
#include "matmul.h"
#include "moe.h"
#include "formats.h"
#include "quants.h"
#include "ops.h"
#include "peak.h"
#include "rows.h"
#include "threads.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using Bytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Int64s = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Int32s = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Floats = nb::ndarray<float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Weights = nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Matrix = nb::ndarray<float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using CMatrix = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using CFloats = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Half3 = nb::ndarray<const uint16_t, nb::ndim<3>, nb::c_contig, nb::device::cpu>;
using CFloats3 = nb::ndarray<const float, nb::ndim<3>, nb::c_contig, nb::device::cpu>;
using Floats3 = nb::ndarray<float, nb::ndim<3>, nb::c_contig, nb::device::cpu>;

gd::Impl parse_impl(const std::string& impl) {
  if (impl == "auto") return gd::Impl::Auto;
  if (impl == "generic") return gd::Impl::Generic;
  if (impl == "avx2") return gd::Impl::Avx2;
  if (impl == "avx512") return gd::Impl::Avx512;
  if (impl == "neon") return gd::Impl::Neon;
  throw std::invalid_argument("impl must be 'auto', 'generic', 'avx2', 'avx512' or 'neon', got '" + impl + "'");
}

gd::Format parse_format(const std::string& fmt) { return gd::parse_format(fmt); }

std::string shape_str(size_t a, size_t b) { return "(" + std::to_string(a) + ", " + std::to_string(b) + ")"; }

// W: (N, row bytes) quantized rows; returns K, checked against the row size.
void check_weights(gd::Format f, const Weights& W, size_t K) {
  const size_t block = std::max<size_t>(32, size_t(gd::block_values(f)));
  if (K % block) throw std::invalid_argument("activations have " + std::to_string(K) + " columns, not a multiple of " +
                                             std::to_string(block) + " (" + gd::info(f).name + ")");
  if (W.shape(1) != gd::row_bytes(f, K))
    throw std::invalid_argument("weight rows are " + std::to_string(W.shape(1)) + " bytes, expected " +
                                std::to_string(gd::row_bytes(f, K)) + " for " + std::to_string(K) + " columns");
}

gd::Acts parse_acts(const std::string& acts) {
  if (acts == "i16") return gd::Acts::I16;
  if (acts == "f32") return gd::Acts::F32;
  throw std::invalid_argument("acts must be 'i16' or 'f32', got '" + acts + "'");
}

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

void attention(CFloats3 q, Half3 k, Half3 v, std::optional<CFloats> sinks, size_t pos0, size_t window, float scale,
               Floats3 out, const std::string& impl) {
  gd::AttentionArgs a{q.data(), q.shape(0), q.shape(1), q.shape(2), k.data(), v.data(), k.shape(0), k.shape(1),
                      v.shape(2), sinks ? sinks->data() : nullptr, pos0, window, scale, out.data()};
  if (k.shape(2) != a.d) throw std::invalid_argument("keys and queries differ in head dim");
  if (v.shape(0) != a.KH || v.shape(1) != a.cap) throw std::invalid_argument("keys and values differ in shape");
  if (out.shape(0) != a.T || out.shape(1) != a.H || out.shape(2) != a.dv)
    throw std::invalid_argument("output must have shape (T, H, value dim)");
  if (sinks && sinks->shape(0) != a.H) throw std::invalid_argument("sinks must have one value per query head");
  const gd::Impl which = parse_impl(impl);
  nb::gil_scoped_release release;
  gd::attention(a, which);
}

using Weights3 = nb::ndarray<const uint8_t, nb::ndim<3>, nb::c_contig, nb::device::cpu>;
using CInt64s2 = nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Int64s2 = nb::ndarray<int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

void moe(const std::string& gate_fmt, Weights3 gate, CMatrix gate_bias, const std::string& up_fmt, Weights3 up,
         CMatrix up_bias, const std::string& down_fmt, Weights3 down, CMatrix down_bias, CMatrix h,
         CInt64s2 experts, CMatrix weights, Matrix out, float alpha, float limit, const std::string& impl,
         const std::string& acts) {
  const gd::Format fg = parse_format(gate_fmt), fu = parse_format(up_fmt), fd = parse_format(down_fmt);
  const size_t E = gate.shape(0), F = gate.shape(1), D = h.shape(1), T = h.shape(0), k = experts.shape(1);
  auto same = [](bool ok, const char* what) {
    if (!ok) throw std::invalid_argument(std::string("moe: ") + what);
  };
  same(gate.shape(2) == gd::row_bytes(fg, D) && up.shape(0) == E && up.shape(1) == F &&
           up.shape(2) == gd::row_bytes(fu, D), "gate and up must be (experts, F, row bytes of D)");
  same(down.shape(0) == E && down.shape(1) == D && down.shape(2) == gd::row_bytes(fd, F),
       "down must be (experts, D, row bytes of F)");
  same(gate_bias.shape(0) == E && gate_bias.shape(1) == F && up_bias.shape(0) == E && up_bias.shape(1) == F &&
           down_bias.shape(0) == E && down_bias.shape(1) == D, "biases must be (experts, rows)");
  same(experts.shape(0) == T && weights.shape(0) == T && weights.shape(1) == k, "experts and weights must be (T, k)");
  same(out.shape(0) == T && out.shape(1) == D, "out must be (T, D)");
  same(D % gd::kBlock == 0 && F % gd::kBlock == 0, "D and F must be multiples of 32");
  gd::MoeArgs a{fg, fu, fd, gate.data(), gate_bias.data(), up.data(), up_bias.data(), down.data(), down_bias.data(),
                E, F, D, h.data(), T, k, experts.data(), weights.data(), out.data(), alpha, limit};
  const gd::Impl which = parse_impl(impl);
  const gd::Acts ac = parse_acts(acts);
  nb::gil_scoped_release release;
  gd::moe(a, which, ac);
}

void rms_norm(CMatrix x, CFloats w, float eps, Matrix out, const std::string& impl) {
  const size_t T = x.shape(0), D = x.shape(1);
  if (w.shape(0) != D)
    throw std::invalid_argument("rms_norm: weight has " + std::to_string(w.shape(0)) + " values, expected " +
                                std::to_string(D));
  if (out.shape(0) != T || out.shape(1) != D)
    throw std::invalid_argument("rms_norm: output has shape " + shape_str(out.shape(0), out.shape(1)) +
                                ", expected " + shape_str(T, D));
  const gd::Impl which = parse_impl(impl);
  nb::gil_scoped_release release;
  gd::rms_norm(x.data(), w.data(), T, D, eps, out.data(), which);
}

void rope(Floats3 x, CMatrix cos, CMatrix sin) {
  const size_t T = x.shape(0), H = x.shape(1), d = x.shape(2);
  if (d % 2 || cos.shape(0) != T || sin.shape(0) != T || cos.shape(1) != d / 2 || sin.shape(1) != d / 2)
    throw std::invalid_argument("rope: x is (" + std::to_string(T) + ", " + std::to_string(H) + ", " +
                                std::to_string(d) + "), cos and sin must be " + shape_str(T, d / 2) +
                                " (and d even)");
  nb::gil_scoped_release release;
  gd::rope(x.data(), T, H, d, cos.data(), sin.data());
}

void route(CMatrix W, std::optional<CFloats> bias, CMatrix h, Int64s2 top, Matrix weights, const std::string& impl) {
  const size_t E = W.shape(0), D = W.shape(1), T = h.shape(0), k = top.shape(1);
  if (h.shape(1) != D)
    throw std::invalid_argument("route: activations have " + std::to_string(h.shape(1)) + " columns, the router " +
                                std::to_string(D));
  if (bias && bias->shape(0) != E)
    throw std::invalid_argument("route: bias has " + std::to_string(bias->shape(0)) + " values, expected " +
                                std::to_string(E));
  if (top.shape(0) != T || k == 0 || k > E || weights.shape(0) != T || weights.shape(1) != k)
    throw std::invalid_argument("route: top and weights must be (T, k) with 1 <= k <= " + std::to_string(E));
  const gd::Impl which = parse_impl(impl);
  const float* b = bias ? bias->data() : nullptr;
  nb::gil_scoped_release release;
  gd::route(W.data(), b, E, D, h.data(), T, k, top.data(), weights.data(), which);
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
  // Objects still held by daemon threads (the engine's worker) at interpreter
  // exit are not leaks worth a warning on every server shutdown.
  nb::set_leak_warnings(false);
  m.def("cpu_has_avx2", &gd::cpu_has_avx2, "True when the CPU supports AVX2, FMA and F16C.");
  m.def("cpu_has_avx512", &gd::cpu_has_avx512, "True when the CPU supports AVX-512 F, BW and VL besides AVX2.");
  m.def("cpu_has_neon", &gd::cpu_has_neon, "True on AArch64 (Advanced SIMD).");
  m.def("active_impl", [] { return gd::impl_name(gd::resolve_impl(gd::Impl::Auto)); },
        "The implementation 'auto' resolves to on this CPU and environment.");
  m.def("cpu_splits_256", &gd::cpu_splits_256,
        "True where the AVX2 kernels take their forms for cores that split 256-bit operations in two (AMD Zen 1; "
        "GOOSEDUMP_AVX2_HALVES=1 or 0 decides instead).");
  m.def("cpu_has_amx", &gd::cpu_has_amx,
        "True where the AVX-512 path runs MXFP4's and Q8_0's products of 16 tokens and more on AMX's tiles, the same bits "
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
  m.def("attention", &attention, "q"_a, "k"_a.noconvert(), "v"_a.noconvert(), "sinks"_a, "pos0"_a, "window"_a, "scale"_a, "out"_a,
        "impl"_a = "auto", "Attention with sinks and an optional sliding window over an fp16 KV cache, head-major: k [KH, cap, d], v [KH, cap, dv].");
  m.def("moe", &moe, "gate_fmt"_a, "gate"_a, "gate_bias"_a, "up_fmt"_a, "up"_a, "up_bias"_a, "down_fmt"_a, "down"_a,
        "down_bias"_a, "h"_a,
        "experts"_a, "weights"_a, "out"_a, "alpha"_a, "limit"_a, "impl"_a = "auto", "acts"_a = "i16",
        "A layer's experts: out[t] = sum_j weights[t, j] * expert(experts[t, j])(h[t]), SwiGLU with clamp.");
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
  m.def("rms_norm", &rms_norm, "x"_a, "weight"_a, "eps"_a, "out"_a, "impl"_a = "auto",
        "out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight, each row alone.");
  m.def("rope", &rope, "x"_a.noconvert(), "cos"_a, "sin"_a, "NeoX RoPE in place on x (T, heads, d).");
  m.def("route", &route, "weight"_a, "bias"_a.none(), "h"_a, "top"_a.noconvert(), "weights"_a.noconvert(), "impl"_a = "auto",
        "A MoE router: per token the k largest of weight @ h[t] + bias (ties: lowest index), descending, into top "
        "(T, k), and their softmax into weights (T, k).");
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
