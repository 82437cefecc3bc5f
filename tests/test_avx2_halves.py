"""The AVX2 kernels' forms for cores that split each 256-bit operation in
two (AMD Zen 1: MXFP4's, Q8_0's and the one-scale small codes' rows in
128-bit registers), on any AVX2 CPU: GOOSEDUMP_AVX2_HALVES=1 and =0 choose
the form in two processes, each computing the same products (every format,
since the halves' dispatch sits in front of them all; one to 48 tokens; rows
of 1 to 90 blocks, odd and even, with and without the 8-block runs and the
stretched tiles).

- Every other format gives the 256-bit form's bits.
- MXFP4, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and Q4_K have an arithmetic of their
  own in the halves' form (4 lanes, each block's lane sums scaled into the
  accumulators one block after another): their products equal, bit for bit,
  that arithmetic written out in numpy from the activations' int16 rounding
  on (float32 steps, each rounded as the kernel rounds it, the fused
  multiply-add's once). The formats with minimums are checked so on blocks
  whose minimums are zero (their terms, the same steps in both forms, are
  then zero), and like every format on blocks with minimums below.
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
            if fmt in ("q4_1", "q5_1", "q4_k") and t in (1, 8, 19):
                # the same blocks with zero minimums (bytes 2..3: m, or the
                # super-block's dmin)
                # (a copy of its own: the next token counts keep the minimums)
                raw0 = raw.copy()
                raw0.reshape(-1, BLOCK_SIZES[GGMLType[fmt.upper()]][1])[:, 2:4] = 0
                y, w, alone = np.empty_like(y), np.empty_like(w), np.empty_like(alone)
                _kernels.matmul(fmt, raw0, x, y, None, "avx2", "i16")
                for i in range(t):
                    _kernels.matmul(fmt, raw0, x[i:i + 1], alone[i:i + 1], None, "avx2", "i16")
                _kernels.dequantize(fmt, raw0.reshape(-1), w.reshape(-1), "generic")
                key += " m0"
                out[key], out[key + " alone"], out[key + " w"], out[key + " raw"], out[key + " x"] = y, alone, w, raw0, x
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


SMALL = ("q4_0", "q4_1", "q5_0", "q5_1", "q4_k")   # rows_avx2_halves.h's in_four_lanes


def small_codes_and_scales(fmt: str, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A one-scale small-code format's integer codes (rows, chunks, 32) and
    each chunk's scale as float32 (rows, chunks), from the block layouts of
    ggml's spec (minimums left out)."""
    def half(b: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)

    def nibbles(qs: np.ndarray) -> np.ndarray:   # codes 0..15 the low nibbles, 16..31 the high
        return np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.int64)

    n = raw.shape[0]
    if fmt == "q4_k":
        b = raw.reshape(n, -1, 144)
        q = b[:, :, 4:16].astype(np.int64)
        sc = np.concatenate([q[..., 0:4] & 63, (q[..., 8:12] & 15) | ((q[..., 0:4] >> 6) << 4)], axis=-1)
        d = half(b[:, :, 0:2])[..., None] * sc.astype(np.float32)           # (rows, super-blocks, 8): exact
        qs = b[:, :, 16:].reshape(n, -1, 4, 32).astype(np.int64)
        codes = np.stack([qs & 15, qs >> 4], axis=3)                          # chunk 2j: low nibbles, 2j + 1: high
        return codes.reshape(n, -1, 32), d.reshape(n, -1)
    size = {"q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24}[fmt]
    b = raw.reshape(n, -1, size)
    d = half(b[:, :, 0:2])
    if fmt in ("q4_0", "q4_1"):
        codes = nibbles(b[:, :, size - 16:]) - (8 if fmt == "q4_0" else 0)
    else:
        at = 2 if fmt == "q5_0" else 4
        qh = np.ascontiguousarray(b[:, :, at:at + 4]).view("<u4")[..., 0].astype(np.int64)
        fifth = (qh[..., None] >> np.arange(32)) & 1
        codes = nibbles(b[:, :, at + 4:]) + 16 * fifth - (16 if fmt == "q5_0" else 0)
    return codes, d


def halves_small(fmt: str, raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The halves' form's arithmetic of the one-scale small-code formats
    (zero minimums): MXFP4's lanes (i: codes 4i..4i+3 and 16+4i..16+4i+3),
    each lane's sum exact and 256 times it converted exactly, times the
    chunk's scale d * 2^-k (exact) added into the lane's float32 accumulator
    by one fused multiply-add, chunk after chunk; the row's sum (l0 + l2) +
    (l1 + l3), over 256."""
    T = x.shape[0]
    codes, d = small_codes_and_scales(fmt, raw)
    q, k = int16_activations(x)
    nb = q.shape[1]
    N = codes.shape[0]
    sums = np.einsum("tbhle,nbhle->tnbl", q.reshape(T, nb, 2, 4, 4), codes[:, :nb].reshape(N, nb, 2, 4, 4))
    lanes = (256 * sums).astype(np.float32)
    assert np.array_equal(lanes.astype(np.float64), 256.0 * sums)                 # exact
    scale = d[None, :, :nb] * (2.0 ** -k).astype(np.float32)[:, None]            # (T, N, chunks)
    acc = np.zeros((T, N, 4), np.float32)
    for c in range(nb):
        acc = fma32(acc, lanes[:, :, c], np.repeat(scale[:, :, c, None], 4, axis=2))
    return ((acc[..., 0] + acc[..., 2]) + (acc[..., 1] + acc[..., 3])) * np.float32(1 / 256) + np.float32(0)


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
    differ, checked = 0, set()
    for key in keys:
        fmt = key.split()[0]
        if fmt in SMALL and (key.endswith(" m0") or fmt in ("q4_0", "q5_0")):
            # the codes and scales as read here times the codes give the
            # generic dequantizer's weights (with the minimums zero)
            codes, d = small_codes_and_scales(fmt, halves[key + " raw"])
            w = (codes * d[..., None]).reshape(codes.shape[0], -1)[:, :halves[key + " w"].shape[1]]
            np.testing.assert_array_equal(w, halves[key + " w"], err_msg=key)
            expect = halves_small(fmt, halves[key + " raw"], halves[key + " x"])
            np.testing.assert_array_equal(halves[key].view(np.uint32), expect.view(np.uint32), err_msg=key)
            differ += not np.array_equal(halves[key], wide[key])
            checked.add(fmt)
        elif fmt in SMALL:
            pass   # minimums: the bound and batch invariance below
        elif fmt in ("mxfp4", "q8_0"):
            arithmetic = halves_mxfp4 if fmt == "mxfp4" else halves_q8_0
            expect = arithmetic(halves[key + " raw"], halves[key + " x"])
            np.testing.assert_array_equal(halves[key].view(np.uint32), expect.view(np.uint32), err_msg=key)
            differ += not np.array_equal(halves[key], wide[key])
            checked.add(fmt)
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
    assert checked == {"mxfp4", "q8_0", *SMALL}
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
