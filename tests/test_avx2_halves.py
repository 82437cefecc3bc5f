"""The AVX2 kernels' forms for cores that split each 256-bit operation in
two (AMD Zen 1: MXFP4's and Q8_0's rows in 128-bit registers), on any
AVX2 CPU: GOOSEDUMP_AVX2_HALVES=1 and =0 choose the form
in two processes, each computing the same products (every format, since the
halves' dispatch sits in front of them all; one to 48 tokens; rows of 1 to
90 blocks, odd and even, with and without the 8-block runs and the
stretched tiles).

- Every format but MXFP4 and Q8_0 gives the 256-bit form's bits.
- MXFP4 and Q8_0 have an arithmetic of their own in the halves' form (4
  lanes, each block's lane sums scaled into the accumulators one block
  after another): their products equal, bit for bit, that arithmetic
  written out in numpy from the activations' int16 rounding on (float32
  steps, each rounded as the kernel rounds it, the fused multiply-add's
  once).
- In both forms every token's products are the same bits alone as in its
  batch, and every product is within the int16 bound of float64."""
import os
import subprocess
import sys

import numpy as np

PRODUCTS = r"""
import sys
import numpy as np
from goosedump import _kernels, randblocks
from goosedump.gguf import BLOCK_SIZES, GGMLType

rng = np.random.default_rng(7)
out = {"halves": np.array(_kernels.cpu_splits_256())}
for fmt in _kernels.formats():
    if fmt in ("f32", "f16", "bf16"):
        continue
    values = BLOCK_SIZES[GGMLType[fmt.upper()]][0]
    for blocks in (1, 3, 8, 15, 16, 45, 90):
        k = blocks * 32 if values == 32 else -(-blocks * 32 // values) * values
        raw = np.ascontiguousarray(randblocks.blocks(GGMLType[fmt.upper()], rng, 9 * k // values, 0.02).reshape(9, -1))
        for t in (1, 2, 3, 8, 19, 48):
            x = rng.standard_normal((t, k)) * 2.0 ** rng.integers(-12, 12, (t, k // 32)).repeat(32, axis=1)
            x = x.astype(np.float32)
            y = np.empty((t, 9), np.float32)
            _kernels.matmul(fmt, raw, x, y, None, "avx2", "i16")
            alone = np.empty((t, 9), np.float32)
            for i in range(t):
                _kernels.matmul(fmt, raw, x[i:i + 1], alone[i:i + 1], None, "avx2", "i16")
            w = np.empty((9, k), np.float32)
            _kernels.dequantize(fmt, raw.reshape(-1), w.reshape(-1), "generic")
            key = f"{fmt} {blocks} {t}"
            out[key], out[key + " alone"], out[key + " x"], out[key + " w"], out[key + " raw"] = y, alone, x, w, raw
np.savez(sys.argv[1], **out)
"""
EXTRA = (" alone", " x", " w", " raw")
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int64)   # twice E2M1's


def products(tmp_path, halves: str) -> dict:
    path = tmp_path / f"halves{halves}.npz"
    subprocess.run([sys.executable, "-c", PRODUCTS, str(path)], check=True, timeout=600,
                   env={**os.environ, "GOOSEDUMP_AVX2_HALVES": halves, "GOOSEDUMP_ISA": "avx2"})
    return dict(np.load(path))


def int16_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each 32-block times 2^k, the largest power of two that keeps its
    largest value within 32767, rounded to the nearest integer (ties to
    even): (codes (T, blocks, 32), k (T, blocks))."""
    xb = x.reshape(x.shape[0], -1, 32)
    amax = np.abs(xb).max(axis=2)
    m, p = np.frexp(amax)
    k = np.where(amax > 0, np.clip(15 - p - (m * np.float32(32768) > 32767), -126, 126), 0)
    return np.rint(xb.astype(np.float64) * 2.0 ** k[..., None]).astype(np.int64), k


def halves_mxfp4(raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The halves' form's MXFP4 arithmetic: per token and row, lane i of a
    block sums the products of values 4i..4i+3 and 16+4i..16+4i+3 exactly;
    the sum times the block's scale (weights' 2^(e - 128) for the doubled
    values, activations' 2^-k: exact) is added into lane i's float32
    accumulator block after block; the row's sum is (l0 + l2) + (l1 + l3)."""
    T, N = x.shape[0], raw.shape[0]
    b = raw.reshape(N, -1, 17)
    codes = np.concatenate([MXFP4_VALUES[b[:, :, 1:] & 15], MXFP4_VALUES[b[:, :, 1:] >> 4]], axis=2)
    q, k = int16_activations(x)
    nb = q.shape[1]
    sums = np.einsum("tbhle,nbhle->tnbl", q.reshape(T, nb, 2, 4, 4), codes.reshape(N, nb, 2, 4, 4))
    scale = 2.0 ** (b[None, :, :, 0].astype(np.int64) - 128 - k[:, None, :])
    terms = (sums * scale[..., None]).astype(np.float32)
    assert np.array_equal(terms.astype(np.float64), sums * scale[..., None])    # each term exact in float32
    acc = np.zeros((T, N, 4), np.float32)
    for c in range(nb):
        acc = acc + terms[:, :, c]
    return (acc[..., 0] + acc[..., 2]) + (acc[..., 1] + acc[..., 3]) + np.float32(0)


