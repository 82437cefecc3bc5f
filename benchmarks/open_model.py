"""Time from a GGUF path to a usable model description: goosedump's reader
(memory map, metadata, tensor table, config, tensor checks, tokenizer) next to
the `gguf` package's GGUFReader (metadata and tensor table only), alternating.

usage: python benchmarks/open_model.py MODEL.gguf [--reps 3]
"""
import argparse
import json
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    import gguf

    import goosedump
    from goosedump.config import read_config
    from goosedump.gguf import GGUFFile

    def ours_file():
        return GGUFFile(args.model)

    def ours_config():
        return read_config(GGUFFile(args.model))

    def ours_load():
        return goosedump.load(args.model)

    def gguf_py():
        return gguf.GGUFReader(args.model)

    fns = {"goosedump GGUFFile": ours_file, "goosedump read_config": ours_config,
           "goosedump.load (with tokenizer)": ours_load, "gguf.GGUFReader": gguf_py}
    times = {k: [] for k in fns}
    for _ in range(args.reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    print(f"{args.model}: {args.reps} alternating reps (page cache warm after the first)")
    for name, t in times.items():
        print(f"  {name:34s} {statistics.mean(t) * 1000:9.1f} ms  (min {min(t) * 1000:.1f})")
    ratio = statistics.mean(times["gguf.GGUFReader"]) / statistics.mean(times["goosedump.load (with tokenizer)"])
    print(f"  gguf.GGUFReader / goosedump.load: {ratio:.1f}x")
    print(json.dumps({k: v for k, v in times.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
