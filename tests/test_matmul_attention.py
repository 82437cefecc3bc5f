"""Native matmul, argmax, row lookup and attention against float64 numpy."""
import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import quants

from goosedump import _kernels

IMPLS = _kernels.available_impls()
FORMATS = [("q8_0", QT.Q8_0), ("mxfp4", QT.MXFP4)]


def quantized(rng, n, k, qtype):
    w = rng.standard_normal((n, k)).astype(np.float32)
    raw = quants.quantize(w, qtype)
    return raw, quants.dequantize(raw, qtype).astype(np.float64)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("acts", ["f32", "i16"])
@pytest.mark.parametrize("fmt,qtype", FORMATS)
@pytest.mark.parametrize("n,k,t", [(1, 32, 1), (31, 64, 3), (33, 96, 8), (17, 160, 9), (100, 2880, 13)])
def test_matmul_matches_float64(impl, acts, fmt, qtype, n, k, t):
    rng = np.random.default_rng(n * 1000 + t)
    raw, w = quantized(rng, n, k, qtype)
    x = rng.standard_normal((t, k)).astype(np.float32)
    x[0, :32] = 0  # an all-zero activation block
    bias = rng.standard_normal(n).astype(np.float32)
    out = np.empty((t, n), np.float32)
    _kernels.matmul(fmt, raw, x, out, bias, impl, acts)
    ref = x.astype(np.float64) @ w.T + bias
    # fp32 accumulation: error ~ sqrt(k) * 2^-24 per unit term; int16 activation
    # blocks add up to 2^-15 of each block's largest value per product.
    per_term = 2.0 ** -24 if acts == "f32" else 2.0 ** -15
    tol = 4 * per_term * math.sqrt(k) * np.abs(w).max() * np.abs(x).max() + 1e-6 * np.abs(ref).max()
    np.testing.assert_allclose(out, ref, rtol=0, atol=tol)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("fmt,qtype", FORMATS)
