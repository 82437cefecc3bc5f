"""The NEON kernels, on this x86 machine: the extension's own sources and
tests/native/path_check.cpp cross-compiled with aarch64-linux-gnu-g++ and run
under qemu-aarch64 (Debian's g++-aarch64-linux-gnu and qemu-user, installed by
.ci/run as the README says). Every weight format and both activation
precisions, awkward sizes, and attention:

- int16 activations: NEON equals the portable reference bit for bit, on the
  same machine and against this machine's own extension (generic path);
- fp32 activations: NEON within the float tolerance of float64, and a token
  gives the same bits alone or in a batch (batch invariance);
- attention: NEON within 1e-5 of the reference.

Missing tools fail the test with the command that installs them: never a skip."""
from __future__ import annotations

import math
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from goosedump import _kernels, randblocks
from goosedump.gguf import BLOCK_SIZES, GGMLType
from test_formats import random_raw

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"
CXX, QEMU = "aarch64-linux-gnu-g++", "qemu-aarch64"
INSTALL = "apt-get install g++-aarch64-linux-gnu qemu-user"
# The extension's sources the check links, and those CMakeLists.txt compiles
# with -ffp-contract=off (the rounding the reference's arithmetic depends on).
SOURCES = ["cpu", "quants", "matmul", "threads", "attention", "attention_avx512", "formats", "rows_generic", "rows_neon", "rows_avx2",
           "rows_avx2_i16", "rows_avx512", "rows_avx512_grouped", "rows_avx512_vbmi", "rows_avx512_float", "rows_amx"]
NO_CONTRACT = {"formats", "rows_generic", "rows_neon", "rows_avx2", "rows_avx2_i16", "rows_avx512",
               "rows_avx512_grouped", "rows_avx512_vbmi", "rows_avx512_float", "rows_amx", "attention_avx512"}
FORMATS = _kernels.formats()
FLOATS = ("f32", "f16", "bf16")
SHAPES = [(1, 32, 1), (5, 64, 3), (17, 256, 8), (9, 512, 9), (33, 2880, 13)]


def need(*tools: str) -> None:
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not found: the NEON tests need `{INSTALL}`")


@pytest.fixture(scope="module")
def neon_check(tmp_path_factory) -> Path:
    need(CXX, QEMU)
    out = tmp_path_factory.mktemp("neon")
    objs = []
    procs = []
    for name in SOURCES + ["native/path_check"]:
        src = (CSRC / f"{name}.cpp") if not name.startswith("native/") else ROOT / "tests" / f"{name}.cpp"
        obj = out / (Path(name).name + ".o")
        flags = ["-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter", f"-I{CSRC}",
                 "-DGD_PATH=Neon"]
        if name in NO_CONTRACT:
            flags.append("-ffp-contract=off")
        procs.append(subprocess.Popen([CXX, *flags, "-c", str(src), "-o", str(obj)], stderr=subprocess.PIPE,
                                      text=True))
        objs.append(str(obj))
    # every compiler's pipe read and closed before any failure is reported
    errors = [(p.communicate(timeout=600)[1], p.returncode) for p in procs]
    for err, code in errors:
        assert code == 0, err
    exe = out / "neon_check"
    subprocess.run([CXX, "-static", "-pthread", *objs, "-o", str(exe)], check=True, timeout=300)
    return exe


