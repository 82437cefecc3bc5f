"""Time to first token, cold and warm, for a long chat prompt: what the
prompt cache on disk saves a second `goosedump run`.

    python benchmarks/prompt_cache.py MODEL.gguf [--prompt-tokens 1500] [--gen 8] [--threads 2]

Four `goosedump run` processes, one after another, each a fresh process
with the same system prompt (long instructions and a tool catalogue, padded
to about --prompt-tokens tokens in all): (1) cold, into an empty cache
folder; (2) the same system prompt with another question, warm; (3) that
second prompt again without a prompt cache, cold, to check its tokens equal
the warm run's; (4) the first prompt again, warm. Prints each run's prompt
tokens, tokens served from the cache, time to the first token (the
generation's prefill, from --json) and wall time.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from goosedump.machine import cpu_description

TOOL = ("- {name}(city: string, unit: 'celsius' | 'fahrenheit', days: integer 1..14): returns the {what} for the "
        "city over the coming days as a list of daily records with the date, the minimum and maximum, and a short "
        "description; call it only when the user asks about {what}.\n")
WHATS = ["weather forecast", "air quality", "pollen count", "UV index", "sunrise and sunset", "tide tables",
         "wind speed", "snow depth", "rainfall", "humidity", "sea temperature", "visibility"]


def system_prompt(tokens: int) -> str:
    text = ("You are the assistant of a travel agency. Answer briefly and exactly; when you use a tool, say which. "
            "You can use these tools:\n")
    i = 0
    while len(text) < tokens * 3.7:          # about 3.7 characters per token in this text
        text += TOOL.format(name=f"tool_{i}", what=WHATS[i % len(WHATS)])
        i += 1
    return text


def run(model: str, system: str, question: str, gen: int, threads: int, cache: str | None) -> dict:
    cmd = [sys.executable, "-m", "goosedump", "run", model, "--system", system, "-p", question, "-n", str(gen),
           "--temp", "0", "--json", "-t", str(threads), "--date", "2026-12-01"]
    cmd += ["--prompt-cache", cache] if cache else ["--no-prompt-cache"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode:
        raise SystemExit(f"goosedump run failed ({out.returncode}): {out.stderr[-2000:]}")
    r = json.loads(out.stdout)
    return {"prompt": r["prompt_tokens"], "cached": r["cached_tokens"], "ttft": r["prefill_seconds"],
            "wall": wall, "tokens": r["token_ids"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--prompt-tokens", type=int, default=1500)
    ap.add_argument("--gen", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    system = system_prompt(args.prompt_tokens)
    folder = tempfile.mkdtemp(prefix="goosedump-prompt-cache-")
    q1, q2 = "What will the weather be in Oslo this weekend?", "Is the air clean in Lima today?"
    try:
        rows = [("cold, empty cache", run(args.model, system, q1, args.gen, args.threads, folder)),
                ("warm, another question", run(args.model, system, q2, args.gen, args.threads, folder)),
                ("that question, no cache", run(args.model, system, q2, args.gen, args.threads, None)),
                ("warm, the same prompt", run(args.model, system, q1, args.gen, args.threads, folder))]
        on_disk = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(folder) for f in fs)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"CPU: {cpu_description()}")
    print(f"{os.path.basename(args.model)}, {args.threads} threads, {args.gen} greedy tokens; cache on disk "
          f"{on_disk / 2**20:.0f} MiB")
    print("| run | prompt tokens | from the cache | time to first token | wall (with load) |")
    print("|---|---|---|---|---|")
    for name, r in rows:
        print(f"| {name} | {r['prompt']} | {r['cached']} | {r['ttft']:.2f} s | {r['wall']:.1f} s |")
    cold, warm = rows[0][1], rows[3][1]
    other_warm, other_cold = rows[1][1], rows[2][1]
    # (each warm run against the cold run of its own prompt)
    print(f"time to first token: cold / warm (another question) {other_cold['ttft'] / other_warm['ttft']:.1f}x, "
          f"cold / warm (the same prompt) {cold['ttft'] / warm['ttft']:.1f}x")
    print(f"tokens equal: warm and cold, same prompt: {cold['tokens'] == warm['tokens']}; "
          f"another question, warm and cold: {other_warm['tokens'] == other_cold['tokens']}")
    print(json.dumps({"cpu": cpu_description(), "rows": [{"run": n, **r} for n, r in rows]}))
    return 0 if cold["tokens"] == warm["tokens"] and other_warm["tokens"] == other_cold["tokens"] else 1


if __name__ == "__main__":
    sys.exit(main())
