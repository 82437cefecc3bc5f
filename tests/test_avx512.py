"""The AVX-512 kernels, on any x86 CPU with AVX2: the extension's own sources
and tests/native/path_check.cpp built with GOOSEDUMP_AVX512_EMULATED, where
SIMDe (Debian's libsimde-dev, installed by .ci/run as the README says)
computes each AVX-512 intrinsic portably, lane by lane as the instruction
would. The path is the one the extension runs on an AVX-512 CPU, where
tests/test_formats.py and the others also run it natively (they take every
path in _kernels.available_impls()).

- int16 activations: within the int16 bound of float64 and close to the
  portable reference; a token gives the same bits alone or in a batch
  (batch invariance); the same integer sums as the reference (checked on
  inputs whose float steps are exact, where every path must agree bit for
  bit);
- plain-float weights (F16, BF16, F32) against fp32 activations: AVX2's
  bits, whatever the tile, and within float64's bound;
- attention: within 1e-5 of the reference; the path's own kernel for 8
  query heads per kv head gives AVX2's kernel's bits.

Missing tools fail the test with the command that installs them: never a skip."""
from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from goosedump import _kernels, randblocks
from goosedump.gguf import BLOCK_SIZES, GGMLType
from test_neon import (ATTENTION_CASES, CSRC, FORMATS, FLOATS, NO_CONTRACT, ROOT, SOURCES, STORE_CASES,
                       assert_same_bits, check_attention, check_store, product_case, product_results, weights)

CXX = "g++"
SIMDE = Path("/usr/include/simde/x86/avx512.h")
# The files whose intrinsics the emulated build maps to SIMDe's (the .cpp files
# are compiled with that map; the header is included by rows_avx512_grouped.cpp).
AVX512_FILES = ("rows_avx512.cpp", "rows_avx512_grouped.cpp", "rows_avx512_vbmi.cpp", "rows_avx512_groups.h",
                "rows_avx512_nibbles.h",
                "rows_avx512.h", "rows_avx512_float.cpp", "rows_amx.cpp", "attention_avx512.cpp")
INSTALL = "apt-get install libsimde-dev"
SHAPES = [(1, 32, 1), (5, 64, 3), (7, 96, 5), (6, 160, 2), (4, 224, 11), (9, 224, 17), (17, 256, 8), (9, 512, 9),
          (33, 2880, 13), (6, 2880, 21)]
# every AVX-512 intrinsic, vector and mask type the kernels name
INTRINSIC = re.compile(r"\b(_mm512_\w+|_mm256_maskz?_\w+|_mm_maskz?_\w+|__m512[id]?|__mmask(?:8|16|32|64))\b")


# What the Debian version of SIMDe lacks, lane by lane as the instruction
# does it (vcvtdq2ps: each int32 to the nearest float, ties to even, as C's
# conversion rounds; a masked byte load reads only the bytes its mask sets;
# vpmovzxwd: each uint16 to its uint32; vcvtph2ps: each fp16 to its float,
# exactly).
MISSING = """
#if !defined(simde_mm512_cvtepi32_ps)
static inline simde__m512 simde_mm512_cvtepi32_ps(simde__m512i a) {
  simde__m512i_private a_ = simde__m512i_to_private(a);
  simde__m512_private r_;
  for (int i = 0; i < 16; ++i) r_.f32[i] = (simde_float32)a_.i32[i];
  return simde__m512_from_private(r_);
}
#endif
#if !defined(simde_mm512_maskz_loadu_epi8)
static inline simde__m512i simde_mm512_maskz_loadu_epi8(simde__mmask64 k, const void* p) {
  simde__m512i_private r_;
  for (int i = 0; i < 64; ++i) r_.i8[i] = ((k >> i) & 1) ? ((const int8_t*)p)[i] : 0;   /* unread where masked */
  return simde__m512i_from_private(r_);
}
#endif
#if !defined(simde_mm512_cvtepu16_epi32)
static inline simde__m512i simde_mm512_cvtepu16_epi32(simde__m256i a) {
  simde__m256i_private a_ = simde__m256i_to_private(a);
  simde__m512i_private r_;
  for (int i = 0; i < 16; ++i) r_.u32[i] = a_.u16[i];
  return simde__m512i_from_private(r_);
}
#endif
#if !defined(simde_mm512_cvtph_ps)
static inline simde__m512 simde_mm512_cvtph_ps(simde__m256i a) {
  simde__m256i_private a_ = simde__m256i_to_private(a);
  simde__m512_private r_;
  for (int i = 0; i < 16; ++i) r_.f32[i] = simde_float16_to_float32(simde_uint16_as_float16(a_.u16[i]));
  return simde__m512_from_private(r_);
}
#endif
"""


