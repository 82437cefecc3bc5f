"""Mutational fuzzing of model files, end to end: mutated copies of a tiny
model in every recipe, each loaded and run for 2 tokens as `goosedump run`
runs it, in worker processes watched for signals and hangs.

    python benchmarks/fuzz_files.py [--cases 1000] [--workers 2] [--timeout 20] [--seed 0] [--recipes all]

The recipes are every one goosedump writes, and a three-part split set.
Mutations, drawn at random per case (for the split set, of one part): bit flips (most in the header,
metadata and tensor table, some anywhere), integer overwrites there (0, 1,
-1, 2^31-1, 2^32-1, 2^63-1, the file size, random) at 4- and 8-byte widths,
truncation at a random length, and zeroed 4 KiB pages. Every case must
either run, or exit non-zero with one line `goosedump: error: ...` naming
the file (for a split set, the part at fault); a traceback, another message, a signal or a hang is a failure
(the case is kept under --keep for replay). Prints the counts per recipe.
Exit status 1 on any failure.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time

MARK = "@@case "      # a verdict line, among whatever else reaches the worker's stdout
INTERESTING = [0, 1, 0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFFFFFFFFFF, 0x7FFFFFFFFFFFFFFF, 2, 32, 4096]


def mutate(data: bytes, header_end: int, rng: random.Random) -> tuple[bytes, str]:
    """One mutated copy of data and what was done to it."""
    b = bytearray(data)
    kind = rng.choices(["flip", "int", "truncate", "zero"], weights=[4, 4, 1, 1])[0]
    where = lambda: rng.randrange(header_end) if rng.random() < 0.85 else rng.randrange(len(b))  # noqa: E731
    if kind == "flip":
        spots = [where() for _ in range(rng.choice([1, 1, 2, 4, 16]))]
        for at in spots:
            b[at] ^= 1 << rng.randrange(8)
        return bytes(b), f"flip bits at {spots[:4]}"
    if kind == "int":
        width = rng.choice([4, 8])
        at = min(where(), len(b) - width)
        value = rng.choice(INTERESTING + [len(b), rng.getrandbits(8 * width)]) & ((1 << (8 * width)) - 1)
        b[at:at + width] = value.to_bytes(width, "little")
        return bytes(b), f"int{8 * width} {value:#x} at {at}"
    if kind == "truncate":
        n = rng.randrange(len(b))
        return bytes(b[:n]), f"truncate to {n}"
    page = rng.randrange(0, len(b), 4096)
    b[page:page + 4096] = bytes(len(b[page:page + 4096]))
    return bytes(b), f"zero the page at {page}"


def worker() -> int:
    """Reads case paths on stdin; answers one JSON line per case."""
    from goosedump.cli import main
    for line in sys.stdin:
        path = line.strip()
        err = io.StringIO()
        tb = None
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                rc = main(["run", path, "-p", "hi", "-n", "2", "--temp", "0", "-t", "1", "--no-prompt-cache",
                           "--expert-cache", "auto"])
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
        except BaseException as e:      # what main lets through would be a traceback
            import traceback
            rc, tb = -1, "".join(traceback.format_exception(e))[-3000:]
        lines = err.getvalue().splitlines()
        print(MARK + json.dumps({"rc": rc, "lines": [ln[:300] for ln in lines[:5]], "n_lines": len(lines),
                                 "traceback": tb}), flush=True)
    return 0


class Worker:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                                     env={**os.environ, "GOOSEDUMP_PROMPT_CACHE": "off"})

    def run(self, path: str, timeout: float) -> dict:
        """The case's verdict; a dead or stuck worker is replaced."""
        import selectors
        self.proc.stdin.write(path + "\n")
        self.proc.stdin.flush()
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline, other = time.monotonic() + timeout, []
        while True:
            if not sel.select(max(0.0, deadline - time.monotonic())):
                self.proc.kill()
                self.proc.wait()
                self.__init__()
                return {"verdict": "hang"}
            line = self.proc.stdout.readline()
            if not line:
                code = self.proc.wait()
                err = self.proc.stderr.read()[-2000:]
                self.__init__()
                return {"verdict": f"signal {-code}" if code < 0 else f"died ({code})", "stderr": err}
            if MARK in line:          # (after whatever the run printed without a newline)
                r = json.loads(line[line.index(MARK) + len(MARK):])
                r["stdout"] = "".join(other)[-2000:]
                return r
            other.append(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(30)


def verdict(r: dict, names: list[str]) -> str:
    """ran, clean error (one line naming one of the files), or the failure."""
    if "verdict" in r:
        return r["verdict"]
    if r["traceback"]:
        return "traceback"
    if r["rc"] == 0:
        return "ran"
    errors = [ln for ln in r["lines"] if ln.startswith("goosedump: error:")]
    others = [ln for ln in r["lines"] if ln.strip() and not ln.startswith("goosedump:")]
    if len(errors) == 1 and any(n in errors[0] for n in names) and not others and r["n_lines"] <= 3:
        return "clean error"
    return "unclear error"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=1000, help="mutated copies per recipe (default 1000)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds a case may take (default 20)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--recipes", default="all", help="comma-separated recipes (default all)")
    ap.add_argument("--keep", default=None, metavar="DIR", help="copy failing cases here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker()
    from concurrent.futures import ThreadPoolExecutor

    from goosedump import recipes, synth
    from goosedump.gguf import GGUFFile
    names = list(recipes.RECIPES) + ["mxfp4-split"] if args.recipes == "all" else args.recipes.split(",")
    work = tempfile.mkdtemp(prefix="goosedump-fuzz-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    vocab = synth.small_vocab()
    workers = [Worker() for _ in range(args.workers)]
    totals: dict[str, dict[str, int]] = {}
    failures = []
    t0 = time.perf_counter()
    try:
        for recipe in names:
            # a split set (three parts, as llama-gguf-split writes them): a case mutates one part
            split = recipe.endswith("-split")
            base = os.path.join(work, f"tiny-{recipe}.gguf")
            synth.write_model(base, "tiny", seed=3, vocab=vocab, recipe=recipe.removesuffix("-split"),
                              split_max_size=150_000 if split else None)
            paths = sorted(p for p in os.listdir(work) if p.startswith(f"tiny-{recipe}") and "-of-" in p) \
                if split else [os.path.basename(base)]
            parts = []
            for p in paths:
                with GGUFFile(os.path.join(work, p), whole_set=False) as f:
                    parts.append((p, open(os.path.join(work, p), "rb").read(), f.data_offset))
            rng = random.Random(f"{args.seed}-{recipe}")
            cases = []
            for _ in range(args.cases):
                j = rng.randrange(len(parts))
                blob, what = mutate(parts[j][1], parts[j][2], rng)
                cases.append((j, blob, f"part {j + 1}: {what}" if split else what))
            counts = totals.setdefault(recipe, {})

            def one(k: int) -> None:
                j, blob, what = cases[k]
                folder = os.path.join(work, f"case-{recipe}-{k}")
                os.makedirs(folder)
                for i, (name, data, _) in enumerate(parts):
                    with open(os.path.join(folder, name), "wb") as f:
                        f.write(blob if i == j else data)
                path = os.path.join(folder, parts[0][0])
                w = workers[k % len(workers)]
                v = verdict(w.run(path, args.timeout), [name for name, _, _ in parts])
                counts[v] = counts.get(v, 0) + 1
                if v not in ("ran", "clean error"):
                    failures.append((recipe, k, what, v))
                    if args.keep:
                        shutil.copytree(folder, os.path.join(args.keep, os.path.basename(folder)))
                shutil.rmtree(folder)
            # each worker takes every len(workers)-th case, one at a time
            with ThreadPoolExecutor(len(workers)) as pool:
                list(pool.map(lambda j: [one(k) for k in range(j, args.cases, len(workers))], range(len(workers))))
    finally:
        for w in workers:
            w.close()
        shutil.rmtree(work, ignore_errors=True)
    dt = time.perf_counter() - t0
    print(f"{sum(sum(c.values()) for c in totals.values())} mutated files in {dt:.0f} s, {args.workers} workers")
    print("| recipe | ran | clean error | failures |")
    print("|---|---|---|---|")
    for recipe, c in totals.items():
        bad = {k: v for k, v in c.items() if k not in ("ran", "clean error")}
        print(f"| {recipe} | {c.get('ran', 0)} | {c.get('clean error', 0)} | "
              f"{', '.join(f'{v} {k}' for k, v in bad.items()) or 0} |")
    for recipe, k, what, v in failures[:20]:
        print(f"FAILED {recipe} case {k} ({what}): {v}")
    print(json.dumps({"totals": totals, "failures": failures[:100], "seconds": dt}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
