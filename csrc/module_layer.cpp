// Python bindings of a layer's pieces around the products: attention and
// its KV store, the experts, RMS norm, RoPE, the router (module.cpp
// registers them through bind_layer).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "attention.h"
#include "module.h"
#include "moe.h"
#include "ops.h"
#include "quants.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using namespace gd_bind;

void attention(CFloats3 q, Half3 k, Half3 v, std::optional<CFloats> sinks, size_t pos0, size_t window, float scale,
               Floats3 out, const std::string& impl, std::optional<CFloats3> new_k, std::optional<CFloats3> new_v) {
  gd::AttentionArgs a{q.data(), q.shape(0), q.shape(1), q.shape(2), k.data(), v.data(), k.shape(0), k.shape(1),
                      v.shape(2), sinks ? sinks->data() : nullptr, pos0, window, scale, out.data()};
  if (k.shape(2) != a.d) throw std::invalid_argument("keys and queries differ in head dim");
  if (v.shape(0) != a.KH || v.shape(1) != a.cap) throw std::invalid_argument("keys and values differ in shape");
  if (out.shape(0) != a.T || out.shape(1) != a.H || out.shape(2) != a.dv)
    throw std::invalid_argument("output must have shape (T, H, value dim)");
  if (sinks && sinks->shape(0) != a.H) throw std::invalid_argument("sinks must have one value per query head");
  if (bool(new_k) != bool(new_v)) throw std::invalid_argument("new_k and new_v come together");
  if (new_k && (new_k->shape(0) != a.T || new_k->shape(1) != a.KH || new_k->shape(2) != a.d ||
                new_v->shape(0) != a.T || new_v->shape(1) != a.KH || new_v->shape(2) != a.dv))
    throw std::invalid_argument("new_k and new_v must be (T, kv heads, head dim) and (T, kv heads, value dim)");
  gd::check_attention(a);   // (before the store changes the cache)
  const gd::Impl which = parse_impl(impl);
  nb::gil_scoped_release release;
  if (new_k)   // (the cache's own arrays: writable, as Half3 asks)
    gd::store_kv(new_k->data(), new_v->data(), a.T, a.KH, a.d, a.dv, k.data(), v.data(), a.cap, pos0, which);
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

// A norm's weight and output against its input's (T, D).
void check_norm(const char* name, size_t T, size_t D, const CFloats& w, const Matrix& out) {
  if (w.shape(0) != D)
    throw std::invalid_argument(std::string(name) + ": weight has " + std::to_string(w.shape(0)) +
                                " values, expected " + std::to_string(D));
  if (out.shape(0) != T || out.shape(1) != D)
    throw std::invalid_argument(std::string(name) + ": output has shape " + shape_str(out.shape(0), out.shape(1)) +
                                ", expected " + shape_str(T, D));
}

void rms_norm(CMatrix x, CFloats w, float eps, Matrix out, const std::string& impl) {
  const size_t T = x.shape(0), D = x.shape(1);
  check_norm("rms_norm", T, D, w, out);
  const gd::Impl which = parse_impl(impl);
  nb::gil_scoped_release release;
  gd::rms_norm(x.data(), w.data(), T, D, eps, out.data(), which);
}

void add_rms_norm(Matrix x, CMatrix add, CFloats w, float eps, Matrix out, const std::string& impl) {
  const size_t T = x.shape(0), D = x.shape(1);
  if (add.shape(0) != T || add.shape(1) != D)
    throw std::invalid_argument("add_rms_norm: add has shape " + shape_str(add.shape(0), add.shape(1)) +
                                ", expected " + shape_str(T, D));
  check_norm("add_rms_norm", T, D, w, out);
  const gd::Impl which = parse_impl(impl);
  nb::gil_scoped_release release;
  gd::add_rms_norm(x.data(), add.data(), w.data(), T, D, eps, out.data(), which);
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

}  // namespace

void bind_layer(nb::module_& m) {
  m.def("attention", &attention, "q"_a, "k"_a.noconvert(), "v"_a.noconvert(), "sinks"_a, "pos0"_a, "window"_a, "scale"_a, "out"_a,
        "impl"_a = "auto", "new_k"_a = nb::none(), "new_v"_a = nb::none(),
        "Attention with sinks and an optional sliding window over an fp16 KV cache, head-major: k [KH, cap, d], v [KH, cap, dv]; "
        "new_k [T, KH, d] and new_v [T, KH, dv] (float32), when given, first enter the cache as fp16 (nearest, ties to even), "
        "position pos0 + t at slot (pos0 + t) % cap.");
  m.def("moe", &moe, "gate_fmt"_a, "gate"_a, "gate_bias"_a, "up_fmt"_a, "up"_a, "up_bias"_a, "down_fmt"_a, "down"_a,
        "down_bias"_a, "h"_a,
        "experts"_a, "weights"_a, "out"_a, "alpha"_a, "limit"_a, "impl"_a = "auto", "acts"_a = "i16",
        "A layer's experts: out[t] = sum_j weights[t, j] * expert(experts[t, j])(h[t]), SwiGLU with clamp.");
  m.def("rms_norm", &rms_norm, "x"_a, "weight"_a, "eps"_a, "out"_a, "impl"_a = "auto",
        "out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight, each row alone.");
  m.def("add_rms_norm", &add_rms_norm, "x"_a.noconvert(), "add"_a, "weight"_a, "eps"_a, "out"_a, "impl"_a = "auto",
        "x += add (in place), then out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight, each row alone.");
  m.def("rope", &rope, "x"_a.noconvert(), "cos"_a, "sin"_a, "NeoX RoPE in place on x (T, heads, d).");
  m.def("route", &route, "weight"_a, "bias"_a.none(), "h"_a, "top"_a.noconvert(), "weights"_a.noconvert(), "impl"_a = "auto",
        "A MoE router: per token the k largest of weight @ h[t] + bias (ties: lowest index), descending, into top "
        "(T, k), and their softmax into weights (T, k).");
}
