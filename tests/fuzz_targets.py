"""Fuzz targets of the native boundary, for atheris (benchmarks/fuzz.py runs
them for minutes; tests/test_fuzz_native.py for seconds in CI and replays
tests/fuzz_corpus/). Each takes bytes and raises only an error the target
allows: anything else (another exception, a wrong result, a crash, a hang)
is a finding.

- gguf: the bytes as a GGUF file, alone or as the first part of a split set
  whose other part is a valid one: header, metadata, tensor table, config,
  tensor checks and the tokenizer; a clean GGUFError / ValueError / OSError
  naming the file is allowed.
- kernels: a block format, a shape and random weight bytes: dequantize and
  the matrix products of every implementation against float64 on the
  dequantized weights (dequantize bit-equal across implementations).
- tokenizer: the bytes as text (UTF-8, lone surrogates, special-token
  spellings, long runs) through the real vocabulary: encode then decode
  gives the text back (lone surrogates as U+FFFD, as tiktoken encodes
  them), with and without special tokens.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import numpy as np

from goosedump import _kernels
from goosedump.gguf import BLOCK_SIZES, GGMLType, GGUFError

IMPLS = _kernels.available_impls()
FORMATS = sorted(_kernels.formats())
SPECIALS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>",
            "<|endoftext|>", "<|startoftext|>", "<|reserved_200012|>", "<|", "|>"]


# the bytes of a block that hold its codes, for the formats with a minimum
# (ggml's layouts: Q4_1 d m qs; Q5_1 d m qh qs; Q2_K scales qs d dmin; Q4_K
# d dmin scales qs; Q5_K d dmin scales qh qs)
CODE_BYTES = {"q4_1": (4, 20), "q5_1": (8, 24), "q2_k": (16, 80), "q4_k": (16, 144), "q5_k": (16, 176)}


class Finding(AssertionError):
    pass


# -- gguf ---------------------------------------------------------------------
# (in benchmarks/fuzz.py's folder, which it removes; imported by the tests, removed at exit)
_DIR = tempfile.mkdtemp(prefix="goosedump-fuzz-gguf-", dir=os.environ.get("GOOSEDUMP_FUZZ_DIR"))
atexit.register(shutil.rmtree, _DIR, True)


def gguf_target(data: bytes, split_part2: bytes | None = None) -> None:
    from goosedump.config import check_tensors, read_config
    from goosedump.gguf import GGUFFile
    from goosedump.tokenizer import Tokenizer
    as_split = split_part2 is not None
    name = "x-00001-of-00002.gguf" if as_split else "x.gguf"
    path = os.path.join(_DIR, name)
    with open(path, "wb") as f:
        f.write(data)
    if as_split:
        with open(os.path.join(_DIR, "x-00002-of-00002.gguf"), "wb") as f:
            f.write(split_part2)
    try:
        with GGUFFile(path) as g:
            c = read_config(g)
            check_tensors(g, c)
            Tokenizer(g)
    except (GGUFError, ValueError, OSError) as e:
        if _DIR not in str(e):
            raise Finding(f"an error that names no file: {e}") from e
        if "\n" in str(e):
            raise Finding(f"an error of more than one line: {e!r}") from e


# -- kernels ------------------------------------------------------------------
def kernels_target(data: bytes) -> None:
    if len(data) < 4:
        return
    fmt = FORMATS[data[0] % len(FORMATS)]
    block_values, block_bytes = BLOCK_SIZES[GGMLType[fmt.upper()]]
    k_blocks = 1 + data[1] % 4
    n_rows = 1 + data[2] % 5
    n_tok = 1 + data[3] % 9
    K = k_blocks * max(block_values, 32)
    row = K // block_values * block_bytes
    need, payload = n_rows * row, data[4:] or b"\0"
    raw = np.frombuffer((payload * (need // len(payload) + 1))[:need], dtype=np.uint8).reshape(n_rows, row)
    deq = {}
    for impl in IMPLS:
        out = np.empty(n_rows * K, np.float32)
        _kernels.dequantize(fmt, raw.reshape(-1), out, impl)
        deq[impl] = out
    ref = deq["generic"]
    for impl, out in deq.items():
        if not np.array_equal(out.view(np.uint32)[np.isfinite(ref)], ref.view(np.uint32)[np.isfinite(ref)]) \
                or not np.array_equal(np.isnan(out), np.isnan(ref)):
            raise Finding(f"{fmt}: dequantize {impl} differs from generic")
    w = ref.reshape(n_rows, K).astype(np.float64)
    if not np.isfinite(w).all() or np.abs(w).max() > 1e30:
        return                                 # products of infinities: nothing to compare
    rng = np.random.default_rng(int.from_bytes(data[:4], "little"))
    x = rng.standard_normal((n_tok, K)).astype(np.float32)
    exact = x.astype(np.float64) @ w.T
    scale = np.abs(x).astype(np.float64) @ np.abs(w).T + 1e-30
    # int16 activations: each 32-value block in steps of (its max) / 2^14 at
    # most. Formats with a minimum (w = a q + b) sum a q and b apart, so the
    # bound counts |a q| + |b|, not |w|.
    block_max = np.repeat(np.abs(x).reshape(n_tok, -1, 32).max(axis=2), 32, axis=1).astype(np.float64)
    offset = np.zeros_like(w)
    if fmt in CODE_BYTES:
        a, b = CODE_BYTES[fmt]
        blocks = raw.reshape(-1, block_bytes).copy()
        blocks[:, a:b] = 0                       # no codes: each weight is its offset b
        off = np.empty(n_rows * K, np.float32)
        _kernels.dequantize(fmt, blocks.reshape(-1), off, "generic")
        offset = off.reshape(n_rows, K).astype(np.float64)
        if not np.isfinite(offset).all():
            return
    scale_i16 = block_max @ (np.abs(w - offset) + np.abs(offset)).T + 1e-30
    for impl in IMPLS:
        for acts in ("f32", "i16"):
            if acts == "i16" and fmt in ("f32", "f16", "bf16"):   # (plain floats take fp32 activations)
                continue
            out = np.empty((n_tok, n_rows), np.float32)
            _kernels.matmul(fmt, raw, x, out, None, impl, acts)
            err = np.abs(out - exact) / (scale_i16 if acts == "i16" else scale)
            if not np.isfinite(out).all() or err.max() > (2.0 ** -13 if acts == "i16" else 1e-4):
                raise Finding(f"{fmt} {impl} {acts} [{n_tok}x{K}] x [{n_rows}x{K}]: relative error {err.max():.2e}")


# -- tokenizer ----------------------------------------------------------------
def tokenizer_target(tok, data: bytes) -> None:
    if not data:
        return
    mode = data[0] % 4
    body = data[1:]
    if mode == 0:
        text = body.decode("utf-8", errors="replace")
    elif mode == 1:
        text = body.decode("utf-16-le", errors="surrogatepass") if len(body) % 2 == 0 else body.decode("latin-1")
    elif mode == 2:
        text = "".join(SPECIALS[b % len(SPECIALS)] if b < 64 else chr(b) for b in body)
    else:
        text = (body.decode("utf-8", errors="replace") or "a") * (1 + len(body) % 7) * 50
    # lone surrogates are not text: encoded as U+FFFD, as tiktoken does
    expect = "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in text)
    for special in (False, True):
        ids = tok.encode(text, allow_special=special)
        if any(not 0 <= i < tok.n_vocab for i in ids):
            raise Finding("an id outside the vocabulary")
        back = tok.decode(ids)
        if back != expect:
            raise Finding(f"decode(encode(text)) != text (allow_special={special}): {text[:80]!r} -> {back[:80]!r}")



# -- a file end to end ----------------------------------------------------------
def run_target(data: bytes) -> None:
    """The bytes as a model file through `goosedump run FILE -p hi -n 2`: it
    runs, or ends with one line `goosedump: error: FILE: ...`."""
    import contextlib
    import io

    from goosedump.cli import main
    path = os.path.join(_DIR, "run.gguf")
    with open(path, "wb") as f:
        f.write(data)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["run", path, "-p", "hi", "-n", "2", "--temp", "0", "-t", "1", "--no-prompt-cache"])
    lines = [ln for ln in err.getvalue().splitlines() if not ln.startswith("goosedump: experts")]
    if rc != 0 and not (len(lines) == 1 and lines[0].startswith(f"goosedump: error: {path}")):
        raise Finding(f"exit {rc} with {lines[:3]}")