@pytest.mark.parametrize("scale", [1e-30, 1e-3, 1e30])
def test_int16_activations_keep_their_precision_at_any_magnitude(impl, fmt, qtype, scale):
    """Block scales are powers of two found per block: tiny and huge
    activations (and blocks of very different size in one row) keep the
    same relative precision."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((40, 256)).astype(np.float32)
    # Rows 0..19 weigh only the small block, rows 20..39 everything but the
    # large one: each group's sums must keep their own relative precision,
    # which a scale shared by a row's blocks (the large block's) would lose.
    w[:20, :64] = 0
    w[:20, 96:] = 0
    w[20:, 32:64] = 0
    raw = quants.quantize(w, qtype)
    w = quants.dequantize(raw, qtype).astype(np.float64)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    x[:, 32:64] *= 1000     # one block far larger than the rest
    x[:, 64:96] *= 1e-3     # one far smaller
    x *= np.float32(scale)
    out = np.empty((3, 40), np.float32)
    _kernels.matmul(fmt, raw, x, out, None, impl, "i16")
    ref = x.astype(np.float64) @ w.T
    for rows in (slice(0, 20), slice(20, 40)):
        np.testing.assert_allclose(out[:, rows], ref[:, rows], rtol=0, atol=1e-4 * np.abs(ref[:, rows]).max())


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("fmt,qtype", FORMATS)
def test_argmax_matches_the_products(impl, fmt, qtype):
    rng = np.random.default_rng(5)
    raw, w = quantized(rng, 1000, 64, qtype)
    x = rng.standard_normal(64).astype(np.float32)
    i, v = _kernels.matvec_argmax(fmt, raw, x, impl)
    ref = w @ x
    assert i == int(np.argmax(ref))
    assert abs(v - ref[i]) < 1e-3


def test_get_rows_and_errors():
    rng = np.random.default_rng(1)
    raw, w = quantized(rng, 10, 64, QT.Q8_0)
    out = np.empty((3, 64), np.float32)
    _kernels.get_rows("q8_0", raw, np.array([9, 0, 9]), out)
    np.testing.assert_array_equal(out, w[[9, 0, 9]].astype(np.float32))
    with pytest.raises(IndexError, match="row id 10 at position 1 is outside 0..9"):
        _kernels.get_rows("q8_0", raw, np.array([0, 10]), np.empty((2, 64), np.float32))
    with pytest.raises(ValueError, match="weight rows are 68 bytes, expected 102 for 96 columns"):
        _kernels.matmul("q8_0", raw, np.zeros((1, 96), np.float32), np.empty((1, 10), np.float32))
    with pytest.raises(ValueError, match="acts must be 'i16' or 'f32'"):
        _kernels.matmul("q8_0", raw, np.zeros((1, 64), np.float32), np.empty((1, 10), np.float32), acts="i8")
    with pytest.raises(ValueError, match=r"output has shape \(1, 9\), expected \(1, 10\)"):
        _kernels.matmul("q8_0", raw, np.zeros((1, 64), np.float32), np.empty((1, 9), np.float32))


def attention_reference(q, k, v, sinks, pos0, window, scale, n_kv):
    """float64: q [T, H, d]; k, v [positions, K, d] by absolute position."""
    T, H, _ = q.shape
    out = np.zeros((T, H, v.shape[-1]))
    for t in range(T):
        p = pos0 + t
        lo = max(0, p - window + 1) if window else 0
        for h in range(H):
            kh = h // (H // n_kv)
            s = scale * (k[lo:p + 1, kh] @ q[t, h])
            s = np.append(s, sinks[h])
            e = np.exp(s - s.max())
            out[t, h] = (e[:-1] / e.sum()) @ v[lo:p + 1, kh]
    return out


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("H,K,d", [(8, 2, 16), (16, 2, 64)])   # the second: gpt-oss's 8 heads per kv head
@pytest.mark.parametrize("window,cap,pos0,T", [(0, 40, 0, 40), (0, 64, 30, 1), (8, 8 + 5 - 1, 20, 5),
                                               (4, 4, 50, 1), (16, 16 + 127, 300, 128),
                                               # past one block of values (kValueBlock, 256 positions),
                                               # odd and even counts, slots wrapped inside the window
                                               (0, 700, 690, 3), (300, 302, 1000, 3)])
def test_attention_matches_float64(impl, window, cap, pos0, T, H, K, d):
    rng = np.random.default_rng(window + pos0)
    n_pos = pos0 + T
    k_all = rng.standard_normal((n_pos, K, d)).astype(np.float16)
    v_all = rng.standard_normal((n_pos, K, d)).astype(np.float16)
    kc = np.zeros((K, cap, d), np.float16)      # head-major, as the kernel reads it
    vc = np.zeros((K, cap, d), np.float16)
    # the cache holds each position in slot position % cap (older ones overwritten)
    for p in range(max(0, n_pos - cap), n_pos):
        kc[:, p % cap], vc[:, p % cap] = k_all[p], v_all[p]
    q = rng.standard_normal((T, H, d)).astype(np.float32)
    sinks = rng.standard_normal(H).astype(np.float32)
    out = np.empty((T, H, d), np.float32)
    _kernels.attention(q, kc.view(np.uint16), vc.view(np.uint16), sinks, pos0, window, 0.25, out, impl)
    ref = attention_reference(q.astype(np.float64), k_all.astype(np.float64), v_all.astype(np.float64),
                              sinks.astype(np.float64), pos0, window, 0.25, K)
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-5)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("window,cap,pos0,T", [(0, 600, 580, 6), (128, 140, 400, 5)])
def test_attention_gives_a_query_the_same_bits_alone_or_in_a_batch(impl, window, cap, pos0, T):
    """A prefill batch's query t and the same query decoded alone at its
    position (the cache as full as the batch left it) give the same bits:
    batch invariance, on gpt-oss's shape (8 query heads per kv head)."""
    rng = np.random.default_rng(pos0)
    H, K, d = 64, 8, 64
    kc = rng.standard_normal((K, cap, d)).astype(np.float16).view(np.uint16)
    vc = rng.standard_normal((K, cap, d)).astype(np.float16).view(np.uint16)
    q = rng.standard_normal((T, H, d)).astype(np.float32)
    sinks = rng.standard_normal(H).astype(np.float32)
    batch = np.empty((T, H, d), np.float32)
    _kernels.attention(q, kc, vc, sinks, pos0, window, 0.125, batch, impl)
    for t in range(T):
        alone = np.empty((1, H, d), np.float32)
        _kernels.attention(q[t:t + 1].copy(), kc, vc, sinks, pos0 + t, window, 0.125, alone, impl)
        np.testing.assert_array_equal(alone[0].view(np.uint32), batch[t].view(np.uint32), err_msg=f"query {t}")


