"""The kernels' paths side by side on this CPU: each SIMD path this CPU runs
(`_kernels.available_impls()`, the portable reference left out unless asked)
times the int16 products of gpt-oss's hot shapes, alternating path by path
in one process so that a noisy machine slows them alike, and prints each
path's rate, its ratio to AVX2 (or the first path) and its fraction of its
own instruction's measured peak (`_kernels.peak_int16_macs`).

Shapes: an MXFP4 expert matrix (2880 x 2880, the 20b's and 120b's hidden
size) at one token (decode) and at 128 tokens (prefill); a Q8_0 attention
projection (4096 x 2880) likewise, and an F16 one (the F16 files': fp32
activations, no int16 peak to compare with). At one token the matrices
rotate through a gigabyte in 2 MiB pages (`rotation`), as decode's weights
stream from memory.

--forms adds the AVX-512 path's kernels in other forms, each in a child
process of its own (the form is chosen once per process), timed in the same
alternation: without AMX's tiles (GOOSEDUMP_AMX=0) and without VBMI's byte
permutes as well (GOOSEDUMP_AVX512_VBMI=0: the form Cascade Lake and Cooper
Lake run, which have neither).

usage: python benchmarks/kernel_paths.py [--threads N] [--reps R] [--with-generic] [--forms]
"""
from __future__ import annotations

import argparse
import mmap
import os
import subprocess
import sys
import time

import numpy as np

from goosedump import _kernels, randblocks
from goosedump.gguf import BLOCK_SIZES, GGMLType
from goosedump.machine import cpu_name

SHAPES = [("mxfp4", 2880, 2880, 1), ("mxfp4", 2880, 2880, 128), ("q8_0", 4096, 2880, 1), ("q8_0", 4096, 2880, 128),
          ("f16", 4096, 2880, 1), ("f16", 4096, 2880, 128)]
FLOATS = ("f32", "f16", "bf16")   # (fp32 activations and FMAs: no int16 peak to compare with)


