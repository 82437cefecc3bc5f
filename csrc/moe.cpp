#include "moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "threads.h"
#include "vecmath.h"

namespace gd {
namespace {

// SwiGLU: gate clamped from above, up both ways; g * sigmoid(alpha g) * (u + 1).
void swiglu_generic(const float* gate, const float* up, size_t n, float alpha, float limit, float* out) {
  for (size_t i = 0; i < n; ++i) {
    const float gv = std::min(gate[i], limit);
    const float uv = std::clamp(up[i], -limit, limit);
    out[i] = gv / (1.f + std::exp(-alpha * gv)) * (uv + 1.f);
  }
}

#if defined(__x86_64__) || defined(__i386__)
// The sigmoid from e = exp(-|alpha g|) <= 1: 1 / (1 + e) for g >= 0, e / (1 + e) below.
__attribute__((target("avx2,fma,f16c"))) void swiglu_avx2(const float* gate, const float* up, size_t n, float alpha,
                                                          float limit, float* out) {
  const __m256 lim = _mm256_set1_ps(limit), neg_lim = _mm256_set1_ps(-limit), a = _mm256_set1_ps(alpha);
  const __m256 one = _mm256_set1_ps(1.f), sign = _mm256_set1_ps(-0.f);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_min_ps(_mm256_loadu_ps(gate + i), lim);
    const __m256 u = _mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(up + i), neg_lim), lim);
    const __m256 x = _mm256_mul_ps(a, g);
    const __m256 e = exp_neg_avx2(_mm256_or_ps(x, sign));                 // exp(-|x|)
    const __m256 num = _mm256_blendv_ps(one, e, x);                      // x < 0 (sign bit): e
    const __m256 sig = _mm256_div_ps(num, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, sig), _mm256_add_ps(u, one)));
  }
  swiglu_generic(gate + i, up + i, n - i, alpha, limit, out + i);
}
#endif

void swiglu(const float* gate, const float* up, size_t n, float alpha, float limit, float* out, Impl impl) {
#if defined(__x86_64__) || defined(__i386__)
  if (uses_avx2(impl)) return swiglu_avx2(gate, up, n, alpha, limit, out);
#endif
  swiglu_generic(gate, up, n, alpha, limit, out);
}

}  // namespace