def fp16_edge_values(rng, n):
    """float32 values across fp16's range, with its hard cases: exact ties
    between neighbours (normal and subnormal), the overflow edge (65504,
    65519.99, 65520), the zero edge (2^-25 and its neighbours), infinities;
    the rest random over 2^-30 .. 2^17."""
    ties = (rng.integers(0, 1 << 15, n).astype(np.uint16).view(np.float16).astype(np.float32)
            .view(np.uint32) | np.uint32(0x1000)).view(np.float32)   # half-way to the next fp16 code
    edges = np.array([65504, 65519.996, 65520, 2.0 ** -25, np.nextafter(2.0 ** -25, 1), np.nextafter(2.0 ** -25, 0),
                      2.0 ** -14, np.nextafter(2.0 ** -14, 0), 3 * 2.0 ** -26, 0.0, -0.0, np.inf, -np.inf],
                     np.float32)
    spread = (rng.standard_normal(n) * 2.0 ** rng.uniform(-30, 17, n)).astype(np.float32)
    v = np.concatenate([ties[np.isfinite(ties)], edges, -edges, spread])
    return np.resize(v, n)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("cap,pos0,T", [(40, 0, 40), (64, 30, 1), (12, 20, 5), (143, 300, 128)])
def test_attention_stores_new_keys_and_values_as_numpy(impl, cap, pos0, T):
    # new_k and new_v enter the cache as numpy's astype(float16) gives them
    # (nearest, ties to even; subnormals, overflow), at slot position % cap
    rng = np.random.default_rng(cap + T)
    H, K, d, dv = 16, 2, 64, 64
    k = fp16_edge_values(rng, T * K * d).reshape(T, K, d)
    v = fp16_edge_values(rng, T * K * dv).reshape(T, K, dv)
    kc = rng.standard_normal((K, cap, d)).astype(np.float16)
    vc = rng.standard_normal((K, cap, dv)).astype(np.float16)
    ref_k, ref_v = kc.copy(), vc.copy()
    with np.errstate(over="ignore"):   # (numpy warns of the values it rounds to infinity)
        for t in range(T):
            ref_k[:, (pos0 + t) % cap], ref_v[:, (pos0 + t) % cap] = k[t].astype(np.float16), v[t].astype(np.float16)
    out = np.empty((T, H, dv), np.float32)
    _kernels.attention(np.zeros((T, H, d), np.float32), kc.view(np.uint16), vc.view(np.uint16), None, pos0, cap - T + 1,
                       0.125, out, impl, new_k=k, new_v=v)
    np.testing.assert_array_equal(kc.view(np.uint16), ref_k.view(np.uint16))
    np.testing.assert_array_equal(vc.view(np.uint16), ref_v.view(np.uint16))


@pytest.mark.parametrize("impl", IMPLS)
def test_attention_reads_what_it_stored(impl):
    # a batch's keys and values stored by the call are what its queries
    # attend: the same output as numpy storing them first
    rng = np.random.default_rng(7)
    T, H, K, d, cap, pos0 = 5, 16, 2, 64, 40, 20
    k = rng.standard_normal((T, K, d)).astype(np.float32)
    v = rng.standard_normal((T, K, d)).astype(np.float32)
    q = rng.standard_normal((T, H, d)).astype(np.float32)
    kc = rng.standard_normal((K, cap, d)).astype(np.float16)
    vc = rng.standard_normal((K, cap, d)).astype(np.float16)
    kn, vn = kc.copy(), vc.copy()
    for t in range(T):
        kn[:, (pos0 + t) % cap], vn[:, (pos0 + t) % cap] = k[t], v[t]
    want, got = np.empty((T, H, d), np.float32), np.empty((T, H, d), np.float32)
    _kernels.attention(q, kn.view(np.uint16), vn.view(np.uint16), None, pos0, 0, 0.125, want, impl)
    _kernels.attention(q, kc.view(np.uint16), vc.view(np.uint16), None, pos0, 0, 0.125, got, impl, new_k=k, new_v=v)
    np.testing.assert_array_equal(got, want)


def test_attention_store_keeps_nan_and_refuses_bad_shapes():
    kc = np.zeros((2, 8, 16), np.uint16)
    k = np.full((1, 2, 16), np.nan, np.float32)
    k[0, 1] = -np.nan
    out = np.empty((1, 4, 16), np.float32)
    _kernels.attention(np.zeros((1, 4, 16), np.float32), kc, kc.copy(), None, 3, 0, 1.0, out, new_k=k, new_v=k)
    stored = kc.view(np.float16)[:, 3]
    assert np.isnan(stored).all() and (np.signbit(stored) == np.signbit(k[0])).all()
    with pytest.raises(ValueError, match="new_k and new_v come together"):
        _kernels.attention(np.zeros((1, 4, 16), np.float32), kc, kc.copy(), None, 3, 0, 1.0, out, new_k=k)
    with pytest.raises(ValueError, match=r"new_k and new_v must be \(T, kv heads, head dim\)"):
        _kernels.attention(np.zeros((1, 4, 16), np.float32), kc, kc.copy(), None, 3, 0, 1.0, out,
                           new_k=k[:, :1], new_v=k[:, :1])


