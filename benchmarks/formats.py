"""Matrix-vector speed of every weight format, as decode meets it: weights
streamed from memory (matrices cycled through, more than the caches hold),
one token, int16 activations (fp32 for the plain-float formats). Prints GB/s
of weights and billions of weights per second per format, the CPU and the
implementation, and the memory bandwidth measured in the same run.

usage: python benchmarks/formats.py [--threads 2] [--mb 1200] [--formats q4_k,q5_0,...]
"""
import argparse
import json
import sys
import time

import numpy as np

from goosedump import _kernels, randblocks
from goosedump.gguf import BLOCK_SIZES, GGMLType
from goosedump.machine import cpu_name




def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mb", type=int, default=1200, help="weights per format, in MiB (default 1200)")
    ap.add_argument("--formats", default=",".join(_kernels.formats()))
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    _kernels.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    buf = np.ones(args.mb << 20, np.uint8)
    _kernels.stream_read(buf)
    t0 = time.perf_counter()
    _kernels.stream_read(buf)
    bw = buf.nbytes / (time.perf_counter() - t0) / 1e9
    del buf
    print(f"{cpu_name()}, {args.threads} threads, {_kernels.active_impl()}; streaming read {bw:.1f} GB/s")
    print(f"{'format':8s} {'B/weight':>8s} {'GB/s':>7s} {'Gweights/s':>10s} {'of bandwidth':>12s}")
    rows = {}
    for fmt in args.formats.split(","):
        t = GGMLType[fmt.upper()]
        values, size = BLOCK_SIZES[t]
        K = 4096 if values == 256 else 2880
        N = 2880
        per = N * K // values * size
        mats = [randblocks.blocks(t, rng, N * K // values, 0.05).reshape(N, -1)
                for _ in range(max(2, (args.mb << 20) // per))]
        x = rng.standard_normal((1, K)).astype(np.float32)
        y = np.empty((1, N), np.float32)
        for w in mats:
            _kernels.matmul(fmt, w, x, y)
        best = 0.0
        for _ in range(args.reps):
            t0 = time.perf_counter()
            for w in mats:
                _kernels.matmul(fmt, w, x, y)
            best = max(best, per * len(mats) / (time.perf_counter() - t0) / 1e9)
        bpw = size / values
        rows[fmt] = {"gb_per_s": best, "gweights_per_s": best / bpw, "bytes_per_weight": bpw}
        print(f"{fmt:8s} {bpw:8.4f} {best:7.1f} {best / bpw:10.1f} {100 * best / bw:11.0f}%", flush=True)
        del mats
    print(json.dumps({"cpu": cpu_name(), "threads": args.threads, "impl": _kernels.active_impl(),
                      "bandwidth_gbs": bw, "formats": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
