"""Two builds of the native kernels side by side in one process, alternating:
the products (`_kernels.matmul`) of each format and token count, timed
build A then build B, then B then A, ..., and the ratio A's time / B's (above
1: B is faster) as the best of each build and the median of the pairs. The
noise of a shared machine moves both builds of a pair alike. Also says
whether the two builds' outputs are the same bits (a change of the
arithmetic shows there).

Keep a copy of the installed extension before a change, rebuild, and compare:

    cp "$(python -c 'import goosedump._kernels as k; print(k.__file__)')" /tmp/before.so
    # ... change csrc/, pip install --no-deps --no-build-isolation . ...
    cp "$(python -c 'import goosedump._kernels as k; print(k.__file__)')" /tmp/after.so
    python benchmarks/kernel_ab.py /tmp/before.so /tmp/after.so --formats mxfp4,q8_0 --tokens 1,8,64

--in-cache times one matrix again and again (it stays in the caches: the
kernels' own speed); without it one token rotates through a gigabyte of
copies in 2 MiB pages (from memory, as decode reads its weights; 24 matrices
had fit the 480 MB L3 an Intel Xeon reports).

usage: python benchmarks/kernel_ab.py A.so B.so [--formats mxfp4] [--tokens 1,8,128] [--reps 11]
           [--threads 2] [--in-cache] [--rows 2880] [--cols 2880]
"""
import argparse
import importlib.util
import statistics
import time
import warnings

import numpy as np
from goosedump.gguf import BLOCK_SIZES, GGMLType
from kernel_paths import matrices, rotation   # (benchmarks/: the random matrices kernel_paths.py times)


def load(path: str):
    """The extension at `path` as a module of its own (two builds side by side)."""
    spec = importlib.util.spec_from_file_location("_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="build A: a goosedump._kernels shared object")
    ap.add_argument("b", help="build B")
    ap.add_argument("--formats", default="mxfp4", help="comma list of block formats (default mxfp4)")
    ap.add_argument("--tokens", default="1,8,128", help="comma list of token counts (default 1,8,128)")
    ap.add_argument("--reps", type=int, default=11, help="alternating pairs (default 11)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--in-cache", action="store_true", help="one matrix, again and again")
    ap.add_argument("--rows", type=int, default=2880)
    ap.add_argument("--cols", type=int, default=2880)
    args = ap.parse_args()
    formats = args.formats.split(",")
    for fmt in formats:
        if fmt.upper() not in GGMLType.__members__:
            ap.error(f"--formats: unknown format {fmt!r}")
        block = BLOCK_SIZES[GGMLType[fmt.upper()]][0]
        if args.cols % block:
            ap.error(f"--cols {args.cols} is not a multiple of {fmt}'s block of {block} values (try --cols 3072)")
    # (the second build registers the same nanobind types again: harmless here)
    warnings.filterwarnings("ignore", message="nanobind: type")
    builds = [load(args.a), load(args.b)]
    for m in builds:
        m.set_num_threads(args.threads)
    rng = np.random.default_rng(1)
    n, k = args.rows, args.cols
    for fmt in formats:
        for T in map(int, args.tokens.split(",")):
            mats = matrices(fmt, n, k, 1) if (args.in_cache or T > 1) else rotation(fmt, n, k)
            x = rng.standard_normal((T, k)).astype(np.float32)
            ys = [np.empty((T, n), np.float32) for _ in builds]
            inner = max(1, int(2e8 / (n * k * T))) if len(mats) == 1 else 1

            def run(i: int) -> float:
                m, y = builds[i], ys[i]
                m.matmul(fmt, mats[0], x, y, None)
                t0 = time.perf_counter()
                for _ in range(inner):
                    for w in mats:
                        m.matmul(fmt, w, x, y, None)
                return (time.perf_counter() - t0) / (inner * len(mats))

            times = ([], [])
            for r in range(args.reps):
                for i in ((0, 1) if r % 2 == 0 else (1, 0)):
                    times[i].append(run(i))
            ratios = [a / b for a, b in zip(*times)]
            macs = n * k * T
            print(f"{fmt} {T:4d} tokens: A {macs / min(times[0]) / 1e9:6.1f}, B {macs / min(times[1]) / 1e9:6.1f} "
                  f"GMAC/s; A/B time: best {min(times[0]) / min(times[1]):.3f}, median pair "
                  f"{statistics.median(ratios):.3f}; same bits: {np.array_equal(ys[0], ys[1])}", flush=True)


if __name__ == "__main__":
    main()
