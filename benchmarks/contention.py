"""Decode speed when another process is busy: goosedump and llama.cpp with 1
and 2 threads, alone and beside one busy process pinned to one core, side by
side in one run (conditions alternate, their order reversed on odd reps, so the machine's drift
hits all alike).

    python benchmarks/contention.py [--model tiny.gguf] [--model synth-20b.gguf ...]
                                    [--gen 32] [--reps 2] [--llama-bench PATH]

Without --model it writes the tiny synthetic model into a temporary folder.
Each measurement is a fresh process: `goosedump bench -p 8 -n GEN -t T` and
`llama-bench -p 0 -n GEN -t T` (from $LLAMA_BENCH, --llama-bench, or left out
when neither is there). The busy process is a pure spin loop pinned to core
0. Printed: tok/s per engine, model and thread count, alone and busy, the
ratio busy/alone, and whether 2 threads are at least as fast as 1 when busy.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from goosedump.machine import cpu_count, cpu_name

HERE = os.path.dirname(os.path.abspath(__file__))




class Busy:
    """A process that spins on core 0 until stopped."""

    def __enter__(self):
        self.p = subprocess.Popen([sys.executable, "-c", "import os\nos.sched_setaffinity(0, {0})\nwhile True: pass"])
        return self

    def __exit__(self, *exc):
        self.p.kill()
        self.p.wait()


def goosedump_tps(model: str, threads: int, gen: int) -> float:
    exe = shutil.which("goosedump", path=os.path.dirname(sys.executable)) or "goosedump"
    out = subprocess.run([exe, "bench", model, "-p", "8", "-n", str(gen), "-t", str(threads), "-r", "1",
                          "--expert-cache", "16G", "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["decode_tokens_per_s"]


def llama_tps(binary: str, model: str, threads: int, gen: int) -> float:
    out = subprocess.run([binary, "-m", model, "-t", str(threads), "-p", "0", "-n", str(gen), "-r", "1",
                          "-o", "json"], capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout)[0]["avg_ts"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="a GGUF file (repeatable; default: the tiny synthetic model)")
    ap.add_argument("--gen", type=int, default=32, help="tokens decoded per measurement (default 32)")
    ap.add_argument("--reps", type=int, default=2, help="measurements per condition (default 2)")
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH"), help="llama.cpp's llama-bench")
    args = ap.parse_args()
    tmp = None
    models = args.model
    if not models:
        from goosedump import synth
        tmp = tempfile.mkdtemp(prefix="goosedump-contention-")
        models = [os.path.join(tmp, "tiny.gguf")]
        synth.write_model(models[0], "tiny", seed=1)
    engines = {"goosedump": goosedump_tps}
    if args.llama_bench and os.path.exists(args.llama_bench):
        engines["llama.cpp"] = lambda m, t, g: llama_tps(args.llama_bench, m, t, g)
    print(f"CPU: {cpu_name()} ({cpu_count()} CPUs); busy process: a spin loop pinned to core 0")
    rows = {}
    try:
        for rep in range(args.reps):
            turn = (lambda xs: xs) if rep % 2 == 0 else (lambda xs: xs[::-1])   # odd reps: every order reversed
            for model in models:
                for busy in turn([False, True]):
                    for name, fn in turn(list(engines.items())):
                        for threads in turn([1, 2]):
                            if busy:
                                with Busy():
                                    v = fn(model, threads, args.gen)
                            else:
                                v = fn(model, threads, args.gen)
                            rows.setdefault((os.path.basename(model), name, threads, busy), []).append(v)
                            print(f"rep {rep + 1} {os.path.basename(model)} {name} -t {threads} "
                                  f"{'busy' if busy else 'alone'}: {v:.2f} tok/s", flush=True)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n| model | engine | threads | alone tok/s | busy tok/s | busy / alone |")
    print("|---|---|---|---|---|---|")
    summary = []
    for model in models:
        m = os.path.basename(model)
        for name in engines:
            for threads in (1, 2):
                a = statistics.mean(rows[(m, name, threads, False)])
                b = statistics.mean(rows[(m, name, threads, True)])
                print(f"| {m} | {name} | {threads} | {a:.2f} | {b:.2f} | {b / a:.2f}x |")
                summary.append({"model": m, "engine": name, "threads": threads, "alone": a, "busy": b})
            two = statistics.mean(rows[(m, name, 2, True)])
            one = statistics.mean(rows[(m, name, 1, True)])
            print(f"| {m} | {name} | busy: 2 threads / 1 thread | | | {two / one:.2f}x |")
    print(json.dumps({"cpu": cpu_name(), "gen": args.gen, "reps": args.reps, "results": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