def fma32(acc: np.ndarray, c: np.ndarray, d: np.ndarray) -> np.ndarray:
    """float32 acc + c * d rounded once, as vfmadd does (c * d is exact in
    float64 here: 24 and 11 significant bits): the float64 sum and its
    rounding error (TwoSum), then float32's rounding of the sum, which is
    the exact value's unless the sum lies on a float32 midpoint that the
    error breaks."""
    a, p = acc.astype(np.float64), c.astype(np.float64) * d.astype(np.float64)
    s = a + p
    bb = s - a
    err = (a - (s - bb)) + (p - bb)
    r = s.astype(np.float32)
    lo = np.where(r.astype(np.float64) > s, np.nextafter(r, np.float32(-np.inf)), r)
    hi = np.nextafter(lo, np.float32(np.inf))
    tie = (s == (lo.astype(np.float64) + hi.astype(np.float64)) / 2) & (err != 0)
    return np.where(tie, np.where(err > 0, hi, lo), r)


def halves_q8_0(raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The halves' form's Q8_0 arithmetic: lane i of a block sums the
    products of values 2i, 2i + 1, 8 + 2i, 9 + 2i, .., 25 + 2i exactly, the
    sum rounded to float32; the block's scale is its fp16 times the
    activations' 2^-k (exact); each lane's sum times the scale is added into
    the lane's float32 accumulator by one fused multiply-add, block after
    block; the row's sum is (l0 + l2) + (l1 + l3)."""
    T, N = x.shape[0], raw.shape[0]
    b = raw.reshape(N, -1, 34)
    d = np.ascontiguousarray(b[:, :, :2]).view(np.float16)[..., 0].astype(np.float32)
    codes = np.ascontiguousarray(b[:, :, 2:]).view(np.int8).astype(np.int64)
    q, k = int16_activations(x)
    nb = q.shape[1]
    sums = np.einsum("tbrle,nbrle->tnbl", q.reshape(T, nb, 4, 4, 2), codes.reshape(N, nb, 4, 4, 2))
    lanes = sums.astype(np.float32)
    scale = d[None] * (2.0 ** -k).astype(np.float32)[:, None]       # (T, N, blocks)
    acc = np.zeros((T, N, 4), np.float32)
    for c in range(nb):
        acc = fma32(acc, lanes[:, :, c], np.repeat(scale[:, :, c, None], 4, axis=2))
    return (acc[..., 0] + acc[..., 2]) + (acc[..., 1] + acc[..., 3]) + np.float32(0)


def test_fma32_rounds_once():
    """The emulation against exact rationals: random cases, and cases whose
    float64 sum is a float32 midpoint that the exact value is not (1 +
    2^-24 + 23 2^-58 from 1 and (2^34 + 23) 2^-58 = 8577069 * 2003 2^-58,
    which rounds up where the sum alone would round to even; and 1 + 2^-23
    plus (2^34 - 23) 2^-58 = 10811749 * 1589 2^-58, down), scaled and
    negated."""
    from fractions import Fraction
    rng = np.random.default_rng(3)
    acc = (rng.standard_normal(3000) * 2.0 ** rng.integers(-40, 40, 3000)).astype(np.float32)
    c = rng.integers(-2 ** 24, 2 ** 24, 3000).astype(np.float32)
    d = (rng.integers(1024, 2048, 3000) * 2.0 ** rng.integers(-60, -10, 3000)).astype(np.float32)
    scales = range(-20, 20)
    mid = [(np.float32(2.0 ** j * sign), np.float32(8577069 * sign), np.float32(2003 * 2.0 ** (j - 58)))
           for sign in (1, -1) for j in scales]
    mid += [(np.float32((1 + 2.0 ** -23) * 2.0 ** j * sign), np.float32(10811749 * sign),
             np.float32(1589 * 2.0 ** (j - 58))) for sign in (1, -1) for j in scales]
    acc, c, d = (np.concatenate([v, np.array(m, np.float32)]) for v, m in zip((acc, c, d), zip(*mid)))
    got = fma32(acc, c, d)
    naive = (acc.astype(np.float64) + c.astype(np.float64) * d.astype(np.float64)).astype(np.float32)
    assert np.count_nonzero(got != naive) >= len(mid)      # the midpoints: one rounding, not two
    for i in range(len(acc)):
        exact = Fraction(float(acc[i])) + Fraction(float(c[i])) * Fraction(float(d[i]))
        lo = np.float32(float(exact))
        while Fraction(float(lo)) > exact:
            lo = np.nextafter(lo, np.float32(-np.inf))
        while Fraction(float(np.nextafter(lo, np.float32(np.inf)))) <= exact:
            lo = np.nextafter(lo, np.float32(np.inf))
        hi = np.nextafter(lo, np.float32(np.inf))
        below, above = exact - Fraction(float(lo)), Fraction(float(hi)) - exact
        want = lo if below < above or (below == above and lo.view(np.uint32) % 2 == 0) else hi
        assert got[i] == want, (i, acc[i], c[i], d[i])


def test_each_form_and_its_arithmetic(tmp_path):
    halves, wide = products(tmp_path, "1"), products(tmp_path, "0")
    assert halves.pop("halves") and not wide.pop("halves")    # the variable chose the form
    keys = [k for k in halves if not k.endswith(EXTRA)]
    assert len(keys) > 200 and keys == [k for k in wide if not k.endswith(EXTRA)]
    differ = 0
    for key in keys:
        if key.startswith(("mxfp4 ", "q8_0 ")):
            arithmetic = halves_mxfp4 if key.startswith("mxfp4 ") else halves_q8_0
            expect = arithmetic(halves[key + " raw"], halves[key + " x"])
            np.testing.assert_array_equal(halves[key].view(np.uint32), expect.view(np.uint32), err_msg=key)
            differ += not np.array_equal(halves[key], wide[key])
        else:
            np.testing.assert_array_equal(halves[key].view(np.uint32), wide[key].view(np.uint32), err_msg=key)
        for form in (halves, wide):
            np.testing.assert_array_equal(form[key + " alone"].view(np.uint32), form[key].view(np.uint32),
                                          err_msg=key)   # batch invariance
            x, w = form[key + " x"].astype(np.float64), form[key + " w"].astype(np.float64)
            exact = x @ w.T
            # int16 activations: up to 2^-15 of each block's largest value per product
            blocks = np.abs(x).reshape(x.shape[0], -1, 32).max(axis=2)
            bound = 2.0 ** -15 * np.repeat(blocks, 32, axis=1) @ np.abs(w).T + 1e-5 * (np.abs(x) @ np.abs(w).T)
            assert np.all(np.abs(form[key] - exact) <= bound), key
    assert differ > 20     # the two forms' arithmetics are not the same ones


def test_the_cpu_decides_when_the_variable_is_unset():
    """Zen 1 and Zen+ (AMD family 17h below model 30h) split 256-bit
    operations; read from /proc/cpuinfo here, apart from the extension's
    CPUID."""
    with open("/proc/cpuinfo") as f:
        info = f.read().split("\n\n")[0]
    field = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in info.splitlines() if ":" in line)}
    vendor, family, model = field["vendor_id"], field["cpu family"], field["model"]
    expect = (vendor == "AuthenticAMD" and int(family) == 0x17 and int(model) < 0x30) or \
             (vendor == "HygonGenuine" and int(family) == 0x18)
    env = {k: v for k, v in os.environ.items() if k != "GOOSEDUMP_AVX2_HALVES"}
    out = subprocess.run([sys.executable, "-c", "from goosedump import _kernels; print(_kernels.cpu_splits_256())"],
                         capture_output=True, text=True, env=env, check=True, timeout=60)
    assert out.stdout.strip() == str(expect)
