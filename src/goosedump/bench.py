"""`goosedump bench`: prefill and decode speed, llama-bench style: random token
ids (no special tokens), greedy decode that runs through end-of-generation;
comma lists (-p 128,512 -n 32,128 -t 1,2), with llama-bench's columns (model,
size, params, backend, threads, test, t/s). Each -p and -n pair is one run,
a prefill of p tokens then n decode steps: a ppP row once per P and a tgN row
per pair, "tgN @ dP" where it decodes after P tokens (llama-bench's depth;
-p 0: after one token, as its tgN from an empty context). tgN times N
forward passes of one token, as llama-bench's does (the token the prefill's
logits give is not one of them); -n 0 times the prefill alone."""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys

import numpy as np

from . import _kernels
from .machine import AMX_NOTE, NO_VBMI_NOTE, amx_in_use, avx512_without_vbmi
from .budget import format_bytes
from .arguments import UsageError, check_output, check_threads
from .commands import load_model, say_budget, write_profile
from .terminal import print_cache, print_profile


def int_list(text: str | None, flag: str, minimum: int) -> list[int | None]:
    if text is None:
        return [None]
    items = str(text).split(",")
    try:
        if any(not x.strip() for x in items):
            raise ValueError
        values = [int(x) for x in items]
    except ValueError:
        raise UsageError(f"{flag} takes integers, comma-separated for several (e.g. 128,512), got {text!r}") from None
    low = [v for v in values if v < minimum]
    if low:
        raise UsageError(f"{flag} must be at least {minimum}, got {low[0]}" + (f" (in {text!r})" if len(values) > 1 else ""))
    return values


def measure(model, n_prompt: int, n_gen: int, reps: int, profile: bool, log) -> dict:
    normal = [i for i in range(model.config.n_vocab) if i not in model.tokenizer.special_ids]
    rng = np.random.default_rng(0)
    runs = []
    for rep in range(reps + 1):  # the first is a warm-up, not counted
        prompt = rng.choice(normal, max(n_prompt, 1)).tolist()     # (-p 0: the one token a decode needs)
        # the routing trace gives Belady's hit rate beside the achieved one
        r = model.generate(prompt, max_tokens=n_gen + 1, reuse_cache=False, ignore_eos=True,
                           profile=profile and rep == reps, record_routing=not model.store.in_place)
        if r.decode_steps != n_gen:
            raise RuntimeError(f"bench: {r.decode_steps} decode steps where {n_gen} were asked for")
        if rep:
            runs.append((r.prefill_tokens_per_s if n_prompt else None, r.decode_tokens_per_s if n_gen else None))
            log(f"pp{n_prompt} tg{n_gen} t{_kernels.num_threads()} rep {rep}: "
                + ", ".join(f"{what} {v:.2f} tok/s" for what, v in zip(("prefill", "decode"), runs[-1])
                            if v is not None))
    pre, dec = [x[0] for x in runs], [x[1] for x in runs]
    sd = (lambda v: statistics.stdev(v) if len(v) > 1 else 0.0)
    return {"prompt_tokens": n_prompt, "gen_tokens": n_gen, "reps": reps, "threads": _kernels.num_threads(),
            "prefill_tokens_per_s": statistics.mean(pre) if n_prompt else None,
            "prefill_tokens_per_s_std": sd(pre) if n_prompt else None,
            "decode_tokens_per_s": statistics.mean(dec) if n_gen else None,
            "decode_tokens_per_s_std": sd(dec) if n_gen else None,
            "runs": [{"prefill_tokens_per_s": p, "decode_tokens_per_s": d} for p, d in runs],
            "expert_cache": r.expert_cache, "profile": r.profile}   # the last repetition's


def cmd_bench(args: argparse.Namespace) -> int:
    if args.output == "json":                 # (llama-bench's -o json)
        args.json = True
    prompts = int_list(args.prompt_tokens, "-p/--prompt-tokens", 0)
    gens = int_list(args.gen_tokens, "-n/--gen-tokens", 0)
    threads = int_list(args.threads, "-t/--threads", 0)
    if args.reps < 1:
        raise UsageError(f"-r/--reps must be at least 1, got {args.reps}")
    for t in threads[1:]:
        check_threads(t)
    if all(p == 0 for p in prompts) and all(n == 0 for n in gens):
        raise UsageError("-p 0 with -n 0 times nothing: give prompt tokens (-p) or tokens to generate (-n)")
    args.ctx = max(max(prompts), 1) + max(gens) + 1
    args.ctx_said = f"-p {max(prompts)} and -n {max(gens)} need a context of {args.ctx}, which"
    args.threads = threads[0]
    check_output(args.profile_out, "--profile-out")
    model = load_model(args)
    check_output(args.profile_out, "--profile-out", model)
    say_budget(model)
    profile = args.profile or bool(args.profile_out)
    log = (lambda msg: None) if args.json else (lambda msg: print(msg, file=sys.stderr))
    if avx512_without_vbmi():
        log(f"goosedump: {NO_VBMI_NOTE}")
    if amx_in_use():
        log(f"goosedump: {AMX_NOTE}")
    results = []
    for t, p, n in itertools.product(threads, prompts, gens):
        if t is not None:
            _kernels.set_num_threads(t)
        results.append(measure(model, p, n, args.reps, profile, log))
    last = results[-1]
    if args.profile_out:
        write_profile(args.profile_out, model, last["profile"])
    params = sum(int(np.prod(t.dims)) for t in model.file.tensors.values())
    size = sum(t.nbytes for t in model.file.tensors.values())
    backend = f"CPU ({_kernels.active_impl()})"
    if args.json:
        for r in results:
            if not args.profile:
                r.pop("profile")
        out = {"model": model.path, "size_bytes": size, "params": params, "backend": backend, "amx": amx_in_use(),
               "avx512_without_vbmi": avx512_without_vbmi(), **results[0],
               "results": results}
        print(json.dumps(out))
        return 0
    name = os.path.basename(model.path)
    rows, shown = [], set()
    for r in results:
        p, n = r["prompt_tokens"], r["gen_tokens"]
        if p and (r["threads"], p) not in shown:      # (each prefill once: the first run of its -p)
            shown.add((r["threads"], p))
            rows.append((r["threads"], f"pp{p}", r["prefill_tokens_per_s"], r["prefill_tokens_per_s_std"]))
        if n:                                         # (-n 0: no decode row, as llama-bench)
            rows.append((r["threads"], f"tg{n}" + (f" @ d{p}" if p else ""), r["decode_tokens_per_s"],
                         r["decode_tokens_per_s_std"]))
    width = max(6, *(len(test) for _, test, _, _ in rows))
    print(f"| {'model':24s} | {'size':>10s} | {'params':>8s} | {'backend':12s} | {'threads':>7s} | {'test':>{width}s} "
          f"| {'t/s':>16s} |")
    print(f"| {'-' * 24} | {'-' * 10}:| {'-' * 8}:| {'-' * 12} | {'-' * 7}:| {'-' * width}:| {'-' * 16}:|")
    for t, test, rate, std in rows:
        print(f"| {name[:24]:24s} | {format_bytes(size):>10s} | {params / 1e9:7.2f}B | {backend:12s} | "
              f"{t:7d} | {test:>{width}s} | {rate:8.2f} ± {std:5.2f} |")
    print_cache(last["expert_cache"], out=sys.stdout)
    if args.profile:
        print_profile(last["profile"], out=sys.stdout)
    return 0