void moe(const MoeArgs& a, Impl impl, Acts acts) {
  for (size_t i = 0; i < a.T * a.k; ++i)
    if (a.experts[i] < 0 || size_t(a.experts[i]) >= a.E)
      throw std::out_of_range("expert id " + std::to_string(a.experts[i]) + " is outside 0.." +
                              std::to_string(a.E - 1));
  // Group: for each used expert, its tokens and their weights.
  struct Group { size_t e; std::vector<size_t> tok; std::vector<float> w; };
  std::vector<Group> groups;
  {
    std::vector<long> index(a.E, -1);
    for (size_t t = 0; t < a.T; ++t)
      for (size_t j = 0; j < a.k; ++j) {
        const size_t e = size_t(a.experts[t * a.k + j]);
        if (index[e] < 0) { index[e] = long(groups.size()); groups.push_back({e, {}, {}}); }
        groups[index[e]].tok.push_back(t);
        groups[index[e]].w.push_back(a.weights[t * a.k + j]);
      }
  }
  const size_t F = a.F, D = a.D, G = groups.size();
  const size_t gate_rb = row_bytes(a.gate_fmt, D), up_rb = row_bytes(a.up_fmt, D), down_rb = row_bytes(a.down_fmt, F);
  // The activations in the form each matrix's format reads (gate and up
  // share one when their formats read the same form).
  const Impl which = resolve_impl(impl);
  const bool up_own = ActView::form(acts, a.up_fmt, which) != ActView::form(acts, a.gate_fmt, which);
  // Gathered inputs and intermediates per group, uninitialized: each is
  // written whole before it is read (std::vector's zero fill took 0.45-0.5
  // ms a token of the 20b's 512-token prefill, 1% of it; AMD EPYC Zen 3).
  std::vector<std::unique_ptr<float[]>> x(G), gu(G), act(G), y(G);
  std::vector<size_t> n_tok(G);
  size_t routed = 0;   // token-expert pairs: the work of each phase scales with them
  for (size_t g = 0; g < G; ++g) {
    n_tok[g] = groups[g].tok.size();
    routed += n_tok[g];
    x[g].reset(new float[n_tok[g] * D]);
    gu[g].reset(new float[2 * n_tok[g] * F]);
    act[g].reset(new float[n_tok[g] * F]);
    y[g].reset(new float[n_tok[g] * D]);
  }
  constexpr size_t kRows = 32;

  // Gather each group's tokens and put them in the products' activation form.
  std::vector<std::unique_ptr<ActView>> xs(G), xs_up(G), as(G);
  parallel_for(G, [&](size_t g) {
    for (size_t i = 0; i < n_tok[g]; ++i)
      std::memcpy(&x[g][i * D], a.h + groups[g].tok[i] * D, D * sizeof(float));
    xs[g] = std::make_unique<ActView>(acts, a.gate_fmt, x[g].get(), D, n_tok[g], D, which);
    if (up_own) xs_up[g] = std::make_unique<ActView>(acts, a.up_fmt, x[g].get(), D, n_tok[g], D, which);
  }, routed * D * sizeof(float));
  // Phase 1: gate and up rows of every group: tasks (group, gate|up, row chunk).
  {
    const size_t chunks = (F + kRows - 1) / kRows;
    parallel_for(G * 2 * chunks, [&](size_t task) {
      const size_t g = task / (2 * chunks), rest = task % (2 * chunks), which_mat = rest / chunks;
      const size_t n0 = (rest % chunks) * kRows, n1 = std::min(F, n0 + kRows);
      const size_t e = groups[g].e;
      const uint8_t* W = which_mat == 0 ? a.gate + e * F * gate_rb : a.up + e * F * up_rb;
      const float* bias = (which_mat == 0 ? a.gate_bias : a.up_bias) + e * F;
      float* Y = gu[g].get() + which_mat * n_tok[g] * F;
      const ActView& xv = which_mat == 1 && up_own ? *xs_up[g] : *xs[g];
      matmul_rows(which_mat == 0 ? a.gate_fmt : a.up_fmt, W, n0, n1, D, xv, n_tok[g], Y, F, bias, which);
    }, routed * F * (gate_rb + up_rb));
  }
  parallel_for(G, [&](size_t g) {
    swiglu(gu[g].get(), gu[g].get() + n_tok[g] * F, n_tok[g] * F, a.alpha, a.limit, act[g].get(), which);
    as[g] = std::make_unique<ActView>(acts, a.down_fmt, act[g].get(), F, n_tok[g], F, which);
  }, routed * F * 3 * sizeof(float));
  // Phase 2: down rows of every group.
  {
    const size_t chunks = (D + kRows - 1) / kRows;
    parallel_for(G * chunks, [&](size_t task) {
      const size_t g = task / chunks, n0 = (task % chunks) * kRows, n1 = std::min(D, n0 + kRows);
      const size_t e = groups[g].e;
      matmul_rows(a.down_fmt, a.down + e * D * down_rb, n0, n1, F, *as[g], n_tok[g], y[g].get(), D,
                  a.down_bias + e * D, which);
    }, routed * D * down_rb);
  }
  // Weighted sum, per token in ascending expert id: a fixed order, the one the
  // streamed path (goosedump/forward.py) uses too, so both give equal bits.
  std::memset(a.out, 0, a.T * D * sizeof(float));
  std::vector<std::vector<std::pair<size_t, size_t>>> where(a.T);  // token -> (group, row)
  for (size_t g = 0; g < G; ++g)
    for (size_t i = 0; i < n_tok[g]; ++i) where[groups[g].tok[i]].push_back({g, i});
  for (size_t t = 0; t < a.T; ++t) {
    auto& w = where[t];
    std::sort(w.begin(), w.end(), [&](auto x, auto y) { return groups[x.first].e < groups[y.first].e; });
    float* o = a.out + t * D;
    for (auto [g, i] : w) {
      const float wt = groups[g].w[i];
      const float* yy = y[g].get() + i * D;
      for (size_t d = 0; d < D; ++d) o[d] += wt * yy[d];
    }
  }
}

}  // namespace gd
