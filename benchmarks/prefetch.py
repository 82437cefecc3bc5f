"""Decode through the expert cache with and without prefetch: tokens/s, read
stall per decode step, prediction accuracy and hit rate (decode's alone).

usage: python benchmarks/prefetch.py MODEL.gguf [--expert-cache 2G] [--gen 12]
"""
import argparse
import sys

import goosedump
from goosedump.options import Options


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--expert-cache", default="2G")
    ap.add_argument("--gen", type=int, default=12)
    args = ap.parse_args()
    print(f"{'prefetch':8s} {'decode tok/s':>12s} {'stall s/token':>14s} {'accuracy':>9s} {'hit rate':>9s}")
    for prefetch in (False, True):
        m = goosedump.load(args.model, options=Options.from_env(expert_cache=args.expert_cache, prefetch=prefetch))
        r = m.generate([976, 4853, 19705, 68347], max_tokens=args.gen, profile=True)
        s = r.profile["phases"]["decode"]["expert_cache"]     # decode's own: its steps, stalls and hits
        steps = max(1, r.generated_tokens - 1)                 # (the first token is prefill's)
        print(f"{'on' if prefetch else 'off':8s} {r.decode_tokens_per_s:12.3f} "
              f"{s['stall_seconds'] / steps:14.2f} "
              f"{100 * s['prefetch_accuracy']:8.0f}% {100 * s['hit_rate']:8.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
