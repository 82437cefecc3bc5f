"""The share of prompt tokens served from a KV cache under a multi-turn load
on goosedump replicas, with and without session affinity.

    python benchmarks/replicas.py MODEL.gguf [--replicas 2] [--conversations 8] [--turns 4] [--threads 1]

Runs the same load twice, each on a fresh `goosedump serve MODEL --replicas N
--no-prompt-cache` (a local Ray cluster; so neither pass finds the other's
caches, in the replicas' memory or on disk): --conversations conversations of
--turns turns each, their turns interleaved (every conversation's turn 1,
then every turn 2, ...), each turn sending the whole conversation so far;
once with an `X-Session-Id` header per conversation, once without. Prints prompt tokens,
cached tokens and their share, the replicas each conversation met, and
requests/s, from the responses' usage and X-Goosedump-Replica headers.
"""
from __future__ import annotations

import argparse
import collections
import os
import signal
import socket
import subprocess
import sys
import time

import openai

from goosedump.machine import cpu_description

try:
    import httpx
except ImportError:
    import httpx2 as httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(base: str, replicas: int, proc, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"serve exited with {proc.returncode}")
        try:
            seen = {httpx.get(base + "/health", timeout=5).headers.get("x-goosedump-replica") for _ in range(12)}
            if len(seen) >= replicas:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise SystemExit("the replicas did not start")


def run_load(client: openai.OpenAI, conversations: int, turns: int, affinity: bool, max_tokens: int) -> dict:
    convs = [[{"role": "user", "content": f"Conversation {i}: tell me about the number {i}."}]
             for i in range(conversations)]
    met: list[set[str]] = [set() for _ in range(conversations)]
    prompt = cached = 0
    t0 = time.perf_counter()
    for turn in range(turns):
        for i, messages in enumerate(convs):
            headers = {"X-Session-Id": f"conversation-{i}"} if affinity else {}
            r = client.chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=max_tokens,
                                                                 temperature=0, extra_headers=headers)
            met[i].add(r.headers["x-goosedump-replica"])
            done = r.parse()
            if turn:                    # the first turn has nothing to find in any cache
                prompt += done.usage.prompt_tokens
                cached += done.usage.prompt_tokens_details.cached_tokens
            messages += [{"role": "assistant", "content": done.choices[0].message.content or ""},
                         {"role": "user", "content": f"And what follows, turn {turn + 1}?"}]
    dt = time.perf_counter() - t0
    return {"prompt_tokens": prompt, "cached_tokens": cached, "share": cached / prompt if prompt else 0.0,
            "replicas_per_conversation": sum(len(m) for m in met) / len(met),
            "conversations_per_replica": sorted(collections.Counter(r for m in met if len(m) == 1 for r in m).values()),
            "requests_per_s": conversations * turns / dt}


def served_load(args: argparse.Namespace, affinity: bool) -> dict:
    """One pass of the load on a server of its own."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "goosedump", "serve", args.model, "--port", str(port),
                             "--replicas", str(args.replicas), "--threads", str(args.threads), "--model-name", "m",
                             "--ctx", "2048", "--no-prompt-cache"], env=env, start_new_session=True)
    try:
        wait_ready(base, args.replicas, proc)
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=300)
        return run_load(client, args.conversations, args.turns, affinity, args.max_tokens)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
        subprocess.run(["ray", "stop", "--force"], capture_output=True,
                       env={**env, "PATH": os.path.dirname(sys.executable) + os.pathsep + env["PATH"]})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=8)
    args = ap.parse_args()
    rows = {affinity: served_load(args, affinity) for affinity in (False, True)}
    print(f"\nCPU: {cpu_description()}")
    print(f"{os.path.basename(args.model)}: {args.replicas} replicas of {args.threads} thread(s), "
          f"{args.conversations} conversations x {args.turns} turns (turns 2.. counted), {args.max_tokens} tokens "
          f"per answer")
    print("| routing | prompt tokens | cached | cached share | replicas met per conversation | "
          "conversations per replica | requests/s |")
    print("|---|---|---|---|---|---|---|")
    for affinity, r in rows.items():
        print(f"| {'X-Session-Id affinity' if affinity else 'least loaded'} | {r['prompt_tokens']} | "
              f"{r['cached_tokens']} | {100 * r['share']:.1f}% | {r['replicas_per_conversation']:.2f} | "
              f"{'/'.join(map(str, r['conversations_per_replica'])) or '-'} | "
              f"{r['requests_per_s']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
