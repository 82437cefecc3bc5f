"""Load on `goosedump serve`: many clients at once, through the openai client.

    python benchmarks/server_load.py MODEL.gguf [--clients 16] [--requests 200] [--max-tokens 16]
    python benchmarks/server_load.py MODEL.gguf --concurrency 1,2,4 [--duration 30] [--max-tokens 128]
    python benchmarks/server_load.py MODEL.gguf --replicas 1,2 [--threads 1] [--clients 16] [--requests 200]

Starts the server as a subprocess on a free port, then either

- load (default): --clients threads send --requests chat requests in all,
  alternately plain and streamed, and reports latency p50/p90/p99,
  time to first token (streamed requests: the first chunk, which the server
  sends with the first generated token), failures (must be 0), requests/s,
  aggregate generated tokens/s and the server's RSS at start, peak and end;
- concurrency: for each level N, exactly N streams run back to back
  (temperature 0, a fixed max_tokens) for --duration seconds, and the
  aggregate decode rate is the server's generated-token counter (/metrics,
  counted as tokens are produced) over the window: the API cannot ignore
  end-of-generation, so a window of time, not a token count, is measured.

With --replicas N,N,... the load runs once per count against `goosedump
serve --replicas N` (Ray Serve on a local cluster; RSS is then the whole
process tree's: the driver, Ray and every replica), the counts side by side.

Prints a table, then one JSON line with every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import openai
import psutil

try:
    import httpx
except ImportError:                 # the openai client's fork of it
    import httpx2 as httpx

TOPICS = ["the sea", "mountains", "a robot", "bread", "the moon", "rivers", "a library", "trains", "snow",
          "music", "gardens", "a lighthouse", "bees", "chess", "deserts", "a clock"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """python -m goosedump serve on a free port, until stopped."""

    def __init__(self, args, replicas: int | None = None):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.replicas = replicas
        self.log = tempfile.NamedTemporaryFile("w+", prefix="goosedump-serve-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "goosedump", "serve", args.model, "--port", str(self.port),
               "--log-level", "warning", "--model-name", "bench", "--no-prompt-cache"]
        for flag, value in (("--ctx", args.ctx), ("--threads", args.threads), ("--expert-cache", args.expert_cache),
                            ("--replicas", replicas)):
            if value is not None:
                cmd += [flag, str(value)]
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.ps = psutil.Process(self.proc.pid)
        deadline = time.monotonic() + args.start_timeout
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited ({self.proc.returncode}):\n{self.log_text()}")
            try:
                seen = {httpx.get(self.base + "/health", timeout=2).headers.get("x-goosedump-replica")
                        for _ in range(1 if replicas is None else 4 * replicas)}
                if len(seen) >= (replicas or 1):
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"the server did not answer /health in {args.start_timeout} s:\n{self.log_text()}")
            time.sleep(0.2)

    def rss(self) -> int:
        """The server's RSS; with replicas, its whole process tree's."""
        procs = [self.ps] + (self.ps.children(recursive=True) if self.replicas else [])
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total

    def metric(self, name: str) -> float:
        for line in httpx.get(self.base + "/metrics", timeout=10).text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(name)

    def log_text(self) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()[-4000:]

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.replicas:
            subprocess.run([os.path.join(os.path.dirname(sys.executable), "ray"), "stop", "--force"],
                           capture_output=True)
        self.log.close()
        os.unlink(self.log.name)


class RSSSampler(threading.Thread):
    """The server's peak RSS, sampled twice a second."""

    def __init__(self, server: ServerProcess):
        super().__init__(daemon=True)
        self.server, self.peak, self.done = server, server.rss(), threading.Event()

    def run(self):
        while not self.done.wait(0.5):
            try:
                self.peak = max(self.peak, self.server.rss())
            except psutil.Error:
                return


