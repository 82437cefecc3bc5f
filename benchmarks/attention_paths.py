"""Attention's paths side by side on this CPU: each SIMD path this CPU runs
(`_kernels.available_impls()`, the portable reference left out unless asked)
times one full-attention layer of gpt-oss's shape (64 query heads over 8 kv
heads of 64 dimensions, sinks, an fp16 KV cache) at decode (one query) and
over a prefill chunk of 512 queries, with 512 to 8,192 positions before it,
alternating path by path in one process so that a noisy machine slows them
alike, and prints each path's rate (multiply-accumulates of the scores and
the values: 2 x 64 per head and position), milliseconds per query and
layer, and its ratio to AVX2 (or the first path). At decode the cache is
cold, as in the engine (the weights streamed since the layer last ran have
evicted it): a fresh cache per timed call, from a rotation of caches.

usage: python benchmarks/attention_paths.py [--threads N] [--reps R] [--with-generic] [--contexts 512,2048,8192]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from goosedump import _kernels
from goosedump.machine import cpu_name
from kernel_paths import add_path_options, timed_paths   # (this folder: the options the two scripts share)

H, KH, D = 64, 8, 64
ROTATION_BYTES = 1 << 30   # decode's caches: more than any L3 here


def caches(cap: int, count: int, rng) -> list[tuple[np.ndarray, np.ndarray]]:
    one_k = rng.standard_normal((KH, cap, D)).astype(np.float16).view(np.uint16)
    one_v = rng.standard_normal((KH, cap, D)).astype(np.float16).view(np.uint16)
    return [(one_k.copy(), one_v.copy()) for _ in range(count)]


def timed(q, kv, pos0, sinks, out, path) -> float:
    """Seconds per call over the caches kv, one call each (after a warm-up)."""
    _kernels.attention(q, kv[0][0], kv[0][1], sinks, pos0, 0, 0.125, out, path)
    t0 = time.perf_counter()
    for k, v in kv:
        _kernels.attention(q, k, v, sinks, pos0, 0, 0.125, out, path)
    return (time.perf_counter() - t0) / len(kv)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_path_options(ap)
    ap.add_argument("--contexts", default="512,2048,8192",
                    help="positions before the queries, comma-separated (default 512,2048,8192)")
    args = ap.parse_args()
    try:
        contexts = [int(c) for c in args.contexts.split(",")]
    except ValueError:
        ap.error(f"--contexts takes comma-separated integers, got {args.contexts!r}")
    if any(c < 1 or c > 1 << 20 for c in contexts):
        ap.error(f"--contexts: each between 1 and {1 << 20}, got {args.contexts!r}")
    paths, base = timed_paths(ap, args)
    print(f"CPU: {cpu_name()}; paths: {', '.join(paths)}; threads: {_kernels.num_threads()}")
    print(f"{'shape':<36} " + " ".join(f"{p + ' GMAC/s':>14} {'ms':>7} {'x ' + base:>8}" for p in paths))
    rng = np.random.default_rng(0)
    sinks = rng.standard_normal(H).astype(np.float32)
    for ctx in contexts:
        for T in (1, 512):
            cap = ctx + T
            per_cache = 2 * KH * cap * D * 2
            count = max(2, ROTATION_BYTES // per_cache) if T == 1 else 2
            kv = caches(cap, count, rng)
            q = rng.standard_normal((T, H, D)).astype(np.float32)
            out = np.empty((T, H, D), np.float32)
            best = {p: float("inf") for p in paths}
            for _ in range(args.reps):
                for p in paths:
                    best[p] = min(best[p], timed(q, kv, ctx, sinks, out, p))
            del kv
            macs = sum(ctx + t + 1 for t in range(T)) * H * D * 2
            cells = [f"{macs / best[p] / 1e9:>14.1f} {1e3 * best[p] / T:>7.3f} {best[base] / best[p]:>8.2f}"
                     for p in paths]
            what = "decode, 1 query" if T == 1 else f"prefill, {T} queries"
            print(f"{what} after {ctx} positions".ljust(36) + " " + " ".join(cells))


if __name__ == "__main__":
    main()
