"""Aggregate decode speed with 1, 2, 4 ... concurrent streams on one engine:
each step decodes one token of every active request in a single batched
pass, so the dense weights and the experts the tokens share are read once.

    python benchmarks/batched_decode.py MODEL.gguf [--streams 1,2,4] [-n 32] [--expert-cache 16G]

Requests sample (temperature 1, fixed seeds) from random prompts, so none
stops early; the decode rate is counted from the moment every stream has its
first token to the moment the last one ends. Prints a table and a JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import numpy as np

import goosedump
from goosedump.engine import Engine
from goosedump.sampling import SamplingParams


def measure(engine: Engine, model, n_streams: int, prompt_tokens: int, gen_tokens: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    normal = np.array([i for i in range(model.config.n_vocab) if i not in model.tokenizer.special_ids])
    stamps: list[list[float]] = [[] for _ in range(n_streams)]
    steps0, batched0 = engine.steps, engine.batched_tokens
    reqs = [engine.submit(rng.choice(normal, prompt_tokens).tolist(), gen_tokens,
                          sampling=SamplingParams(temperature=1.0, seed=seed + i)) for i in range(n_streams)]

    def consume(i):
        for token, _ in reqs[i]:
            if token is not None:
                stamps[i].append(time.perf_counter())
    threads = [threading.Thread(target=consume, args=(i,)) for i in range(n_streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    start = max(s[0] for s in stamps)          # every stream is decoding from here
    end = max(s[-1] for s in stamps)
    tokens = sum(sum(1 for x in s if x > start) for s in stamps)
    return {"streams": n_streams, "decode_tokens": tokens, "seconds": end - start,
            "aggregate_tokens_per_s": tokens / (end - start),
            "per_stream_tokens_per_s": tokens / (end - start) / n_streams,
            "mean_batch": (engine.batched_tokens - batched0) / max(1, engine.steps - steps0),
            "stops": [r.result.stop_reason for r in reqs]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--streams", default="1,2,4")
    ap.add_argument("-p", "--prompt-tokens", type=int, default=32)
    ap.add_argument("-n", "--gen-tokens", type=int, default=32)
    ap.add_argument("--expert-cache", default="16G")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    streams = [int(x) for x in args.streams.split(",")]
    model = goosedump.load(args.model, n_ctx=args.prompt_tokens + args.gen_tokens + 8, threads=args.threads,
                           expert_cache=args.expert_cache)
    model.transformer   # map the weights before timing
    engine = Engine(model, max_batch=max(streams))
    measure(engine, model, 1, 8, 4, seed=999)   # warm-up
    rows = [measure(engine, model, n, args.prompt_tokens, args.gen_tokens, seed=100 * n) for n in streams]
    engine.close()
    base = rows[0]["aggregate_tokens_per_s"]
    print(f"{os.path.basename(args.model)}, expert cache {args.expert_cache} "
          f"({'in place' if model.store.in_place else f'{model.store.n_slots} slots'}), "
          f"{args.gen_tokens} tokens per stream")
    print(f"| streams | aggregate tok/s | per stream tok/s | vs 1 stream | mean batch |")
    print(f"|--------:|----------------:|-----------------:|------------:|-----------:|")
    for r in rows:
        print(f"| {r['streams']:7d} | {r['aggregate_tokens_per_s']:15.2f} | {r['per_stream_tokens_per_s']:16.2f} | "
              f"{r['aggregate_tokens_per_s'] / base:10.2f}x | {r['mean_batch']:10.2f} |")
    print(json.dumps({"model": args.model, "expert_cache": args.expert_cache, "in_place": model.store.in_place,
                      "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