def percentile(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def one_request(client: openai.OpenAI, i: int, max_tokens: int, stream: bool) -> dict:
    """A chat request; its latency, time to first token and tokens."""
    messages = [{"role": "user", "content": f"Request {i}: write a few words about {TOPICS[i % len(TOPICS)]}."}]
    t0 = time.perf_counter()
    if not stream:
        r = client.chat.completions.create(model="bench", messages=messages, max_tokens=max_tokens, temperature=0)
        return {"latency": time.perf_counter() - t0, "ttft": None, "tokens": r.usage.completion_tokens}
    ttft, tokens = None, 0
    for chunk in client.chat.completions.create(model="bench", messages=messages, max_tokens=max_tokens,
                                                temperature=0, stream=True, stream_options={"include_usage": True}):
        if ttft is None:
            ttft = time.perf_counter() - t0
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return {"latency": time.perf_counter() - t0, "ttft": ttft, "tokens": tokens}


def run_load(server: ServerProcess, args) -> dict:
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=args.timeout)
    one_request(client, 0, 2, False)          # warm-up, not counted
    rss_start = server.rss()
    sampler = RSSSampler(server)
    sampler.start()
    lock = threading.Lock()
    next_i = [0]
    results, failures = [], []

    def worker():
        while True:
            with lock:
                i = next_i[0]
                if i >= args.requests:
                    return
                next_i[0] += 1
            try:
                r = one_request(client, i, args.max_tokens, stream=i % 2 == 1)
                with lock:
                    results.append(r)
            except Exception as e:          # every failure is reported, none stops the run
                with lock:
                    failures.append(f"request {i}: {type(e).__name__}: {e}")

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    sampler.done.set()
    sampler.join()
    rss_end = server.rss()
    client.close()
    lat = [r["latency"] for r in results]
    ttft = [r["ttft"] for r in results if r["ttft"] is not None]
    tokens = sum(r["tokens"] for r in results)
    ms = lambda x: None if x is None else round(1000 * x, 1)  # noqa: E731
    return {
        "mode": "load", "clients": args.clients, "requests": args.requests, "max_tokens": args.max_tokens,
        "completed": len(results), "failures": len(failures), "failure_samples": failures[:5],
        "wall_s": round(wall, 3), "requests_per_s": round(len(results) / wall, 3),
        "generated_tokens": tokens, "generated_tokens_per_s": round(tokens / wall, 2),
        "latency_ms": {p: ms(percentile(lat, q)) for p, q in (("p50", 50), ("p90", 90), ("p99", 99))},
        "ttft_ms": {p: ms(percentile(ttft, q)) for p, q in (("p50", 50), ("p90", 90), ("p99", 99))},
        "rss_mib": {"start": round(rss_start / 2**20, 1), "peak": round(sampler.peak / 2**20, 1),
                    "end": round(rss_end / 2**20, 1)},
    }


def print_load(r: dict) -> None:
    print(f"{r['requests']} requests from {r['clients']} clients, max_tokens {r['max_tokens']}, "
          f"half of them streamed")
    rows = [("completed", r["completed"]), ("failures", r["failures"]), ("wall", f"{r['wall_s']:.2f} s"),
            ("requests/s", f"{r['requests_per_s']:.2f}"),
            ("generated tokens/s", f"{r['generated_tokens_per_s']:.1f} ({r['generated_tokens']} tokens)")]
    for name, key in (("latency", "latency_ms"), ("time to first token", "ttft_ms")):
        rows.append((f"{name} p50/p90/p99", " / ".join(f"{r[key][p]} ms" for p in ("p50", "p90", "p99"))))
    rows.append(("server RSS start/peak/end", " / ".join(f"{r['rss_mib'][k]} MiB" for k in ("start", "peak", "end"))))
    width = max(len(n) for n, _ in rows)
    print("| " + "metric".ljust(width) + " | value")
    print("|-" + "-" * width + "-|------")
    for name, value in rows:
        print(f"| {name.ljust(width)} | {value}")
    for f in r["failure_samples"]:
        print("  failure:", f)


def run_concurrency(server: ServerProcess, args) -> dict:
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=args.timeout)
    one_request(client, 0, 2, False)          # warm-up
    levels = []
    for n in args.concurrency:
        stop = threading.Event()
        started = threading.Barrier(n + 1)
        chunks = [0] * n
        failures = []

        def stream_loop(k):
            first = True
            i = k
            while not stop.is_set():
                messages = [{"role": "user", "content": f"Stream {i}: tell a long story about {TOPICS[i % 16]}."}]
                try:
                    s = client.chat.completions.create(model="bench", messages=messages, max_tokens=args.max_tokens,
                                                       temperature=0, stream=True)
                    for _ in s:
                        if first:
                            first = False
                            started.wait()
                        chunks[k] += 1
                        if stop.is_set():
                            break
                    s.close()        # leaving early cancels the generation on the server
                except Exception as e:
                    failures.append(f"{type(e).__name__}: {e}")
                    if first:
                        first = False
                        started.wait()
                i += n

        threads = [threading.Thread(target=stream_loop, args=(k,), daemon=True) for k in range(n)]
        for t in threads:
            t.start()
        started.wait()                  # every stream is generating
        g0, t0 = server.metric("goosedump_generated_tokens_total"), time.perf_counter()
        time.sleep(args.duration)
        g1, t1 = server.metric("goosedump_generated_tokens_total"), time.perf_counter()
        stop.set()
        for t in threads:
            t.join(args.timeout)
        tps = (g1 - g0) / (t1 - t0)
        levels.append({"streams": n, "generated_tokens": int(g1 - g0), "seconds": round(t1 - t0, 3),
                       "tokens_per_s": round(tps, 2), "per_stream_tokens_per_s": round(tps / n, 2),
                       "failures": len(failures)})
        time.sleep(0.5)                 # let the cancelled streams end
    client.close()
    base = levels[0]["tokens_per_s"] or 1.0
    for lv in levels:
        lv["speedup"] = round(lv["tokens_per_s"] / base, 2)
    return {"mode": "concurrency", "max_tokens": args.max_tokens, "duration_s": args.duration, "levels": levels,
            "failures": sum(lv["failures"] for lv in levels)}