def test_attention_refuses_a_cache_too_small():
    q = np.zeros((5, 2, 16), np.float32)
    kc = np.zeros((1, 4, 16), np.uint16)
    with pytest.raises(ValueError, match="the KV cache holds 4 positions, these queries need 8"):
        _kernels.attention(q, kc, kc, None, 10, 4, 1.0, np.empty((5, 2, 16), np.float32))
    new = np.ones((5, 1, 16), np.float32)   # refused before any new key or value enters the cache
    with pytest.raises(ValueError, match="the KV cache holds 4 positions, these queries need 8"):
        _kernels.attention(q, kc, kc, None, 10, 4, 1.0, np.empty((5, 2, 16), np.float32), new_k=new, new_v=new)
    assert not kc.any()


def test_threads_can_be_set():
    n = _kernels.num_threads()
    try:
        _kernels.set_num_threads(1)
        assert _kernels.num_threads() == 1
        test_matmul_matches_float64("auto", "i16", "q8_0", QT.Q8_0, 33, 96, 8)
    finally:
        _kernels.set_num_threads(n)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("T,D", [(1, 2880), (5, 64), (3, 100)])
def test_rms_norm_matches_float64(impl, T, D):
    rng = np.random.default_rng(T * D)
    x = (rng.standard_normal((T, D)) * 3).astype(np.float32)
    w = rng.standard_normal(D).astype(np.float32)
    out = np.empty_like(x)
    _kernels.rms_norm(x, w, 1e-5, out, impl)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=f"rms_norm: weight has {D + 1} values, expected {D}"):
        _kernels.rms_norm(x, np.ones(D + 1, np.float32), 1e-5, out, impl)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("T,D", [(1, 2880), (5, 64)])
def test_add_rms_norm_is_numpys_add_then_the_norm(impl, T, D):
    # x += add in place is numpy's float32 x + add, bit for bit, and the norm
    # the same bits as rms_norm of that sum
    rng = np.random.default_rng(T + D)
    x = (rng.standard_normal((T, D)) * 3).astype(np.float32)
    add = (rng.standard_normal((T, D)) * 5).astype(np.float32)
    w = rng.standard_normal(D).astype(np.float32)
    want_x = x + add
    want = np.empty_like(x)
    _kernels.rms_norm(want_x, w, 1e-5, want, impl)
    out = np.empty_like(x)
    _kernels.add_rms_norm(x, add, w, 1e-5, out, impl)
    np.testing.assert_array_equal(x, want_x)
    np.testing.assert_array_equal(out, want)
    with pytest.raises(ValueError, match=rf"add_rms_norm: add has shape \({T}, {D - 1}\), expected \({T}, {D}\)"):
        _kernels.add_rms_norm(x, add[:, 1:].copy(), w, 1e-5, out, impl)
    with pytest.raises(ValueError, match=f"add_rms_norm: weight has {D + 1} values, expected {D}"):
        _kernels.add_rms_norm(x, add, np.ones(D + 1, np.float32), 1e-5, out, impl)
    np.testing.assert_array_equal(x, want_x)   # (refused before x changed)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("E,k", [(32, 4), (8, 2), (4, 4)])
def test_route_matches_float64(impl, E, k):
    rng = np.random.default_rng(E + k)
    D, T = 96, 6
    W = rng.standard_normal((E, D)).astype(np.float32)
    bias = rng.standard_normal(E).astype(np.float32)
    h = rng.standard_normal((T, D)).astype(np.float32)
    W[1] = W[2]            # experts 1 and 2 tie on every token: the lower index goes first
    bias[1] = bias[2]
    top = np.empty((T, k), np.int64)
    weights = np.empty((T, k), np.float32)
    _kernels.route(W, bias, h, top, weights, impl)
    logits = h.astype(np.float64) @ W.T.astype(np.float64) + bias
    ref_top = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    np.testing.assert_array_equal(top, ref_top)
    chosen = np.take_along_axis(logits, ref_top, -1)
    ref_w = np.exp(chosen - chosen[:, :1])
    ref_w /= ref_w.sum(-1, keepdims=True)
    np.testing.assert_allclose(weights, ref_w, rtol=1e-5, atol=1e-6)
    for t in range(T):   # the tie, wherever it lands among the chosen
        row = list(top[t])
        if 1 in row and 2 in row:
            assert row.index(1) < row.index(2)


