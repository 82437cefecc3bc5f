"""Soak: `goosedump serve` under a mixed load for a chosen time, through the
official openai client, watching failures, latency and the server's
resources over time.

    python benchmarks/soak.py MODEL.gguf [--minutes 30] [--clients 6] [--threads 1] [--plot soak.png]

The clients pick, request after request: a plain chat request, a streamed
one, one with a tool the model may call, a conversation's next turn (up to
6 turns, then a new conversation), a stream cancelled after its first
chunks, or a bad request (which must get a 4xx OpenAI error). Every 10 s it
samples the server's RSS and open file descriptors. Prints failures among
good requests (target 0), latency percentiles per tenth of the run, and how
far RSS and descriptors move after warm-up (target: within 5% of their
median); --plot draws them.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

import openai
import psutil

from goosedump.machine import cpu_description

try:
    import httpx
except ImportError:
    import httpx2 as httpx

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}
QUESTIONS = ["What is the capital of France?", "Tell me a short joke.", "What is 17 times 23?",
             "Name three colours.", "What is the weather like in Oslo?", "Explain rain in one sentence."]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Load:
    def __init__(self, client: openai.OpenAI, base: str, max_tokens: int):
        self.client, self.base, self.max_tokens = client, base, max_tokens
        self.lock = threading.Lock()
        self.records: list[tuple[float, str, float]] = []     # (time, kind, latency)
        self.failures: list[str] = []
        self.counts: dict[str, int] = {}

    def one(self, rng: random.Random, conv: list) -> None:
        kind = rng.choices(["plain", "stream", "tools", "turn", "cancel", "bad"], weights=[3, 3, 2, 3, 1, 1])[0]
        t0 = time.perf_counter()
        c, q = self.client, [{"role": "user", "content": rng.choice(QUESTIONS)}]
        try:
            if kind == "plain":
                c.chat.completions.create(model="m", messages=q, max_tokens=self.max_tokens)
            elif kind == "stream":
                with c.chat.completions.create(model="m", messages=q, max_tokens=self.max_tokens, stream=True) as s:
                    for _ in s:
                        pass
            elif kind == "tools":
                c.chat.completions.create(model="m", messages=q, max_tokens=self.max_tokens, tools=[TOOL])
            elif kind == "turn":
                if len(conv) >= 12:
                    conv.clear()
                conv.append(q[0])
                r = c.chat.completions.create(model="m", messages=conv, max_tokens=self.max_tokens)
                conv.append({"role": "assistant", "content": r.choices[0].message.content or ""})
            elif kind == "cancel":
                with c.chat.completions.create(model="m", messages=q, max_tokens=200, stream=True) as s:
                    for i, _ in enumerate(s):
                        if i >= 2:
                            break                          # the client goes away mid-stream
            else:
                r = httpx.post(self.base + "/v1/chat/completions", timeout=60,
                               json={"model": "m", "messages": [{"role": "nobody"}], "max_tokens": 2})
                err = r.json().get("error", {})
                if not (400 <= r.status_code < 500 and err.get("message")):
                    raise RuntimeError(f"a bad request got {r.status_code}: {r.text[:200]}")
        except Exception as e:               # every failure is counted, none stops the load
            with self.lock:
                self.failures.append(f"{time.time():.0f} {kind}: {type(e).__name__}: {e}"[:300])
            return
        with self.lock:
            self.records.append((time.time(), kind, time.perf_counter() - t0))
            self.counts[kind] = self.counts.get(kind, 0) + 1


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--plot", default=None, metavar="FILE.png")
    args = ap.parse_args()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "goosedump", "serve", args.model, "--port", str(port), "--model-name", "m",
           "--log-level", "warning", "--ctx", "2048"] + (["--threads", str(args.threads)] if args.threads else [])
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    ps = psutil.Process(server.pid)
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the server did not start")
        time.sleep(0.5)
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=300)
    load = Load(client, base, args.max_tokens)
    t_start, t_end = time.time(), time.time() + 60 * args.minutes
    stop = threading.Event()
    samples: list[tuple[float, int, int]] = []

    def client_loop(k):
        rng, conv = random.Random(k), []
        while not stop.is_set() and time.time() < t_end:
            load.one(rng, conv)

    def sampler():
        while not stop.is_set():
            try:
                samples.append((time.time(), ps.memory_info().rss, ps.num_fds()))
            except psutil.Error:
                return
            stop.wait(10)
    threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(args.clients)]
    watch = threading.Thread(target=sampler, daemon=True)
    watch.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    alive = server.poll() is None
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(60)
    client.close()

    span = t_end - t_start
    print(f"CPU: {cpu_description()}")
    print(f"{os.path.basename(args.model)}: {args.minutes:g} min, {args.clients} clients, max_tokens "
          f"{args.max_tokens}; requests: {json.dumps(load.counts)}; failures among good requests: "
          f"{len(load.failures)}; server alive at the end: {alive}")
    print("| tenth of the run | requests | latency p50 | p90 | p99 |")
    print("|---|---|---|---|---|")
    for i in range(10):
        lat = [r[2] for r in load.records if t_start + i * span / 10 <= r[0] < t_start + (i + 1) * span / 10]
        print(f"| {i + 1} | {len(lat)} | " + " | ".join(f"{pct(lat, p):.2f} s" if lat else "-" for p in (50, 90, 99))
              + " |")
    warm = [s for s in samples if s[0] >= t_start + 0.2 * span]
    drift = {}
    for j, name in ((1, "rss"), (2, "fds")):
        vals = [s[j] for s in warm]
        if vals:
            med = statistics.median(vals)
            drift[name] = max(abs(v - med) for v in vals) / med
    if warm:
        print(f"after warm-up (the first fifth): RSS {min(s[1] for s in warm) / 2**20:.0f}-"
              f"{max(s[1] for s in warm) / 2**20:.0f} MiB (within {100 * drift['rss']:.1f}% of its median), "
              f"open descriptors {min(s[2] for s in warm)}-{max(s[2] for s in warm)} "
              f"(within {100 * drift['fds']:.1f}%)")
    for f in load.failures[:10]:
        print("  failure:", f)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
        ts = [(r[0] - t_start) / 60 for r in load.records]
        ax[0].plot(ts, [r[2] for r in load.records], ".", ms=2)
        ax[0].set_ylabel("latency (s)")
        ax[1].plot([(s[0] - t_start) / 60 for s in samples], [s[1] / 2**20 for s in samples])
        ax[1].set_ylabel("server RSS (MiB)")
        ax[2].plot([(s[0] - t_start) / 60 for s in samples], [s[2] for s in samples])
        ax[2].set_ylabel("open descriptors")
        ax[2].set_xlabel("minutes")
        fig.suptitle(f"goosedump serve soak: {len(load.records)} requests, {len(load.failures)} failures")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=90)
    print(json.dumps({"counts": load.counts, "failures": load.failures[:50], "drift": drift, "alive": alive,
                      "samples": samples}))
    ok = not load.failures and alive and all(v <= 0.05 for v in drift.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