def run_cases(exe: Path, cases: bytes, tmp_path: Path) -> bytes:
    src, dst = tmp_path / "cases.bin", tmp_path / "out.bin"
    src.write_bytes(cases)
    r = subprocess.run([QEMU, str(exe), str(src), str(dst)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return dst.read_bytes()


def weights(rng, fmt: str, n: int, k: int) -> np.ndarray:
    """Rows of realistic blocks (randblocks), the first rows random bytes with
    extreme scales (test_formats.random_raw)."""
    t = GGMLType[fmt.upper()]
    per_row = k if fmt in FLOATS else k // BLOCK_SIZES[t][0]
    rows = randblocks.blocks(t, rng, n * per_row, 0.02).reshape(n, -1)
    rows[: min(2, n)] = random_raw(rng, fmt, min(2, n) * per_row).reshape(min(2, n), -1)
    return np.ascontiguousarray(rows)


def assert_same_bits(a: np.ndarray, b: np.ndarray, what: str) -> None:
    """Bit for bit, a NaN matching any NaN (x86 and ARM make NaNs of
    different signs from inf - inf)."""
    nan = np.isnan(a)
    np.testing.assert_array_equal(nan, np.isnan(b), err_msg=what)
    np.testing.assert_array_equal(a.view(np.uint32)[~nan], b.view(np.uint32)[~nan], err_msg=what)


def product_case(fmt_id: int, w: np.ndarray, x: np.ndarray, bias: np.ndarray, i16: bool) -> bytes:
    n, t, k = w.shape[0], x.shape[0], x.shape[1]
    return (struct.pack("<6i", 0, fmt_id, n, k, t, int(i16)) + w.tobytes() + x.astype("<f4").tobytes()
            + bias.astype("<f4").tobytes())


def product_results(out: bytes, shapes):
    """The check's output split per product case (shapes: each case's
    tokens and rows): its path's, the reference's and token-by-token Y."""
    at = 0
    for t, n in shapes:
        yield tuple(np.frombuffer(out, "<f4", t * n, at + 4 * t * n * j).reshape(t, n) for j in range(3))
        at += 12 * t * n


def test_products_of_every_format_equal_the_reference(neon_check, tmp_path):
    rng = np.random.default_rng(11)
    cases, inputs = [], []
    for fmt in FORMATS:
        for i16 in (True, False):
            if i16 and fmt in FLOATS:
                continue   # plain floats always take fp32 activations
            for n, k, t in SHAPES:
                if fmt in ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs") and k % 256:
                    k = 256 * (k // 256 + 1)
                w = weights(rng, fmt, n, k)
                x = rng.standard_normal((t, k)).astype(np.float32)
                x[0, :32] = 0                  # an all-zero activation block
                x[-1, 32:] *= 1e3              # blocks of very different size
                bias = rng.standard_normal(n).astype(np.float32)
                cases.append(product_case(FORMATS.index(fmt), w, x, bias, i16))
                inputs.append((fmt, i16, w, x, bias))
    out = run_cases(neon_check, b"".join(cases), tmp_path)
    results = product_results(out, [(x.shape[0], w.shape[0]) for _, _, w, x, _ in inputs])
    for (fmt, i16, w, x, bias), (neon, ref, alone) in zip(inputs, results):
        t, n = x.shape[0], w.shape[0]
        what = f"{fmt} {'i16' if i16 else 'f32'} {n}x{x.shape[1]}, {t} tokens"
        # a token's sums are formed in the same order alone or in a batch
        assert_same_bits(alone, neon, what)
        here = np.empty((t, n), np.float32)
        _kernels.matmul(fmt, w, x, here, bias, "generic", "i16" if i16 else "f32")
        if i16:
            # exact integer sums, then the reference's own float steps
            assert_same_bits(neon, ref, what)
            assert_same_bits(neon, here, what)
        else:
            wd = np.empty((n, x.shape[1]), np.float32)
            _kernels.dequantize(fmt, w.reshape(-1), wd.reshape(-1), "generic")
            with np.errstate(all="ignore"):   # random bytes may make inf weights (an E8M0 of 255)
                x64, w64 = x.astype(np.float64), wd.astype(np.float64)
                exact = x64 @ w64.T + bias
                # fp32 accumulation: within ~sqrt(k) roundings of the sum of |terms|
                tol = 8 * 2.0 ** -24 * math.sqrt(x.shape[1]) * (np.abs(x64) @ np.abs(w64).T) + 2.0 ** -23 * np.abs(bias)
            ok = (np.abs(exact) < 1e37) & np.isfinite(tol)   # (beyond: float32 overflows, rightly)
            assert ok.mean() > 0.5, what
            assert np.all(np.abs(neon - exact)[ok] <= tol[ok]), what
            assert np.all(np.abs(ref - exact)[ok] <= tol[ok]), what


def test_every_block_scale_gives_the_references_bits(neon_check, tmp_path):
    """The NEON kernels read scales their own way (a table of the 256 E8M0
    bytes, the hardware's fp16 conversion): every E8M0 byte, and every 32nd
    fp16 pattern (subnormals, infinities, NaNs, both signs), against the
    reference."""
    rng = np.random.default_rng(3)
    # one block per row, so that each row's sum is its scale's alone
    mx = weights(rng, "mxfp4", 256, 32)
    mx[:, 0] = np.arange(256, dtype=np.uint8)
    q8 = weights(rng, "q8_0", 2048, 32)
    q8[:, :2] = np.arange(0, 65536, 32, dtype="<u2").view(np.uint8).reshape(-1, 2)
    cases = []
    for fmt, w in (("mxfp4", mx), ("q8_0", q8)):
        x = rng.standard_normal((3, 32)).astype(np.float32)
        cases.append((fmt, w, x, product_case(FORMATS.index(fmt), w, x, np.zeros(w.shape[0], np.float32), True)))
    out = run_cases(neon_check, b"".join(c[3] for c in cases), tmp_path)
    results = product_results(out, [(x.shape[0], w.shape[0]) for _, w, x, _ in cases])
    for (fmt, w, x, _), (neon, ref, alone) in zip(cases, results):
        t, n = x.shape[0], w.shape[0]
        here = np.empty((t, n), np.float32)
        _kernels.matmul(fmt, w, x, here, None, "generic", "i16")
        for other in (ref, here, alone):
            assert_same_bits(neon, other, fmt)
        assert np.isfinite(neon).mean() > 0.2 and (np.isnan(neon) | np.isinf(neon)).any(), fmt


def fp16_bits(a: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):   # (values beyond fp16's range round to infinity, as meant)
        return a.astype(np.float16).view(np.uint16)


ATTENTION_CASES = [
    (1, 64, 8, 64, 300, 128, 512, True),     # gpt-oss decode, a sliding layer (the group-of-8 kernels)
    (7, 64, 8, 64, 20, 0, 64, True),         # prefill tokens, a full layer
    (3, 4, 2, 36, 30, 4, 16, False),         # odd sizes, no sinks, slots wrapped
]


def check_attention(run, tmp_path, T, H, KH, d, pos0, window, cap, sinks):
    """One attention case through a path_check driver (run: its case bytes
    to its output bytes): the path within 1e-5 of the driver's reference and
    of this machine's own generic path; head-major fp16 keys and values.
    Returns the path's output and the inputs (q, k, v, sinks or None)."""
    rng = np.random.default_rng(T * 100 + H)
    q = rng.standard_normal((T, H, d)).astype(np.float32)
    k = fp16_bits(rng.standard_normal((KH, cap, d)))
    v = fp16_bits(rng.standard_normal((KH, cap, d)))
    s = rng.standard_normal(H).astype(np.float32)
    case = (struct.pack("<10i", 1, T, H, d, cap, KH, d, pos0, window, int(sinks)) + q.tobytes() + k.tobytes()
            + v.tobytes() + (s.tobytes() if sinks else b""))
    out = run(case, tmp_path)
    path, ref = (np.frombuffer(out, "<f4", T * H * d, 4 * T * H * d * j).reshape(T, H, d) for j in range(2))
    here = np.empty((T, H, d), np.float32)
    _kernels.attention(q, k, v, s if sinks else None, pos0, window, 1 / math.sqrt(d), here, "generic")
    np.testing.assert_allclose(path, ref, rtol=0, atol=1e-5)
    np.testing.assert_allclose(path, here, rtol=0, atol=1e-5)
    assert np.abs(path).max() > 0.01
    return path, (q, k, v, s if sinks else None)


@pytest.mark.parametrize("T,H,KH,d,pos0,window,cap,sinks", ATTENTION_CASES)
def test_attention_equals_the_reference(neon_check, tmp_path, T, H, KH, d, pos0, window, cap, sinks):
    check_attention(lambda case, tmp: run_cases(neon_check, case, tmp), tmp_path, T, H, KH, d, pos0, window, cap,
                    sinks)


STORE_CASES = [(1, 8, 64, 64, 255, 300), (9, 2, 64, 32, 12, 7), (3, 3, 36, 20, 40, 0)]


def check_store(run, tmp_path, T, KH, d, dv, cap, pos0) -> None:
    """New keys and values into an fp16 KV cache through a path_check
    driver: the path's bits equal the driver's reference and numpy's
    astype(float16) (nearest, ties to even, subnormals, overflow), each
    position at slot position % cap."""
    from test_matmul_attention import fp16_edge_values
    rng = np.random.default_rng(T * 10 + KH)
    k = fp16_edge_values(rng, T * KH * d).reshape(T, KH, d)
    v = fp16_edge_values(rng, T * KH * dv).reshape(T, KH, dv)
    out = run(struct.pack("<7i", 2, T, KH, d, dv, cap, pos0) + k.tobytes() + v.tobytes(), tmp_path)
    want_k, want_v = np.zeros((KH, cap, d), np.uint16), np.zeros((KH, cap, dv), np.uint16)
    for t in range(T):
        want_k[:, (pos0 + t) % cap], want_v[:, (pos0 + t) % cap] = fp16_bits(k[t]), fp16_bits(v[t])
    got = np.frombuffer(out, "<u2")
    n_k, n_v = want_k.size, want_v.size
    assert got.size == 2 * (n_k + n_v)
    for j, what in enumerate(("the path", "the reference")):
        at = j * (n_k + n_v)
        np.testing.assert_array_equal(got[at:at + n_k].reshape(want_k.shape), want_k, err_msg=f"{what}: keys")
        np.testing.assert_array_equal(got[at + n_k:at + n_k + n_v].reshape(want_v.shape), want_v,
                                      err_msg=f"{what}: values")


@pytest.mark.parametrize("T,KH,d,dv,cap,pos0", STORE_CASES)
def test_kv_store_equals_numpys_fp16(neon_check, tmp_path, T, KH, d, dv, cap, pos0):
    check_store(lambda case, tmp: run_cases(neon_check, case, tmp), tmp_path, T, KH, d, dv, cap, pos0)


def test_every_source_of_the_extension_compiles_for_aarch64(tmp_path):
    """The whole extension (bindings, tokenizer, the x86 files compiling to
    nothing) is valid AArch64 C++, warnings as errors."""
    import sysconfig

    import nanobind
    need(CXX)
    subprocess.run([sys.executable, str(ROOT / "tools" / "gen_unicode_classes.py"),
                    str(tmp_path / "unicode_classes.h")], check=True, timeout=300)
    nb = Path(nanobind.include_dir())
    flags = ["-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter", f"-I{CSRC}",
             f"-I{tmp_path}", f"-I{nb}", f"-I{nb.parent / 'ext' / 'robin_map' / 'include'}",
             f"-I{sysconfig.get_paths()['include']}"]
    procs = {src.name: subprocess.Popen([CXX, *flags, str(src)], stderr=subprocess.PIPE, text=True)
             for src in sorted(CSRC.glob("*.cpp"))}
    assert "module.cpp" in procs and "rows_neon.cpp" in procs
    # every compiler's pipe read and closed before any failure is reported
    errors = {name: (p.communicate(timeout=600)[1], p.returncode) for name, p in procs.items()}
    for name, (err, code) in errors.items():
        assert code == 0, f"{name}: {err}"


def test_the_check_builds_from_the_extensions_sources():
    """Every source CMakeLists.txt compiles with -ffp-contract=off is compiled
    so here too, and every kernel source the check needs is in the build."""
    cmake = (ROOT / "CMakeLists.txt").read_text()
    for name in SOURCES:
        assert f"csrc/{name}.cpp" in cmake
    start = cmake.index("set_source_files_properties(") + len("set_source_files_properties(")
    listed = cmake[start:cmake.index("PROPERTIES", start)].split()   # (the command may span lines)
    assert {n for n in SOURCES if f"csrc/{n}.cpp" in listed} == NO_CONTRACT


def test_the_instruction_counter_counts_what_runs(tmp_path):
    """benchmarks/neon_instructions.py's QEMU plugin: a loop of two
    instructions run n times adds 2 n to the count."""
    need(CXX, QEMU)
    plugin = tmp_path / "libcount.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", str(ROOT / "benchmarks" / "native" / "qemu_insn_count.c"),
                    "-o", str(plugin)], check=True, timeout=120)
    src = tmp_path / "loop.cpp"
    src.write_text('#include <cstdlib>\nint main(int, char** argv) {\n  long n = std::atol(argv[1]);\n'
                   '  asm volatile("1: subs %0, %0, #1\\n b.ne 1b" : "+r"(n));\n  return 0;\n}\n')
    exe = tmp_path / "loop"
    subprocess.run([CXX, "-O2", "-static", str(src), "-o", str(exe)], check=True, timeout=300)

    def count(n: int) -> int:
        r = subprocess.run([QEMU, "-plugin", str(plugin), "-d", "plugin", str(exe), str(n)], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return int(next(l for l in (r.stdout + r.stderr).splitlines() if l.startswith("instructions ")).split()[1])

    assert count(3000) - count(1000) == 2 * 2000
