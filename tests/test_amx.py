"""AMX's tiles in the extension as built, on this CPU: offered exactly where
the CPU has them (AMX-TILE and AMX-BF16 beside the AVX-512 path), and where
it has them, the grouped formats' products of 16 tokens and more (MXFP4,
Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K, IQ4_XS: prefill's experts and attention
projections) on the tiles give the bits the AVX-512 kernels give without
them (GOOSEDUMP_AMX=0, in a second process: the choice is made once per
process), MXFP4's at the edges of the range where its scales ride in the
tiles' numbers too (the instruction flushes denormals). On other CPUs
tests/test_avx512.py runs the same kernel with each tile instruction
computed in C++."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from goosedump import _kernels

FLAGS = set(Path("/proc/cpuinfo").read_text().split("\nflags")[1].split("\n")[0].split()) \
    if "\nflags" in Path("/proc/cpuinfo").read_text() else set()
HAS_AMX = {"amx_tile", "amx_bf16"} <= FLAGS and "avx512" in _kernels.available_impls() \
    and os.environ.get("GOOSEDUMP_AMX", "") != "0"

PRODUCTS = """
import sys
import numpy as np
from goosedump import _kernels, randblocks
from goosedump.gguf import GGMLType
rng = np.random.default_rng(3)
out = {}
for fmt, n, k, t in [(f, *shape) for f in ("mxfp4", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q4_k", "q5_k", "iq4_xs")
                     for shape in [(16, 2880, 16), (37, 2880, 21), (5, 96, 40), (48, 2880, 64), (33, 512, 130)]]:
    per = 256 if fmt.endswith(("_k", "_xs")) else 32   # (values a block: super-blocks whole)
    k = -(-k // per) * per
    w = np.ascontiguousarray(randblocks.blocks(GGMLType[fmt.upper()], rng, n * k // per, 0.02).reshape(n, -1))
    x = rng.standard_normal((t, k)).astype(np.float32)
    x[0, :32] = 0
    x[-1, 32:] *= 1e3
    bias = rng.standard_normal(n).astype(np.float32)
    y = np.empty((t, n), np.float32)
    _kernels.matmul(fmt, w, x, y, bias, "avx512", "i16")
    out[f"{fmt} {n}x{k}x{t}"] = y
    alone = np.empty_like(y)
    for i in range(t):
        _kernels.matmul(fmt, w, x[i:i + 1], alone[i:i + 1], bias, "avx512", "i16")
    out[f"{fmt} {n}x{k}x{t} alone"] = alone
# MXFP4's scales carried in the tiles' numbers, at the edges of where that is
# exact (tests/test_avx512.py's AMX_EDGES; tests/ is argv[2]): no bias, which
# would hide sums of 2^-140
sys.path.insert(0, sys.argv[2])
from test_avx512 import AMX_EDGES
for name, (n, k, t), edit in AMX_EDGES:
    w = np.ascontiguousarray(randblocks.blocks(GGMLType.MXFP4, rng, n * k // 32, 0.02).reshape(n, -1))
    x = rng.standard_normal((t, k)).astype(np.float32)
    edit(w, x)
    y = np.empty((t, n), np.float32)
    _kernels.matmul("mxfp4", w, x, y, np.zeros(n, np.float32), "avx512", "i16")
    out[f"edge: {name}"] = y
np.savez(sys.argv[1], **out)
"""


def test_the_tiles_are_taken_only_where_the_cpu_has_them():
    assert _kernels.cpu_has_amx() == HAS_AMX


def test_the_tiles_give_the_bits_of_the_avx512_kernels(tmp_path):
    if not HAS_AMX:   # (the CPU's own answer is the test above's)
        pytest.skip("no AMX on this CPU: its tiles run emulated in "
                    "tests/test_avx512.py::test_amx_tiles_give_the_bits_of_the_avx512_kernels")
    runs = {}
    for amx in ("1", "0"):
        path = tmp_path / f"amx{amx}.npz"
        r = subprocess.run([sys.executable, "-c", PRODUCTS, str(path), str(Path(__file__).parent)], capture_output=True,
                           text=True, timeout=600,
                           env={**os.environ, "GOOSEDUMP_AMX": amx})
        assert r.returncode == 0, r.stderr
        runs[amx] = np.load(path)
    for key in runs["1"].files:
        np.testing.assert_array_equal(runs["1"][key].view(np.uint32), runs["0"][key].view(np.uint32), err_msg=key)
    for key in runs["1"].files:   # batch invariance: decode's kernel, a token alone, gives the tiles' bits
        if key.endswith(" alone"):
            np.testing.assert_array_equal(runs["1"][key].view(np.uint32),
                                          runs["1"][key[:-len(" alone")]].view(np.uint32), err_msg=key)
