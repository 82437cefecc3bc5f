"""`goosedump bench`: prefill and decode speed, llama-bench style: random token
ids (no special tokens), greedy decode that runs through end-of-generation."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import numpy as np

from . import _kernels
from .commands import UsageError, load_model, write_profile
from .terminal import print_cache, print_profile


def cmd_bench(args: argparse.Namespace) -> int:
    if args.prompt_tokens < 1 or args.gen_tokens < 1 or args.reps < 1:
        raise UsageError("-p, -n and -r must be at least 1")
    args.ctx = args.prompt_tokens + args.gen_tokens
    model = load_model(args)
    normal = [i for i in range(model.config.n_vocab) if i not in model.tokenizer.special_ids]
    rng = np.random.default_rng(0)
    runs = []
    profile = args.profile or bool(args.profile_out)
    for rep in range(args.reps + 1):  # the first is a warm-up, not counted
        prompt = rng.choice(normal, args.prompt_tokens).tolist()
        # the routing trace gives Belady's hit rate beside the achieved one
        r = model.generate(prompt, max_tokens=args.gen_tokens, reuse_cache=False, ignore_eos=True,
                           profile=profile and rep == args.reps, record_routing=not model.store.in_place)
        if rep:
            runs.append((r.prefill_tokens_per_s, r.decode_tokens_per_s))
            if not args.json:
                print(f"rep {rep}: prefill {runs[-1][0]:.2f} tok/s, decode {runs[-1][1]:.2f} tok/s",
                      file=sys.stderr)
    pre, dec = [x[0] for x in runs], [x[1] for x in runs]
    sd = (lambda v: statistics.stdev(v) if len(v) > 1 else 0.0)
    result = {"model": model.path, "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens,
              "reps": args.reps, "threads": _kernels.num_threads(),
              "prefill_tokens_per_s": statistics.mean(pre), "prefill_tokens_per_s_std": sd(pre),
              "decode_tokens_per_s": statistics.mean(dec), "decode_tokens_per_s_std": sd(dec),
              "runs": [{"prefill_tokens_per_s": p, "decode_tokens_per_s": d} for p, d in runs],
              "expert_cache": r.expert_cache}   # the last repetition's counters
    if args.profile_out:
        write_profile(args.profile_out, model, r.profile)
    if args.json:
        if args.profile:
            result["profile"] = r.profile
        print(json.dumps(result))
        return 0
    name = os.path.basename(model.path)
    print(f"| {'model':24s} | {'threads':>7s} | {'test':>6s} | {'tokens/s':>16s} |")
    print(f"| {'-' * 24} | {'-' * 7}:| {'-' * 6}:| {'-' * 16}:|")
    print(f"| {name[:24]:24s} | {result['threads']:7d} | {'pp' + str(args.prompt_tokens):>6s} | "
          f"{result['prefill_tokens_per_s']:8.2f} ± {result['prefill_tokens_per_s_std']:5.2f} |")
    print(f"| {name[:24]:24s} | {result['threads']:7d} | {'tg' + str(args.gen_tokens):>6s} | "
          f"{result['decode_tokens_per_s']:8.2f} ± {result['decode_tokens_per_s_std']:5.2f} |")
    print_cache(result["expert_cache"], out=sys.stdout)
    if args.profile:
        print_profile(r.profile, out=sys.stdout)
    return 0
