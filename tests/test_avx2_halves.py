"""The AVX2 kernels' forms for cores that split each 256-bit operation in
two (AMD Zen 1: MXFP4's codes made in 128-bit halves, its one-token and
Q8_0's one-token rows in 128-bit registers) give the bits of the 256-bit
forms, on any AVX2 CPU: GOOSEDUMP_AVX2_HALVES=1 and =0 choose the form in
two processes, each computing the same products (every format, since the
halves' dispatch sits in front of them all; one to 48 tokens; rows of 1 to
90 blocks, odd and even, with and without the 8-block runs), compared bit
for bit, and against float64 within the int16 bound."""
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
            w = np.empty((9, k), np.float32)
            _kernels.dequantize(fmt, raw.reshape(-1), w.reshape(-1), "generic")
            key = f"{fmt} {blocks} {t}"
            out[key], out[key + " x"], out[key + " w"] = y, x, w
np.savez(sys.argv[1], **out)
"""


def products(tmp_path, halves: str) -> dict:
    path = tmp_path / f"halves{halves}.npz"
    subprocess.run([sys.executable, "-c", PRODUCTS, str(path)], check=True, timeout=600,
                   env={**os.environ, "GOOSEDUMP_AVX2_HALVES": halves, "GOOSEDUMP_ISA": "avx2"})
    return dict(np.load(path))


def test_both_forms_give_the_same_bits(tmp_path):
    halves, wide = products(tmp_path, "1"), products(tmp_path, "0")
    assert halves.pop("halves") and not wide.pop("halves")    # the variable chose the form
    keys = [k for k in halves if not k.endswith((" x", " w"))]
    assert len(keys) > 200 and keys == [k for k in wide if not k.endswith((" x", " w"))]
    for key in keys:
        np.testing.assert_array_equal(halves[key].view(np.uint32), wide[key].view(np.uint32), err_msg=key)
        x, w = halves[key + " x"].astype(np.float64), halves[key + " w"].astype(np.float64)
        exact = x @ w.T
        # int16 activations: up to 2^-15 of each block's largest value per product
        blocks = np.abs(x).reshape(x.shape[0], -1, 32).max(axis=2)
        bound = 2.0 ** -15 * np.repeat(blocks, 32, axis=1) @ np.abs(w).T + 1e-5 * (np.abs(x) @ np.abs(w).T)
        assert np.all(np.abs(halves[key] - exact) <= bound), key


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