def print_concurrency(r: dict) -> None:
    print(f"aggregate decode tokens/s with N simultaneous streams ({r['duration_s']} s each, "
          f"max_tokens {r['max_tokens']}, temperature 0)")
    print("| streams | tokens/s | per stream | speedup | failures |")
    print("|--------:|---------:|-----------:|--------:|---------:|")
    for lv in r["levels"]:
        print(f"| {lv['streams']:7d} | {lv['tokens_per_s']:8.2f} | {lv['per_stream_tokens_per_s']:10.2f} | "
              f"{lv['speedup']:6.2f}x | {lv['failures']:8d} |")


def compare_replicas(args, counts: list[int]) -> int:
    from goosedump.machine import cpu_description
    results = {}
    for n in counts:
        server = ServerProcess(args, replicas=n)
        try:
            results[n] = run_load(server, args)
        finally:
            server.stop()
    print(f"CPU: {cpu_description()}")
    print(f"{os.path.basename(args.model)}: {args.requests} requests from {args.clients} clients, max_tokens "
          f"{args.max_tokens}, half streamed; replicas of --threads {args.threads or 'all cores'}")
    print("| replicas | requests/s | generated tokens/s | latency p50 / p90 / p99 | time to first token p50 / p99 "
          "| failures | RSS peak (all processes) |")
    print("|---|---|---|---|---|---|---|")
    for n, r in results.items():
        lat, ttft = r["latency_ms"], r["ttft_ms"]
        print(f"| {n} | {r['requests_per_s']:.2f} | {r['generated_tokens_per_s']:.1f} | {lat['p50']} / {lat['p90']} / "
              f"{lat['p99']} ms | {ttft['p50']} / {ttft['p99']} ms | {r['failures']} | {r['rss_mib']['peak']} MiB |")
    if len(counts) > 1:
        a, b = results[counts[0]], results[counts[-1]]
        print(f"requests/s, {counts[-1]} replicas / {counts[0]}: {b['requests_per_s'] / a['requests_per_s']:.2f}x")
    print(json.dumps({"cpu": cpu_description(), "model": args.model, "replicas": results}))
    return 1 if any(r["failures"] for r in results.values()) else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="GGUF file")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=None, help="default 16 (load), 128 (concurrency)")
    p.add_argument("--concurrency", default=None, metavar="N,N,...",
                   help="measure aggregate decode tokens/s with exactly these numbers of streams")
    p.add_argument("--duration", type=float, default=30.0, help="seconds per concurrency level (default 30)")
    p.add_argument("--ctx", type=int, default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--expert-cache", default=None)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a request may take")
    p.add_argument("--start-timeout", type=float, default=300.0, help="seconds the server may take to start")
    p.add_argument("--replicas", default=None, metavar="N,N,...",
                   help="run the load against `serve --replicas N` for each count, side by side")
    args = p.parse_args(argv)
    if args.concurrency:
        args.concurrency = [int(x) for x in args.concurrency.split(",")]
    args.max_tokens = args.max_tokens or (128 if args.concurrency else 16)
    if args.replicas:
        return compare_replicas(args, [int(x) for x in args.replicas.split(",")])
    server = ServerProcess(args)
    try:
        if args.concurrency:
            result = run_concurrency(server, args)
            print_concurrency(result)
        else:
            result = run_load(server, args)
            print_load(result)
    finally:
        server.stop()
    result["model"] = args.model
    print(json.dumps(result))
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