def emulation_header(out: Path) -> Path:
    """SIMDe's AVX-512 under the names the kernels use (SIMDe's own aliases
    miss or misname a few in the Debian version)."""
    text = "".join((CSRC / name).read_text() for name in AVX512_FILES)
    names = sorted(set(INTRINSIC.findall(text)))
    assert "_mm512_madd_epi16" in names and "__m512i" in names
    lines = ["#pragma once", "#include <simde/x86/avx512.h>", "#include <simde/simde-f16.h>", MISSING]
    lines += [f"#undef {n}\n#define {n} simde{n}" for n in names]
    path = out / "avx512_emulated.h"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def avx512_check(tmp_path_factory) -> Path:
    if not SIMDE.exists():
        pytest.fail(f"{SIMDE} not found: the AVX-512 tests need `{INSTALL}`")
    assert shutil.which(CXX), f"{CXX} not found"
    out = tmp_path_factory.mktemp("avx512")
    shim = emulation_header(out)
    objs, procs = [], []
    for name in SOURCES + ["native/path_check"]:
        src = (CSRC / f"{name}.cpp") if not name.startswith("native/") else ROOT / "tests" / f"{name}.cpp"
        obj = out / (Path(name).name + ".o")
        # -mavx2: SIMDe builds each 512-bit operation from two native 256-bit ones
        # (-O0 for the emulated files: under SIMDe the grouped and VBMI kernels took 150 s each at -O2,
        # 40 s at -O0, and set the setup's wall; the arithmetic is the same at any level, contraction
        # being off, and the cases run in seconds either way)
        opt = "-O0" if f"{name}.cpp" in AVX512_FILES else "-O2"
        flags = ["-std=c++17", opt, "-mavx2", "-mfma", "-mf16c", "-Wall", "-Wextra", "-Werror",
                 "-Wno-unused-parameter", "-Wno-psabi", f"-I{CSRC}", "-DGD_PATH=Avx512",
                 "-DGOOSEDUMP_AVX512_EMULATED"]
        if f"{name}.cpp" in AVX512_FILES:
            flags += ["-include", str(shim)]
        if name in NO_CONTRACT:
            flags.append("-ffp-contract=off")
        procs.append(subprocess.Popen([CXX, *flags, "-c", str(src), "-o", str(obj)], stderr=subprocess.PIPE,
                                      text=True))
        objs.append(str(obj))
    # every compiler's pipe read and closed before any failure is reported
    errors = [(p.communicate(timeout=600)[1], p.returncode) for p in procs]
    for err, code in errors:
        assert code == 0, err
    exe = out / "avx512_check"
    subprocess.run([CXX, "-pthread", *objs, "-o", str(exe)], check=True, timeout=300)
    return exe


def run_cases(exe: Path, cases: bytes, tmp_path: Path, **env) -> bytes:
    src, dst = tmp_path / "cases.bin", tmp_path / "out.bin"
    src.write_bytes(cases)
    r = subprocess.run([str(exe), str(src), str(dst)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, **env})
    assert r.returncode == 0, r.stderr
    return dst.read_bytes()


def results(out: bytes, inputs):
    split = product_results(out, [(x.shape[0], w.shape[0]) for _, w, x, _ in inputs])
    for (fmt, w, x, bias), (path, ref, alone) in zip(inputs, split):
        yield fmt, w, x, bias, path, ref, alone, f"{fmt} {w.shape[0]}x{x.shape[1]}, {x.shape[0]} tokens"


