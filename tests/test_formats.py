"""Every weight format of the published gpt-oss files, in every native kernel:
dequantization bit-exact against gguf-py (random codes, extreme scales), row
products against float64 numpy on the dequantized weights, both
implementations and both activation precisions, the fused argmax, the
embedding lookup and a layer's experts."""
import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import quants

from goosedump import _kernels, randblocks
from goosedump.gguf import BLOCK_SIZES, GGMLType

IMPLS = _kernels.available_impls()
FORMATS = _kernels.formats()
FLOATS = ("f32", "f16", "bf16")
SUPER = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs")
# Byte offsets of each format's fp16 scale fields within a block.
FP16_FIELDS = {"q4_0": [0], "q4_1": [0, 2], "q5_0": [0], "q5_1": [0, 2], "q8_0": [0], "q2_k": [80, 82],
               "q3_k": [108], "q4_k": [0, 2], "q5_k": [0, 2], "q6_k": [208], "iq4_nl": [0], "iq4_xs": [0]}
EXTREMES = np.array([0.0, -0.0, 6e-8, -6e-8, 6.1e-5, -65504.0, 65504.0, 1.0, -3.5e-3], "<f2")


def gtype(fmt: str) -> GGMLType:
    return GGMLType[fmt.upper()]


def random_raw(rng, fmt: str, n_blocks: int) -> np.ndarray:
    """Random bytes, blocks of fmt; scale fields from the extremes and from
    normal values across magnitudes (never NaN or infinity, whose payloads
    need not survive)."""
    _, size = BLOCK_SIZES[gtype(fmt)]
    if fmt in FLOATS:
        x = rng.standard_normal(n_blocks) * 10.0 ** rng.integers(-6, 4, n_blocks)
        x[:min(n_blocks, len(EXTREMES))] = EXTREMES[:n_blocks]
        if fmt == "f32":
            return x.astype("<f4").view(np.uint8)
        if fmt == "f16":
            return np.clip(x, -65504, 65504).astype("<f2").view(np.uint8)
        return (x.astype(np.float32).view(np.uint32) >> 16).astype("<u2").view(np.uint8)
    raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    for off in FP16_FIELDS.get(fmt, []):
        d = (rng.standard_normal(n_blocks) * 10.0 ** rng.integers(-5, 1, n_blocks)).astype("<f2")
        d[:min(n_blocks, len(EXTREMES))] = EXTREMES[:n_blocks]
        raw[:, off:off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    if fmt == "mxfp4":
        raw[:min(3, n_blocks), 0] = [0, 1, 254][:min(3, n_blocks)]   # 2^-128 is a float subnormal
    return raw.reshape(-1)


def reference(raw: np.ndarray, fmt: str) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return quants.dequantize(raw, QT[fmt.upper()]).reshape(-1).astype(np.float32)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("n_blocks", [1, 3, 33])
@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_is_bit_exact_against_gguf_py(impl, n_blocks, fmt):
    rng = np.random.default_rng(n_blocks * 100 + FORMATS.index(fmt))
    raw = random_raw(rng, fmt, n_blocks * (32 if fmt in FLOATS else 1))
    expect = reference(raw, fmt)
    out = np.empty(expect.size, np.float32)
    _kernels.dequantize(fmt, raw, out, impl)
    np.testing.assert_array_equal(out.view(np.uint32), expect.view(np.uint32))


def quantized(rng, fmt: str, n: int, k: int):
    """A random [n, k] matrix in fmt (as synthetic models write them) and its
    values as gguf-py reads them, in float64."""
    values, _ = BLOCK_SIZES[gtype(fmt)]
    raw = randblocks.blocks(gtype(fmt), rng, n * k // values, 0.5).reshape(n, -1)
    return raw, reference(raw.reshape(-1), fmt).reshape(n, k).astype(np.float64)


def shapes(fmt):
    base = [(1, 256, 1), (31, 512, 3), (33, 768, 8), (17, 256, 9), (40, 2304, 13)]
    if fmt not in SUPER:
        base += [(7, 32, 2), (9, 96, 5), (100, 2880, 4)]
    return base


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("acts", ["f32", "i16"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_matmul_matches_float64(impl, acts, fmt):
    for n, k, t in shapes(fmt):
        rng = np.random.default_rng(n * 1000 + t)
        raw, w = quantized(rng, fmt, n, k)
        x = rng.standard_normal((t, k)).astype(np.float32)
        x[0, :32] = 0  # an all-zero activation block
        bias = rng.standard_normal(n).astype(np.float32)
        out = np.empty((t, n), np.float32)
        _kernels.matmul(fmt, raw, x, out, bias, impl, acts)
        ref = x.astype(np.float64) @ w.T + bias
        # (plain floats always take fp32 activations)
        bound = error_bound(x, w, bias, acts == "i16" and fmt not in FLOATS)
        assert np.all(np.abs(out - ref) <= bound), f"{fmt} {n}x{k}, {t} tokens"


def error_bound(x: np.ndarray, w: np.ndarray, bias=None, int16: bool = True, exact=()) -> np.ndarray:
    """Each product's bound, element by element: int16 activations round by
    up to 2^-15 of their block's largest value (blocks in exact: none, their
    values being multiples of their step), and fp32 sums by ~sqrt(k)
    roundings of the sum of |terms|."""
    x64 = x.astype(np.float64)
    bound = 8 * 2.0 ** -24 * math.sqrt(x.shape[1]) * (np.abs(x64) @ np.abs(w).T)
    if bias is not None:
        bound += 2.0 ** -23 * np.abs(bias)
    if int16:
        blocks = np.abs(x64).reshape(x.shape[0], -1, 32).max(axis=2)
        blocks[:, list(exact)] = 0
        bound += 2.0 ** -15 * np.repeat(blocks, 32, axis=1) @ np.abs(w).T
    return bound


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scale", [2.0 ** -100, 2.0 ** 100])
def test_int16_activations_keep_their_precision_at_any_magnitude(impl, fmt, scale):
    """Each 32-block of activations takes its own power-of-two scale: a block
    far larger than the rest, here one whose values are multiples of its
    int16 step (exact), leaves the others their own precision, which a scale
    shared along the row (the large block's) would lose."""
    rng = np.random.default_rng(7)
    raw, w = quantized(rng, fmt, 40, 512)
    x = rng.standard_normal((3, 512))
    x[:, 32:64] = np.clip(np.rint(x[:, 32:64] * 8000) / 8, -4000, 4000)   # < 4096: step 1/8
    x[:, 64:96] *= 1e-3     # one far smaller
    x = (x * scale).astype(np.float32)
    out = np.empty((3, 40), np.float32)
    _kernels.matmul(fmt, raw, x, out, None, impl, "i16")
    ref = x.astype(np.float64) @ w.T
    bound = error_bound(x, w, int16=fmt not in FLOATS, exact=[1])
    assert np.all(np.abs(out - ref) <= bound)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("blocks", [45, 16, 15, 3, 1])
def test_batch_invariance(impl, fmt, blocks):
    """A token's products are the same bits alone, in a pair or among others:
    the guarantee behind prefill = decode and batched = alone. Rows of 45,
    16, 15, 3 and 1 blocks: the one- and two-token loops take blocks four at a
    time, then in pairs, then one (AVX-512's MXFP4 and Q8_0 take eight
    blocks per register, decode's one to three tokens by the bytes of the
    activations (the split form: MXFP4 up to 3, Q8_0 up to 2), and two rows
    at a time from 4 tokens on: 19 tokens, 25 rows, so a row is left alone
    too)."""
    rng = np.random.default_rng(11)
    values = BLOCK_SIZES[gtype(fmt)][0] if fmt not in FLOATS else 32
    k = blocks * values
    raw, _ = quantized(rng, fmt, 25, k)
    # blocks of far apart magnitudes, so that partial sums round and a
    # different order of summation shows in the bits
    x = rng.standard_normal((19, k)) * 2.0 ** rng.integers(-12, 12, (19, k // 32)).repeat(32, axis=1)
    x = x.astype(np.float32)
    batch = np.empty((19, 25), np.float32)
    _kernels.matmul(fmt, raw, x, batch, None, impl)
    for t in (0, 5, 9, 16):
        for n in (1, 2, 3):
            few = np.empty((n, 25), np.float32)
            _kernels.matmul(fmt, raw, x[t:t + n], few, None, impl)
            np.testing.assert_array_equal(few, batch[t:t + n])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("T,k", [(48, 45 * 32), (15, 512 * 32)])
def test_batch_invariance_of_long_mxfp4_products(impl, T, k):
    """Products whose activations outgrow the L2 (48 tokens of a 1,440-wide
    row: 135 KB of int16) change their loop order on AVX2: each full tile
    takes a group of rows 32 blocks at a time, then the rest, then an odd
    last block alone, the accumulators kept between stretches; a last,
    partial tile (7 tokens of a 16,384-wide row: 229 KB on their own) takes
    the rows whole. A token's bits stay those of its products alone."""
    rng = np.random.default_rng(12)
    raw, w = quantized(rng, "mxfp4", 40, k)
    x = rng.standard_normal((T, k)) * 2.0 ** rng.integers(-12, 12, (T, k // 32)).repeat(32, axis=1)
    x = x.astype(np.float32)
    batch = np.empty((T, 40), np.float32)
    _kernels.matmul("mxfp4", raw, x, batch, None, impl)
    for t in (0, 7, 8, T - 3, T - 1):
        alone = np.empty((1, 40), np.float32)
        _kernels.matmul("mxfp4", raw, x[t:t + 1], alone, None, impl)
        np.testing.assert_array_equal(alone, batch[t:t + 1])
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose(batch, ref, rtol=0, atol=1e-3 * np.abs(ref).max())


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_argmax_and_row_lookup(impl, fmt):
    rng = np.random.default_rng(5)
    raw, w = quantized(rng, fmt, 700, 256)
    x = rng.standard_normal(256).astype(np.float32)
    i, v = _kernels.matvec_argmax(fmt, raw, x, impl)
    full = np.empty((1, 700), np.float32)
    _kernels.matmul(fmt, raw, x[None], full, None, impl)
    assert i == int(np.argmax(full[0])) and v == full[0, i]       # the same products, fused
    assert (w @ x)[i] >= (w @ x).max() - 1e-3 * np.abs(w @ x).max()
    rows = np.empty((3, 256), np.float32)
    _kernels.get_rows(fmt, raw, np.array([699, 0, 699]), rows, impl)
    np.testing.assert_array_equal(rows, w[[699, 0, 699]].astype(np.float32))


def swiglu(g, u, alpha=1.702, limit=7.0):
    g = np.minimum(g, limit)
    u = np.clip(u, -limit, limit)
    return g / (1 + np.exp(-alpha * g)) * (u + 1)


EXPERT_FORMATS = [(f, f, f) for f in FORMATS if f not in SUPER] + [
    ("q5_0", "q5_0", "q8_0"),     # llama-quantize Q4_K_M: ffn_down with more bits on some layers
    ("mxfp4", "q4_1", "f16"), ("q8_0", "mxfp4", "q5_1")]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("acts", ["i16", "f32"])
@pytest.mark.parametrize("fmts", EXPERT_FORMATS, ids="-".join)
def test_experts_in_every_format(impl, acts, fmts):
    """A layer's experts with gate, up and down in the given formats
    (experts' rows are the hidden size, never a multiple of 256 in gpt-oss:
    super-block formats cannot hold them) against float64."""
    rng = np.random.default_rng(3)
    E, F, D, T, k = 4, 96, 64, 5, 2
    mats = {}
    for name, fmt, (rows, cols) in (("gate", fmts[0], (F, D)), ("up", fmts[1], (F, D)), ("down", fmts[2], (D, F))):
        raws, vals = zip(*(quantized(rng, fmt, rows, cols) for _ in range(E)))
        mats[name] = (np.ascontiguousarray(np.stack(raws)), np.stack(vals))
    biases = {n: (0.1 * rng.standard_normal((E, F if n != "down" else D))).astype(np.float32)
              for n in ("gate", "up", "down")}
    h = rng.standard_normal((T, D)).astype(np.float32)
    experts = np.array([[0, 3], [1, 2], [3, 0], [2, 1], [0, 1]], np.int64)
    weights = rng.uniform(0.1, 1, (T, k)).astype(np.float32)
    out = np.empty((T, D), np.float32)
    _kernels.moe(fmts[0], mats["gate"][0], biases["gate"], fmts[1], mats["up"][0], biases["up"], fmts[2],
                 mats["down"][0], biases["down"], h, experts, weights, out, 1.702, 7.0, impl, acts)
    ref = np.zeros((T, D))
    for t in range(T):
        for j in range(k):
            e = experts[t, j]
            g = mats["gate"][1][e] @ h[t] + biases["gate"][e]
            u = mats["up"][1][e] @ h[t] + biases["up"][e]
            ref[t] += weights[t, j] * (mats["down"][1][e] @ swiglu(g, u) + biases["down"][e])
    np.testing.assert_allclose(out, ref, rtol=0, atol=(1e-5 if acts == "f32" else 2e-4) * np.abs(ref).max())


def test_bad_format_and_sizes():
    with pytest.raises(ValueError, match="format must be one of f32, f16, bf16, q4_0, .*, mxfp4, got 'q9_9'"):
        _kernels.dequantize("q9_9", np.zeros(18, np.uint8), np.zeros(32, np.float32))
    with pytest.raises(ValueError, match="not a whole number of 144-byte blocks"):
        _kernels.dequantize("q4_k", np.zeros(145, np.uint8), np.zeros(256, np.float32))
    with pytest.raises(ValueError, match=r"activations have 288 columns, not a multiple of 256 \(q6_k\)"):
        _kernels.matmul("q6_k", np.zeros((2, 210), np.uint8), np.zeros((1, 288), np.float32),
                        np.empty((1, 2), np.float32))