@pytest.mark.parametrize("T", [1, 3, 9])
def test_route_over_the_pool_is_each_token_alone_on_one_thread(T):
    # at the 20b's width the router's logits run over the pool (decode's few
    # tokens split the experts, more tokens split the tokens): a token's
    # experts and weights are the same bits as it alone on one thread, and
    # its experts are float64's top k
    rng = np.random.default_rng(T)
    E, D, k = 32, 2880, 4
    W = rng.standard_normal((E, D)).astype(np.float32)
    bias = rng.standard_normal(E).astype(np.float32)
    h = rng.standard_normal((T, D)).astype(np.float32)
    top, weights = np.empty((T, k), np.int64), np.empty((T, k), np.float32)
    def pooled():   # regions run over the pool (or on the caller while another process took a core)
        st = _kernels.pool_stats()
        return st["parallel"] + st["inline_contended"]
    before = pooled()
    _kernels.route(W, bias, h, top, weights)
    if _kernels.num_threads() > 1:
        assert pooled() > before
    n = _kernels.num_threads()
    try:
        _kernels.set_num_threads(1)
        for t in range(T):
            one_top, one_w = np.empty((1, k), np.int64), np.empty((1, k), np.float32)
            _kernels.route(W, bias, h[t:t + 1], one_top, one_w)
            np.testing.assert_array_equal(top[t], one_top[0])
            np.testing.assert_array_equal(weights[t], one_w[0])
    finally:
        _kernels.set_num_threads(n)
    logits = h.astype(np.float64) @ W.T.astype(np.float64) + bias
    np.testing.assert_array_equal(top, np.argsort(-logits, axis=-1, kind="stable")[:, :k])


def test_route_refuses_bad_shapes():
    W = np.zeros((8, 64), np.float32)
    h = np.zeros((2, 64), np.float32)
    with pytest.raises(ValueError, match=r"route: top and weights must be \(T, k\) with 1 <= k <= 8"):
        _kernels.route(W, None, h, np.empty((2, 9), np.int64), np.empty((2, 9), np.float32))
    with pytest.raises(ValueError, match="route: activations have 32 columns, the router 64"):
        _kernels.route(W, None, np.zeros((2, 32), np.float32), np.empty((2, 2), np.int64),
                       np.empty((2, 2), np.float32))
    with pytest.raises(ValueError, match="route: bias has 7 values, expected 8"):
        _kernels.route(W, np.zeros(7, np.float32), h, np.empty((2, 2), np.int64), np.empty((2, 2), np.float32))


def test_rope_matches_float64():
    rng = np.random.default_rng(3)
    T, H, d = 4, 3, 16
    x = rng.standard_normal((T, H, d)).astype(np.float32)
    ang = rng.uniform(0, 6, (T, d // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    x64, c, s = x.astype(np.float64), cos.astype(np.float64)[:, None], sin.astype(np.float64)[:, None]
    ref = np.concatenate([x64[..., :8] * c - x64[..., 8:] * s, x64[..., 8:] * c + x64[..., :8] * s], -1)
    _kernels.rope(x, cos, sin)     # in place
    np.testing.assert_allclose(x, ref, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match=r"rope: x is \(4, 3, 16\), cos and sin must be \(4, 8\)"):
        _kernels.rope(x, cos[:, :4].copy(), sin)


def test_threads_give_the_bits_of_one_and_small_regions_stay_on_the_caller():
    rng = np.random.default_rng(7)
    raw, _ = quantized(rng, 512, 2880, QT.Q8_0)          # 1.5 MiB of weights: worth the second thread
    x = rng.standard_normal((4, 2880)).astype(np.float32)
    small_raw, _ = quantized(rng, 256, 64, QT.Q8_0)      # 17 KiB: not
    small_x = x[:, :64].copy()
    n = _kernels.num_threads()
    try:
        outs = {}
        for threads in (1, 2):
            _kernels.set_num_threads(threads)
            before = _kernels.pool_stats()
            big, small = np.empty((4, 512), np.float32), np.empty((4, 256), np.float32)
            _kernels.matmul("q8_0", raw, x, big, None, "auto", "i16")
            _kernels.matmul("q8_0", small_raw, small_x, small, None, "auto", "i16")
            after = _kernels.pool_stats()
            outs[threads] = (big, small)
            if threads == 2:
                assert after["parallel"] + after["inline_contended"] > before["parallel"] + \
                    before["inline_contended"]                   # the big one was a parallel region
                assert after["inline_small"] == before["inline_small"] + 1   # the small one ran on the caller
        assert np.array_equal(outs[1][0], outs[2][0]) and np.array_equal(outs[1][1], outs[2][1])
    finally:
        _kernels.set_num_threads(n)