def padded(fmt: str, k: int) -> int:
    return 256 * (k // 256 + 1) if fmt in ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs") and k % 256 else k


BLOCK_FORMATS = [f for f in FORMATS if f not in FLOATS]
# The formats whose AVX-512 products take the grouped form (matmul.h's
# grouped_acts): eight blocks a vector; all but Q6_K also decode's split
# form and AMX's tiles (for Q6_K the tiles' test checks it keeps off them).
GROUPED = ["mxfp4", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q4_k", "q5_k", "iq4_xs", "q6_k"]


def realistic(rng, fmt: str, n: int, k: int) -> np.ndarray:
    """Rows of realistic blocks (randblocks; test_neon's weights() adds
    random bytes, whose infinities no tolerance holds)."""
    t = GGMLType[fmt.upper()]
    return np.ascontiguousarray(randblocks.blocks(t, rng, n * k // BLOCK_SIZES[t][0], 0.02).reshape(n, -1))


def test_int16_products_of_every_format(avx512_check, tmp_path):
    rng = np.random.default_rng(12)
    cases, inputs = [], []
    for fmt in BLOCK_FORMATS:
        for n, k, t in SHAPES:
            k = padded(fmt, k)
            w = realistic(rng, fmt, n, k)
            x = rng.standard_normal((t, k)).astype(np.float32)
            x[0, :32] = 0                  # an all-zero activation block
            x[-1, 32:] *= 1e3              # blocks of very different size
            bias = rng.standard_normal(n).astype(np.float32)
            cases.append(product_case(FORMATS.index(fmt), w, x, bias, True))
            inputs.append((fmt, w, x, bias))
    out = run_cases(avx512_check, b"".join(cases), tmp_path)
    for fmt, w, x, bias, path, ref, alone, what in results(out, inputs):
        assert_same_bits(alone, path, what)       # batch invariance
        here = np.empty_like(ref)
        _kernels.matmul(fmt, w, x, here, bias, "generic", "i16")
        assert_same_bits(ref, here, what)         # the check's reference is the extension's
        n, k = w.shape[0], x.shape[1]
        wd = np.empty((n, k), np.float32)
        _kernels.dequantize(fmt, w.reshape(-1), wd.reshape(-1), "generic")
        x64, w64 = x.astype(np.float64), wd.astype(np.float64)
        exact = x64 @ w64.T + bias
        # int16 activations: up to 2^-15 of each block's largest value per
        # product; fp32 sums: ~sqrt(k) roundings of the sum of |terms|
        blocks = np.abs(x64).reshape(x.shape[0], -1, 32).max(axis=2)
        act_err = 2.0 ** -15 * np.repeat(blocks, 32, axis=1) @ np.abs(w64).T
        float_err = 8 * 2.0 ** -24 * math.sqrt(k) * (np.abs(x64) @ np.abs(w64).T) + 2.0 ** -23 * np.abs(bias)
        assert np.all(np.abs(path - exact) <= act_err + float_err), what
        # the reference and this path differ only in the float steps' order
        assert np.all(np.abs(path - ref) <= 2 * float_err), what


# Plain-float products (rows_avx512_float.cpp: two rows a register): rows
# past a pass of 8 (and 6) and short of one, an odd last row, token tiles of
# 1 to 8 and past them, widths of one line of a row and of gpt-oss's rows.
FLOAT_SHAPES = [(1, 32, 1), (2, 64, 1), (7, 96, 1), (8, 160, 1), (9, 2880, 1), (17, 512, 1), (3, 64, 2),
                (13, 256, 6), (6, 128, 7), (11, 224, 8), (15, 96, 9), (33, 2880, 13), (5, 32, 21)]


@pytest.mark.parametrize("fmt", FLOATS)
def test_float_products_give_avx2s_bits(avx512_check, tmp_path, fmt):
    """F16, BF16 and F32 weights against fp32 activations on the path's own
    kernel give, bit for bit, AVX2's kernel's results natively here, a token
    the same bits alone as in a batch, and stay within float64's bound for
    fp32 sums (infinities and NaNs from the raw rows test_neon puts first
    included: the same bits there too)."""
    rng = np.random.default_rng(21)
    cases, inputs = [], []
    for n, k, t in FLOAT_SHAPES:
        w = weights(rng, fmt, n, k) if n > 2 else realistic(rng, fmt, n, k)
        x = rng.standard_normal((t, k)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        cases.append(product_case(FORMATS.index(fmt), w, x, bias, False))
        inputs.append((fmt, w, x, bias))
    out = run_cases(avx512_check, b"".join(cases), tmp_path)
    for fmt, w, x, bias, path, ref, alone, what in results(out, inputs):
        assert_same_bits(alone, path, what)       # batch invariance
        avx2 = np.empty_like(path)
        _kernels.matmul(fmt, w, x, avx2, bias, "avx2")
        assert_same_bits(avx2, path, what)
        n, k = w.shape[0], x.shape[1]
        wd = np.empty((n, k), np.float32)
        _kernels.dequantize(fmt, w.reshape(-1), wd.reshape(-1), "generic")
        fine = np.all(np.isfinite(wd), axis=1)
        x64, w64 = x.astype(np.float64), wd[fine].astype(np.float64)
        exact = x64 @ w64.T + bias[fine]
        bound = 8 * 2.0 ** -24 * math.sqrt(k) * (np.abs(x64) @ np.abs(w64).T) + 2.0 ** -23 * np.abs(bias[fine])
        assert np.all(np.abs(path[:, fine] - exact) <= bound), what


# Where each format keeps its fp16 scale (d) and minimum scale (m): the
# exact test sets d to 2^-8 and m to 0 (ggml's block layouts; MXFP4: its E8M0 byte).
SCALES = {"q4_0": (0, None), "q4_1": (0, 2), "q5_0": (0, None), "q5_1": (0, 2), "q8_0": (0, None),
          "iq4_nl": (0, None), "iq4_xs": (0, None), "q2_k": (80, 82), "q3_k": (108, None), "q4_k": (0, 2),
          "q5_k": (0, 2), "q6_k": (208, None), "mxfp4": (None, None)}


def test_exact_float_steps_make_every_path_agree_bit_for_bit(avx512_check, tmp_path):
    """Small integer activations (their int16 codes are exact) and weights
    scaled by 2^-8 without minimums, so that every partial sum, in any order,
    is exact in fp32: the path's result must be the exact value, as the
    reference's is. A wrong code, a wrong scale, a lane summed twice or
    missed would show."""
    rng = np.random.default_rng(5)
    cases, inputs = [], []
    for fmt in BLOCK_FORMATS:
        n, k, t = 7, padded(fmt, 512), 9
        w = realistic(rng, fmt, n, k)
        blocks = w.reshape(-1, BLOCK_SIZES[GGMLType[fmt.upper()]][1])   # (a view: edits w)
        d_at, m_at = SCALES[fmt]
        if d_at is not None:
            blocks[:, d_at:d_at + 2] = np.frombuffer(np.float16(2.0 ** -8).tobytes(), np.uint8)
        if m_at is not None:
            blocks[:, m_at:m_at + 2] = 0
        if fmt == "mxfp4":
            blocks[:, 0] = 120                      # E8M0: codes (twice the E2M1 values) times 2^-8
        x = rng.integers(-3, 4, (t, k)).astype(np.float32)
        x[:, ::32] = 3                              # every block's largest |x| is 3: codes x 2^13, exact
        bias = np.zeros(n, np.float32)
        cases.append(product_case(FORMATS.index(fmt), w, x, bias, True))
        inputs.append((fmt, w, x, bias))
    out = run_cases(avx512_check, b"".join(cases), tmp_path)
    for fmt, w, x, bias, path, ref, alone, what in results(out, inputs):
        n, k = w.shape[0], x.shape[1]
        wd = np.empty((n, k), np.float32)
        _kernels.dequantize(fmt, w.reshape(-1), wd.reshape(-1), "generic")
        w64 = wd.astype(np.float64)
        exact = x.astype(np.float64) @ w64.T
        # every partial sum exact: the weights multiples of 2^-g, the sum of |terms| below 2^(24 - g)
        g = 8
        assert np.all(w64 * 2.0 ** g == np.round(w64 * 2.0 ** g)), what
        fine = np.abs(x.astype(np.float64)) @ np.abs(w64).T < 2.0 ** (24 - g)
        assert fine.mean() > 0.9, what
        np.testing.assert_array_equal(path[fine], exact[fine].astype(np.float32), err_msg=what)
        np.testing.assert_array_equal(ref[fine], exact[fine].astype(np.float32), err_msg=what)
        assert np.abs(exact[fine]).max() > 1, what


# MXFP4 products that take AMX's tiles (16 tokens and more): rows past a
# tile of 16 and short of one, rows whose blocks fill no whole group of
# eight (K / 32 = 90, 3) or fewer than one, token tiles cut short.
AMX_SHAPES = [(16, 256, 16), (37, 2880, 17), (5, 96, 40), (33, 512, 33), (20, 32, 18)]


def edge_cases(fmt: str, shapes, seed: int):
    """Per shape (rows, width, tokens): realistic weights and activations,
    an all-zero activation block and blocks 1000x larger than their
    neighbours, a bias. The driver's case bytes, and the (fmt, w, x, bias)
    that `results` pairs with its output."""
    rng = np.random.default_rng(seed)
    inputs = []
    for n, k, t in shapes:
        k = padded(fmt, k)   # (Q4_K: whole super-blocks)
        w = realistic(rng, fmt, n, k)
        x = rng.standard_normal((t, k)).astype(np.float32)
        x[0, :32] = 0
        x[-1, 32:] *= 1e3
        inputs.append((fmt, w, x, rng.standard_normal(n).astype(np.float32)))
    return b"".join(product_case(FORMATS.index(fmt), w, x, bias, True) for _, w, x, bias in inputs), inputs


@pytest.mark.parametrize("fmt", GROUPED)
def test_amx_tiles_give_the_bits_of_the_avx512_kernels(avx512_check, tmp_path, fmt):
    """The grouped formats' products of 16 tokens and more on AMX's tiles
    (rows_amx.cpp; MXFP4's as bf16, the others' as int8, all but Q8_0's
    decoded first; amx.h computes each tile instruction as Intel's
    pseudo-code does, on any CPU) equal, bit for bit, the AVX-512 kernels'
    (the driver again with GOOSEDUMP_AMX=0), and each token alone (decode's
    kernel) equals it in the batch. Realistic weights and activations, an
    all-zero block and blocks 1000x larger than their neighbours."""
    cases, inputs = edge_cases(fmt, AMX_SHAPES, 21)
    tiles = run_cases(avx512_check, cases, tmp_path)
    vectors = run_cases(avx512_check, cases, tmp_path, GOOSEDUMP_AMX="0")
    for (fmt, w, x, bias, path, ref, alone, what), (*_, path0, _, alone0, _) in zip(results(tiles, inputs),
                                                                                   results(vectors, inputs)):
        assert_same_bits(path0, path, what)     # the tiles' bits are the AVX-512 kernels'
        assert_same_bits(alone, path, what)     # batch invariance
        assert_same_bits(alone0, alone, what)
        assert np.all(np.abs(path - ref) <= 1e-3 * (np.abs(ref) + 1)), what


# The grouped kernels' two forms (rows_avx512_groups.h): with VBMI's byte
# permutes, and by qword and word permutes for CPUs without VBMI
# (Cascade Lake, Cooper Lake). Decode's split form (1 to 3 tokens), the
# grouped loop (4 and more), rows in pairs and a row alone, a row's last
# group of every length (K / 32 = 90, 7, 1, 3, 8); edge_cases' activations.
FORM_SHAPES = [(37, 2880, 1), (37, 2880, 2), (37, 2880, 3), (37, 2880, 4), (37, 2880, 17), (9, 224, 5),
               (5, 32, 3), (16, 256, 40), (6, 96, 2), (33, 512, 9)]


@pytest.mark.parametrize("fmt", GROUPED)
def test_the_form_without_vbmi_gives_the_bits_of_the_form_with_it(avx512_check, tmp_path, fmt):
    """Emulated (SIMDe computes both forms on any AVX2 CPU): the driver with
    GOOSEDUMP_AVX512_VBMI=0 gives, bit for bit, what it gives with VBMI, each
    token alone as in the batch (AMX's tiles off: a CPU without VBMI has none)."""
    cases, inputs = edge_cases(fmt, FORM_SHAPES, 23)
    with_vbmi = run_cases(avx512_check, cases, tmp_path, GOOSEDUMP_AMX="0")
    without = run_cases(avx512_check, cases, tmp_path, GOOSEDUMP_AMX="0", GOOSEDUMP_AVX512_VBMI="0")
    assert len(without) == len(with_vbmi)
    for (*_, path, ref, alone, what), (*_, path0, _, alone0, _) in zip(results(with_vbmi, inputs),
                                                                      results(without, inputs)):
        assert_same_bits(path, path0, what)
        assert_same_bits(alone, alone0, what)
        assert_same_bits(alone0, path0, what)     # batch invariance without VBMI
        assert np.all(np.abs(path0 - ref) <= 1e-3 * (np.abs(ref) + 1)), what


NATIVE_FORMS = """
import sys, numpy as np
from goosedump import _kernels
w = np.load(sys.argv[1], allow_pickle=True)
out = []
for fmt, rows, x, bias in w:
    y = np.empty((x.shape[0], rows.shape[0]), np.float32)
    _kernels.matmul(fmt, rows, x, y, bias, impl="avx512")
    out.append(y)
print(_kernels.cpu_has_vbmi())
np.save(sys.argv[2], np.array(out, dtype=object), allow_pickle=True)
"""


def test_the_forms_natively_where_the_cpu_has_avx512(tmp_path):
    """On an AVX-512 CPU the extension itself, in a process of its own under
    each setting (the form is chosen once per process): the form without
    VBMI gives the bits of the form with it (the CPU's own form, which the
    other tests check against the references). A CPU without AVX-512
    refuses the path by name, and has no VBMI form to take."""
    import subprocess
    import sys
    if "avx512" not in _kernels.available_impls():
        assert not _kernels.cpu_has_vbmi()
        with pytest.raises(ValueError, match="avx512"):
            _kernels.matmul("q8_0", np.zeros((1, 34), np.uint8), np.zeros((1, 32), np.float32),
                            np.zeros((1, 1), np.float32), impl="avx512")
        return
    inputs = [case for fmt in GROUPED for case in edge_cases(fmt, FORM_SHAPES, 24)[1]]
    src = tmp_path / "in.npy"
    np.save(src, np.array(inputs, dtype=object), allow_pickle=True)
    got = {}
    for vbmi in ("1", "0"):
        dst = tmp_path / f"out{vbmi}.npy"
        r = subprocess.run([sys.executable, "-c", NATIVE_FORMS, str(src), str(dst)], capture_output=True, text=True,
                           timeout=300, env={**os.environ, "GOOSEDUMP_AMX": "0", "GOOSEDUMP_AVX512_VBMI": vbmi})
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == str(vbmi == "1" and _kernels.cpu_has_vbmi())
        got[vbmi] = np.load(dst, allow_pickle=True)
    for (fmt, w, x, _), a, b in zip(inputs, got["1"], got["0"]):
        assert_same_bits(a, b, f"{fmt} {w.shape[0]}x{x.shape[1]}, {x.shape[0]} tokens")


# MXFP4's tiles carry the scales in their numbers (rows_amx.cpp): cases at
# the edges of the range where that is exact, each a name, the shape and
# what it does to the realistic weights (their scale bytes, 17 apart) and
# activations. Rows of tiny scales (1 and 5: their tasks of 16 rows run on
# the vectors, the product's last task on the tiles); a token of tiny
# activations (2^-126: the whole product on the vectors); one of huge ones
# (2^116: on the tiles, sums scaled up to 2^94); one beyond (-3.4e38, whose
# 256 hi times its 2^113 is -2^128, against weights of scale 2^-28, which
# alone would fit: the vectors).
def _tiny_rows(w, x):
    w[3, 0::17], w[22, 0::17] = 1, 5


def _token(largest, scale_byte=None):
    def edit(w, x):   # (the largest negative: its code -32,7xx, 256 times -128 plus some)
        x[1] = x[1] / np.abs(x[1]).max() * np.float32(abs(largest))
        x[1, np.argmax(np.abs(x[1]))] = largest
        if scale_byte is not None:
            w[:, 0::17] = scale_byte
    return edit


AMX_EDGES = [("tiny scales in two rows", (40, 2880, 20), _tiny_rows),
             ("a token of tiny activations", (24, 512, 18), _token(1e-36)),
             ("a token of huge activations", (24, 512, 18), _token(1e35)),
             ("a token beyond the tiles' range", (24, 512, 17), _token(-3.4e38, 100))]


def test_amx_tiles_at_the_edges_of_their_range(avx512_check, tmp_path):
    """MXFP4's products on AMX's tiles where the scales folded into their
    numbers would leave normal floats (amx.h's emulation flushes denormals
    as the instruction does): still the AVX-512 kernels' bits, and each
    token alone's. Made to fold regardless, the tiny cases fail."""
    rng = np.random.default_rng(22)
    cases, inputs = [], []
    for name, (n, k, t), edit in AMX_EDGES:
        w = realistic(rng, "mxfp4", n, k)
        x = rng.standard_normal((t, k)).astype(np.float32)
        edit(w, x)
        bias = np.zeros(n, np.float32)   # (a bias of 1 would hide sums of 2^-140)
        cases.append(product_case(FORMATS.index("mxfp4"), w, x, bias, True))
        inputs.append(("mxfp4", w, x, bias))
    tiles = run_cases(avx512_check, b"".join(cases), tmp_path)
    vectors = run_cases(avx512_check, b"".join(cases), tmp_path, GOOSEDUMP_AMX="0")
    for (name, *_), (*_, path, ref, alone, what), (*_, path0, _, alone0, _) in zip(
            AMX_EDGES, results(tiles, inputs), results(vectors, inputs)):
        assert_same_bits(path0, path, f"{what}: {name}")
        assert_same_bits(alone, path, f"{what}: {name}")
        assert_same_bits(alone0, alone, f"{what}: {name}")
        assert np.isfinite(path).all(), name


@pytest.mark.parametrize("T,H,KH,d,pos0,window,cap,sinks", ATTENTION_CASES)
def test_attention_on_the_path(avx512_check, tmp_path, T, H, KH, d, pos0, window, cap, sinks):
    """The path's attention (AVX2's kernels) through the same driver."""
    check_attention(lambda case, tmp: run_cases(avx512_check, case, tmp), tmp_path, T, H, KH, d, pos0, window, cap,
                    sinks)


@pytest.mark.parametrize("T,H,KH,d,pos0,window,cap,sinks", [c for c in ATTENTION_CASES if c[1] == 8 * c[2]] + [
    (3, 64, 8, 64, 1000, 600, 602, True),    # past a block of values (kValueBlock), slots wrapping inside it
    (2, 64, 8, 64, 700, 0, 702, False),      # 701 and 702 positions: an odd last one, then pairs only
    (1, 16, 2, 32, 40, 0, 48, True),         # values 32 wide: one pass
])
def test_attention_kernel_gives_avx2s_bits(avx512_check, tmp_path, T, H, KH, d, pos0, window, cap, sinks):
    """The path's own attention kernel for 8 query heads per kv head
    (attention_avx512.cpp: two positions a vector) gives, bit for bit, what
    AVX2's kernel gives natively here (other shapes run AVX2's kernels:
    test_attention_on_the_path)."""
    path, (q, k, v, s) = check_attention(lambda case, tmp: run_cases(avx512_check, case, tmp), tmp_path, T, H, KH,
                                         d, pos0, window, cap, sinks)
    avx2 = np.empty_like(path)
    _kernels.attention(q, k, v, s, pos0, window, 1 / math.sqrt(d), avx2, "avx2")
    assert_same_bits(avx2, path, f"attention T={T} H={H} KH={KH} d={d} pos0={pos0} window={window}")


@pytest.mark.parametrize("T,KH,d,dv,cap,pos0", STORE_CASES)
def test_kv_store_on_the_path(avx512_check, tmp_path, T, KH, d, dv, cap, pos0):
    """The path's KV store (F16C's conversion) through the same driver."""
    check_store(lambda case, tmp: run_cases(avx512_check, case, tmp), tmp_path, T, KH, d, dv, cap, pos0)


def test_the_emulation_maps_every_intrinsic(tmp_path):
    """The emulated build names SIMDe's version of every AVX-512 intrinsic
    the kernels use, and SIMDe has each (a missing one fails the build: the
    native intrinsic cannot be inlined into an AVX2 function)."""
    text = emulation_header(tmp_path).read_text()
    for name in ("_mm512_madd_epi16", "_mm512_cvtepi8_epi16", "_mm512_fmadd_ps", "_mm512_dpwssd_epi32",
                 "_mm512_permutex2var_epi8"):
        assert f"#define {name} simde{name}" in text
    simde = "".join(p.read_text(errors="replace") for p in SIMDE.parent.joinpath("avx512").glob("*.h"))
    for name in re.findall(r"#define (_mm\w+) ", text):
        assert f"simde{name}" in simde + MISSING, name


def test_the_path_is_offered_only_where_the_cpu_has_it():
    flags = Path("/proc/cpuinfo").read_text().split("\nflags")[1].split("\n")[0].split()
    # (VNNI and VBMI: the MXFP4 kernel's vpdpwssd and vpermt2b)
    has = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi"} <= set(flags) and "avx2" in flags
    assert ("avx512" in _kernels.available_impls()) == has
    if has:
        assert _kernels.available_impls()[-1] == "avx512"
