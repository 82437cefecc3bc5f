"""Encode throughput: goosedump's tokenizer next to tiktoken's o200k_harmony on
the same text, alternating the two in one run (the machine is shared and
noisy). Target: ours at least half of tiktoken's.

usage: python benchmarks/tokenizer_throughput.py [MODEL.gguf] [--reps 5]
(without a model, a tiny synthetic one is written to a temporary folder)
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import goosedump  # noqa: E402
from corpus import corpus  # noqa: E402
from refs import tiktoken_harmony  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    path = args.model
    if path is None:
        from goosedump import synth
        path = os.path.join(tempfile.mkdtemp(), "tiny.gguf")
        synth.write_model(path, "tiny")
    tok = goosedump.load(path).tokenizer
    tt = tiktoken_harmony()

    # Mixed text: the varied corpus plus plain prose and code, ~4 MB.
    with open(goosedump.__file__.replace("__init__.py", "synth.py")) as f:
        code = f.read()
    prose = ("The expert cache keeps the mixture-of-experts weights on disk and streams them "
             "through a byte budget, while the dense weights stay memory-mapped. ") * 200
    text = "\n".join(corpus()) + (prose + code) * 40
    nbytes = len(text.encode())
    assert tok.encode(text) == tt.encode_ordinary(text), "outputs differ"

    runs = {"goosedump": [], "tiktoken": []}
    fns = {"goosedump": lambda: tok.encode(text), "tiktoken": lambda: tt.encode_ordinary(text)}
    for _ in range(args.reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            runs[name].append(nbytes / (time.perf_counter() - t0) / 1e6)
    ratios = [a / b for a, b in zip(runs["goosedump"], runs["tiktoken"])]
    print(f"text: {nbytes / 1e6:.2f} MB, {len(tt.encode_ordinary(text))} tokens, {args.reps} alternating reps")
    for name, r in runs.items():
        print(f"  {name:10s} {statistics.mean(r):7.2f} MB/s  (min {min(r):.2f}, max {max(r):.2f})")
    print(f"  ratio goosedump/tiktoken: {statistics.mean(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f}); target >= 0.5")
    print(json.dumps({"bytes": nbytes, "goosedump_mb_s": runs["goosedump"], "tiktoken_mb_s": runs["tiktoken"],
                      "ratio_mean": statistics.mean(ratios), "ratio_min": min(ratios)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