def matrices(fmt: str, n: int, k: int, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    t = GGMLType[fmt.upper()]
    per_block = BLOCK_SIZES[t][0]   # (a float type's "block" is one value)
    return [randblocks.blocks(t, rng, n * k // per_block, 0.05).reshape(n, -1) for _ in range(count)]


ROTATION_BYTES = 1 << 30


def rotation(fmt: str, n: int, k: int, nbytes: int = ROTATION_BYTES) -> list[np.ndarray]:
    """Copies of one random matrix filling `nbytes` of one buffer in 2 MiB
    pages where the kernel gives them (as the engine's weights are): what
    decode's one-token products stream through. A gigabyte, not a count of
    matrices: 24 of 2880 x 2880 (106 MB of MXFP4) had fit an Intel Xeon's
    L3 of 480 MB, so "from memory" read the L3 there."""
    one = matrices(fmt, n, k, 1)[0]
    count = max(2, nbytes // one.nbytes)
    area = mmap.mmap(-1, count * one.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        area.madvise(mmap.MADV_HUGEPAGE)
    buf = np.frombuffer(area, np.uint8).reshape(count, *one.shape)
    buf[...] = one
    return list(buf)


def operands(fmt: str, n: int, k: int, t: int):
    mats = rotation(fmt, n, k) if t == 1 else matrices(fmt, n, k, 2)   # one token: from memory
    x = np.random.default_rng(1).standard_normal((t, k)).astype(np.float32)
    return mats, x, np.empty((t, n), np.float32)


def timed(fmt: str, mats, x, y, path: str) -> float:
    """Seconds per matrix of one pass over mats (after a warm-up product)."""
    _kernels.matmul(fmt, mats[0], x, y, None, path)
    t0 = time.perf_counter()
    for w in mats:
        _kernels.matmul(fmt, w, x, y, None, path)
    return (time.perf_counter() - t0) / len(mats)


def child() -> None:
    """--child: a form's process. Reads 'fmt n k t' (new operands) or 'time'
    lines, answers each 'time' with the seconds of one pass on avx512."""
    shape = None
    for line in sys.stdin:
        words = line.split()
        if words[0] == "time":
            print(timed(shape[0], *ops, "avx512"), flush=True)
        else:
            shape = (words[0], *map(int, words[1:]))
            ops = None   # (the last shape's gigabyte freed before the next one's)
            ops = operands(*shape)
            print("ready", flush=True)


class Form:
    """A child process running the AVX-512 path under `env`."""

    def __init__(self, name: str, env: dict[str, str], threads: int):
        self.name = name
        self.proc = subprocess.Popen([sys.executable, __file__, "--child", "--threads", str(threads)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, **env})

    def ask(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise SystemExit(f"kernel_paths.py: the form '{self.name}' ended (exit {self.proc.wait()})")
        return answer.strip()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def add_path_options(ap: argparse.ArgumentParser) -> None:
    """The options of a script that times the paths side by side
    (attention_paths.py takes them too)."""
    ap.add_argument("--threads", type=int, default=0, help="threads (default: one per core)")
    ap.add_argument("--reps", type=int, default=5, help="alternating rounds per shape (the best is kept)")
    ap.add_argument("--with-generic", action="store_true", help="time the portable reference too (slow)")


def timed_paths(ap: argparse.ArgumentParser, args) -> tuple[list[str], str]:
    """Those options applied: the thread count set, and the paths to time
    with the one the others are compared with (AVX2, or the first)."""
    if args.reps < 1:
        ap.error(f"--reps must be at least 1, got {args.reps}")
    if args.threads:
        _kernels.set_num_threads(args.threads)
    paths = [p for p in _kernels.available_impls() if args.with_generic or p != "generic"]
    return paths, "avx2" if "avx2" in paths else paths[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_path_options(ap)
    ap.add_argument("--forms", action="store_true",
                    help="also the AVX-512 path without AMX, and without AMX and VBMI (child processes)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    paths, base = timed_paths(ap, args)
    if args.child:
        return child()
    if args.forms and "avx512" not in paths:
        ap.error("--forms: this CPU has no AVX-512 path (F/BW/VL/VNNI)")
    threads = _kernels.num_threads()
    peaks = {p: _kernels.peak_int16_macs(p, 2_000_000) for p in paths}   # (before the forms' processes start)
    forms = [Form("avx512 no AMX", {"GOOSEDUMP_AMX": "0"}, threads),
             Form("avx512 no AMX, no VBMI", {"GOOSEDUMP_AMX": "0", "GOOSEDUMP_AVX512_VBMI": "0"}, threads)] \
        if args.forms else []
    print(f"CPU: {cpu_name()}; paths: {', '.join(paths + [f.name for f in forms])}; threads: {threads}")
    for p, r in peaks.items():
        print(f"  {p}: peak {r[0] / 1e9:.1f} GMAC/s per thread ({r[1]})")
    for f in forms:   # (their peak: the AVX-512 instructions', vpdpwssd)
        peaks[f.name] = peaks["avx512"]
    names = paths + [f.name for f in forms]
    print(f"{'shape':<28} " + " ".join(f"{p + ' GMAC/s':>14} {'x ' + base:>8} {'% peak':>7}" for p in names))
    for fmt, n, k, t in SHAPES:
        for f in forms:
            f.ask(f"{fmt} {n} {k} {t}")
        mats, x, y = operands(fmt, n, k, t)
        best = {p: float("inf") for p in names}
        for _ in range(args.reps):
            for p in paths:
                best[p] = min(best[p], timed(fmt, mats, x, y, p))
            for f in forms:
                best[f.name] = min(best[f.name], float(f.ask("time")))
        del mats
        rate = {p: n * k * t / best[p] for p in names}
        cells = [f"{rate[p] / 1e9:>14.1f} {rate[p] / rate[base]:>8.2f} "
                 + ("      -" if fmt in FLOATS else f"{100 * rate[p] / (peaks[p][0] * threads):>6.0f}%")
                 for p in names]
        print(f"{fmt} {n}x{k}, {t} token(s)".ljust(28) + " " + " ".join(cells))
    for f in forms:
        f.close()


if __name__ == "__main__":
    main()
