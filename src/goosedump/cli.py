"""goosedump: run GPT-OSS models from their GGUF files on a CPU, in bounded memory."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .budget import ENV_EXPERT_CACHE, SizeError, expert_cache_budget, format_bytes
from .gguf import GGUFError


def _add_expert_cache(p: argparse.ArgumentParser) -> None:
    p.add_argument("--expert-cache", metavar="SIZE", default=None,
                   help=f"expert cache budget, an integer followed by M or G, 1M..16G "
                        f"(default: ${ENV_EXPERT_CACHE}, else 2G)")
    p.add_argument("--page-cache", action="store_true",
                   help="leave the experts' pages in the OS page cache after reading (faster while RAM is "
                        "free; the footprint is then bounded by the OS, not the budget)")


def _add_chat_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--system", default=None, help="system message (for gpt-oss it becomes the developer "
                                                   "message's instructions, as openai-harmony maps it)")
    p.add_argument("--reasoning-effort", choices=["low", "medium", "high"], default="medium",
                   help="how long the model thinks (default medium)")
    p.add_argument("--date", default=None, metavar="YYYY-MM-DD",
                   help="the conversation's date in the system message (default today)")
    p.add_argument("--hide-reasoning", action="store_true", help="do not show the model's reasoning")


def _add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature; 0 is greedy (default 1.0, as gpt-oss recommends)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1.0: off)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (default 0: off)")
    p.add_argument("--min-p", type=float, default=0.0,
                   help="drop tokens less likely than min-p times the most likely (default 0: off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="(default 1.0: off)")
    p.add_argument("--seed", type=int, default=None, help="random seed: the same seed gives the same output")


def _add_runtime(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ctx", type=int, default=None, help="context length (default min(4096, the model's))")
    p.add_argument("--threads", type=int, default=None, help="threads (default: one per core)")
    _add_expert_cache(p)


def _add_profile(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", action="store_true",
                   help="report time, CPU, memory, page faults, reads and expert routing per phase "
                        "(with --json: a 'profile' key)")
    p.add_argument("--profile-out", metavar="FILE.json",
                   help="write the profile, per token where it varies, as JSON (for goosedump plot)")


ENV_API_KEY = "GOOSEDUMP_API_KEY"


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """goosedump serve's flags (here, so that --help needs no web stack)."""
    p.add_argument("model", help="GGUF file (or a Hugging Face repo id REPO[:FILE], as for goosedump run)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--api-key", metavar="KEY", default=os.environ.get(ENV_API_KEY),
                   help=f"require 'Authorization: Bearer KEY' on /v1/ (default: ${ENV_API_KEY}; unset: open)")
    p.add_argument("--expert-cache", metavar="SIZE", default=None,
                   help=f"expert cache budget, an integer followed by M or G, 1M..16G "
                        f"(default: ${ENV_EXPERT_CACHE}, else 2G)")
    p.add_argument("--page-cache", action="store_true",
                   help="leave the experts' pages in the OS page cache after reading")
    p.add_argument("--ctx", type=int, default=None, help="context length (default min(4096, the model's))")
    p.add_argument("--threads", type=int, default=None, help="threads (default: one per core)")
    p.add_argument("--model-name", metavar="NAME", default=None,
                   help="the model's id in the API (default: the file's name without .gguf)")
    p.add_argument("--max-batch", type=int, default=4,
                   help="requests the engine decodes together, where it can (default 4)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (default info)")


def cmd_serve(args: argparse.Namespace) -> int:
    from .server import cmd_serve as serve   # FastAPI and uvicorn load only for serve
    return serve(args)


def cmd_synth(args: argparse.Namespace) -> int:
    from .synth import PRESETS, write_model
    t0 = time.perf_counter()
    size = write_model(args.out, PRESETS[args.preset], seed=args.seed, progress=not args.quiet,
                       routing=args.routing)
    if not args.quiet:
        print(f"wrote {args.out} ({format_bytes(size)}) in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr)
    return 0


def inspect_report(path: str, budget: int, ctx: int) -> dict:
    from .model import estimate_memory, load
    t0 = time.perf_counter()
    model = load(path)
    open_s = time.perf_counter() - t0
    c, lay = model.config, model.layout
    mem = estimate_memory(c, lay, budget, ctx)
    tok = model.tokenizer
    return {
        "path": path,
        "architecture": "gpt-oss",
        "name": c.name,
        "open_seconds": round(open_s, 4),
        "hyperparameters": {k: getattr(c, k) for k in c.__dataclass_fields__ if k != "name"},
        "tokenizer": {"vocab": tok.n_vocab, "special_tokens": len(tok.special_ids),
                      "bos": tok.bos_id, "eos": tok.eos_id, "end_of_generation": sorted(tok.eog_ids)},
        "tensors": len(model.file.tensors),
        "bytes_by_type": {k: {"tensors": n, "bytes": b} for k, (n, b) in lay.by_type.items()},
        "dense_bytes": lay.dense_bytes,
        "expert_bytes": lay.expert_bytes,
        "expert_slot_bytes": lay.expert_slot_bytes,
        "expert_slots_total": lay.n_expert_slots,
        "memory": {"expert_cache_budget": budget, "ctx": ctx, "dense": mem.dense,
                   "expert_cache": mem.expert_cache, "expert_slots": mem.expert_slots,
                   "experts_in_place": mem.experts_in_place, "kv_cache": mem.kv_cache,
                   "scratch": mem.scratch, "total": mem.total},
    }


def cmd_inspect(args: argparse.Namespace) -> int:
    budget = expert_cache_budget(args.expert_cache)
    r = inspect_report(args.model, budget, args.ctx)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    h, m, fb = r["hyperparameters"], r["memory"], format_bytes
    print(f"{r['path']}: {r['architecture']} '{r['name']}' (opened in {r['open_seconds'] * 1000:.0f} ms)")
    print(f"  layers {h['n_layer']}, hidden {h['n_embd']}, heads {h['n_head']} (kv {h['n_head_kv']}, "
          f"dim {h['head_dim']}), experts {h['n_expert']} (top {h['n_expert_used']}, ff {h['n_ff_expert']})")
    print(f"  context {h['context_length']}, sliding window {h['sliding_window']} on even layers, "
          f"rms eps {h['rms_eps']:g}")
    print(f"  rope base {h['rope_base']:g}, yarn factor {h['rope_scaling_factor']:g} "
          f"(original context {h['rope_original_context']}, beta {h['yarn_beta_fast']:g}/"
          f"{h['yarn_beta_slow']:g})")
    t = r["tokenizer"]
    print(f"  vocabulary {t['vocab']} ({t['special_tokens']} special), bos {t['bos']}, eos {t['eos']}, "
          f"end of generation {t['end_of_generation']}")
    print(f"tensors: {r['tensors']}")
    for name, v in r["bytes_by_type"].items():
        print(f"  {name:>6}: {v['tensors']:5d} tensors {fb(v['bytes']):>12}")
    total = r["dense_bytes"] + r["expert_bytes"]
    print(f"  dense {fb(r['dense_bytes'])}, experts {fb(r['expert_bytes'])} "
          f"({100 * r['expert_bytes'] / total:.1f}% of weights)")
    print(f"  one expert's cache slot: {fb(r['expert_slot_bytes'])} "
          f"({r['expert_slots_total']} experts in all)")
    place = "all experts used in place, no copies" if m["experts_in_place"] else \
        f"{m['expert_slots']} of {r['expert_slots_total']} slots"
    print(f"memory for a run with --expert-cache {fb(m['expert_cache_budget'])} at --ctx {m['ctx']}:")
    print(f"  dense weights {fb(m['dense'])} + expert cache {fb(m['expert_cache'])} ({place})")
    print(f"  + kv cache {fb(m['kv_cache'])} + scratch {fb(m['scratch'])} = {fb(m['total'])}")
    if not m["experts_in_place"] and m["expert_slots"] < h["n_expert_used"]:
        print(f"  warning: the budget holds {m['expert_slots']} slots; a token needs "
              f"{h['n_expert_used']} per layer")
    return 0


def _read_prompt(args: argparse.Namespace):
    given = [x for x in (args.prompt, args.prompt_file, args.prompt_ids) if x is not None]
    if len(given) != 1:
        raise UsageError("give exactly one of -p/--prompt, --prompt-file, --prompt-ids")
    if args.prompt_ids is not None:
        try:
            return [int(x) for x in args.prompt_ids.split(",") if x.strip()]
        except ValueError:
            raise UsageError(f"--prompt-ids must be comma-separated integers, got {args.prompt_ids!r}") from None
    if args.prompt_file is not None:
        if args.prompt_file == "-":
            return sys.stdin.read()
        with open(args.prompt_file, encoding="utf-8") as f:
            return f.read()
    return args.prompt


def print_profile(profile: dict, out=sys.stderr) -> None:
    """Per phase: where the forward pass spent its time, then what the
    process did (CPU, memory, faults, reads) and how the experts were routed."""
    phases = {k: v for k, v in profile["phases"].items() if v["split"]["tokens"]}
    print("where the time went (ms per token; 'other' is Python, norms, RoPE, embeddings):", file=out)
    parts = list(next(iter(profile["phases"].values()))["split"]["seconds"])
    print(f"  {'phase':8s} {'tokens':>6s} " + " ".join(f"{p:>11s}" for p in parts) + f" {'total':>9s}", file=out)
    for phase, p in phases.items():
        sp = p["split"]
        ms = sp["ms_per_token"]
        print(f"  {phase:8s} {sp['tokens']:6d} " + " ".join(f"{ms[k]:11.2f}" for k in parts) +
              f" {1000 * sp['total_seconds'] / sp['tokens']:9.2f}", file=out)
    fb = format_bytes
    print(f"  {'phase':8s} {'wall s':>8s} {'user s':>8s} {'sys s':>7s} {'peak RSS':>10s} {'major':>7s} "
          f"{'minor':>8s} {'disk read':>10s}", file=out)
    for phase, p in phases.items():
        print(f"  {phase:8s} {p['wall_seconds']:8.2f} {p['cpu_user_seconds']:8.2f} {p['cpu_system_seconds']:7.2f} "
              f"{fb(p['peak_rss_bytes']):>10s} {p['major_faults']:7d} {p['minor_faults']:8d} "
              f"{fb(p['read_bytes']):>10s}", file=out)
    print("  expert routing:", file=out)
    for phase, p in phases.items():
        r = p["routing"]
        per_layer = r["unique_experts_per_layer"]
        acc = r["prefetch_accuracy"]
        print(f"  {phase:8s} {r['selections']} selections, {r['unique_pairs']} distinct (layer, expert), "
              f"{min(per_layer)}..{max(per_layer)} experts per layer, cache hit rate {100 * r['hit_rate']:.0f}%"
              + (f", prefetch accuracy {100 * acc:.0f}%" if acc is not None else ""), file=out)


def print_cache(st: dict | None, out=sys.stderr) -> None:
    if st is None:
        return
    if st["in_place"]:
        print("experts: used in place from the memory map (the budget covers them all)", file=out)
        return
    line = (f"expert cache: {st['slots']} slots of {format_bytes(st['slot_bytes'])}; hits {st['hits']}, "
            f"misses {st['misses']} (hit rate {100 * st['hit_rate']:.0f}%"
            + (f", Belady's oracle {100 * st['belady_hit_rate']:.0f}%" if "belady_hit_rate" in st else "")
            + f"), evictions {st['evictions']}; read {format_bytes(st['bytes_read'])} "
            f"({format_bytes(st['bytes_read_per_token'])}/token) at {st['read_gb_per_s']:.2f} GB/s per reader; "
            f"stalled {st['stall_seconds']:.2f} s; prefetch accuracy {100 * st['prefetch_accuracy']:.0f}%")
    print(line, file=out)


def cmd_cache_sim(args: argparse.Namespace) -> int:
    from .budget import parse_size
    from .cachesim import POLICIES, read_trace, simulate
    meta, trace = read_trace(args.trace)
    slot = args.slot_bytes or meta.get("slot_bytes")
    if not slot:
        raise UsageError(f"{args.trace} names no slot size: pass --slot-bytes")
    budgets = args.budget or ["1G", "2G", "4G"]
    results = []
    for b in budgets:
        n = parse_size(b, "--budget") // slot
        row = {"budget": b, "slots": n}
        for p in POLICIES:
            row[p] = simulate(trace, n, p)["hit_rate"] if n >= meta.get("k", 1) else None
        results.append(row)
    if args.json:
        print(json.dumps({"trace": args.trace, "requests": len(trace), "slot_bytes": slot, "results": results}))
        return 0
    print(f"{args.trace}: {len(trace)} token-layer requests, slots of {format_bytes(slot)}")
    print(f"{'budget':>8s} {'slots':>6s} " + " ".join(f"{p:>8s}" for p in POLICIES))
    for row in results:
        cells = " ".join(f"{100 * row[p]:7.1f}%" if row[p] is not None else f"{'-':>8s}" for p in POLICIES)
        print(f"{row['budget']:>8s} {row['slots']:6d} {cells}")
    return 0


def _sampling(args: argparse.Namespace):
    from .sampling import SamplingParams
    return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
                          repetition_penalty=args.repetition_penalty, seed=args.seed)


def _load(args: argparse.Namespace):
    from .hub import resolve_model
    from .model import load
    return load(resolve_model(args.model), n_ctx=args.ctx, threads=args.threads,
                expert_cache=args.expert_cache, page_cache=args.page_cache)


def cmd_run(args: argparse.Namespace) -> int:
    prompt = _read_prompt(args)
    # Token ids are a raw prompt by nature; text is a user message unless --raw.
    chat = not args.raw and not isinstance(prompt, list)
    if not chat and args.system is not None:
        raise UsageError("--system needs the chat format (leave out --raw and --prompt-ids)")
    sampling = _sampling(args)
    model = _load(args)
    if args.routing_trace:
        model.transformer.routing = []
    reply = None
    if chat:
        from .repl import ReplyPrinter
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
            [{"role": "user", "content": prompt}]
        stream = model.chat_stream(messages, args.max_tokens, reasoning_effort=args.reasoning_effort,
                                   date=args.date, sampling=sampling, time_budget=args.time_budget,
                                   profile=args.profile or bool(args.profile_out))
        printer = None if args.json else ReplyPrinter(show_reasoning=not args.hide_reasoning)
        for d in stream:
            if printer is not None:
                printer(d)
        if printer is not None:
            printer.finish()
        r, reply = stream.result, stream.reply
    else:
        on_text = None
        if not args.json:
            def on_text(piece: str) -> None:
                sys.stdout.write(piece)
                sys.stdout.flush()
        r = model.generate(prompt, max_tokens=args.max_tokens, time_budget=args.time_budget, on_text=on_text,
                           profile=args.profile or bool(args.profile_out), sampling=sampling)
    if args.routing_trace:
        from .cachesim import write_trace
        c = model.config
        write_trace(args.routing_trace, {"model": model.path, "slot_bytes": model.store.slot_bytes,
                                         "n_layer": c.n_layer, "n_expert": c.n_expert, "k": c.n_expert_used},
                    model.transformer.routing_trace())
    if args.profile_out:
        write_profile(args.profile_out, model, r.profile)
    if args.json:
        d = r.to_dict()
        if not args.profile:
            d.pop("profile", None)
        if reply is not None:
            d["reply"] = {"content": reply.content, "reasoning_content": reply.reasoning_content,
                          "tool_calls": reply.tool_calls}
        print(json.dumps(d, ensure_ascii=False))
    else:
        if args.profile:
            sys.stdout.write("\n")
            print_profile(r.profile)
            print_cache(r.expert_cache)
        sys.stdout.write("\n")
        print(f"[{r.prompt_tokens} prompt tokens in {r.prefill_seconds:.2f} s ({r.prefill_tokens_per_s:.1f} tok/s), "
              f"{r.generated_tokens} generated in {r.decode_seconds:.2f} s ({r.decode_tokens_per_s:.1f} tok/s), "
              f"stop: {r.stop_reason}]", file=sys.stderr)
    return 0


def write_profile(path: str, model, profile: dict) -> None:
    """The profile as JSON for `goosedump plot` and for comparing runs."""
    doc = {**profile, "model": model.path}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    print(f"profile written to {path}", file=sys.stderr)


def cmd_plot(args: argparse.Namespace) -> int:
    from .plot import main as plot_main
    for path in plot_main(args.profile, args.out):
        print(path)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from .repl import ChatSession, run_chat
    sampling = _sampling(args)
    model = _load(args)
    session = ChatSession(model, system=args.system, reasoning_effort=args.reasoning_effort, date=args.date,
                          sampling=sampling, max_tokens=args.max_tokens, show_reasoning=not args.hide_reasoning,
                          profile=args.profile)
    return run_chat(session)


def cmd_bench(args: argparse.Namespace) -> int:
    """Prefill and decode speed, llama-bench style: random token ids (no
    special tokens), greedy decode that runs through end-of-generation."""
    import statistics

    import numpy as np

    if args.prompt_tokens < 1 or args.gen_tokens < 1 or args.reps < 1:
        raise UsageError("-p, -n and -r must be at least 1")
    args.ctx = args.prompt_tokens + args.gen_tokens
    model = _load(args)
    tr = model.transformer
    normal = [i for i in range(model.config.n_vocab) if i not in model.tokenizer.special_ids]
    rng = np.random.default_rng(0)
    runs = []
    profile = args.profile or bool(args.profile_out)
    for rep in range(args.reps + 1):  # the first is a warm-up, not counted
        tr.routing = [] if not model.store.in_place else None   # for Belady's hit rate
        prompt = rng.choice(normal, args.prompt_tokens).tolist()
        r = model.generate(prompt, max_tokens=args.gen_tokens, reuse_cache=False, ignore_eos=True,
                           profile=profile and rep == args.reps)
        if rep:
            runs.append((r.prefill_tokens_per_s, r.decode_tokens_per_s))
            if not args.json:
                print(f"rep {rep}: prefill {runs[-1][0]:.2f} tok/s, decode {runs[-1][1]:.2f} tok/s",
                      file=sys.stderr)
    pre, dec = [x[0] for x in runs], [x[1] for x in runs]
    sd = (lambda v: statistics.stdev(v) if len(v) > 1 else 0.0)
    from . import _kernels
    result = {"model": model.path, "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens,
              "reps": args.reps, "threads": _kernels.num_threads(),
              "prefill_tokens_per_s": statistics.mean(pre), "prefill_tokens_per_s_std": sd(pre),
              "decode_tokens_per_s": statistics.mean(dec), "decode_tokens_per_s_std": sd(dec),
              "runs": [{"prefill_tokens_per_s": p, "decode_tokens_per_s": d} for p, d in runs],
              "expert_cache": r.expert_cache}   # the last repetition's counters
    if tr.routing is not None and "belady_hit_rate" not in r.expert_cache:
        from .cachesim import simulate
        result["expert_cache"]["belady_hit_rate"] = simulate(tr.routing_trace(), model.store.n_slots,
                                                             "belady")["hit_rate"]
    tr.routing = None
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


def cmd_demo(args: argparse.Namespace) -> int:
    from .model import load
    from .synth import write_model
    folder = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "goosedump")
    path = os.path.join(folder, "demo-tiny.gguf")
    if not os.path.exists(path):
        os.makedirs(folder, exist_ok=True)
        print(f"writing a tiny synthetic GPT-OSS model (random weights, real vocabulary) to {path}",
              file=sys.stderr)
        write_model(path, "tiny", seed=0, progress=True)
    model = load(path, threads=args.threads)
    c = model.config
    print(f"model: {c.n_layer} layers, {c.n_expert} experts (top {c.n_expert_used}), hidden {c.n_embd}, "
          f"vocabulary {c.n_vocab}", file=sys.stderr)
    messages = [{"role": "user", "content": "Say hello."}]
    ids = model.render_chat(messages)
    print(f"chat prompt in the harmony format, {len(ids)} tokens:\n{model.tokenizer.decode(ids)}", file=sys.stderr)
    print("answer (random weights, so expect noise): ", end="", file=sys.stderr, flush=True)
    from .repl import ReplyPrinter
    printer = ReplyPrinter()
    stream = model.chat_stream(messages, args.max_tokens)
    for d in stream:
        printer(d)
    printer.finish()
    r = stream.result
    print(file=sys.stderr)
    print(f"[prefill {r.prefill_tokens_per_s:.0f} tok/s, decode {r.decode_tokens_per_s:.0f} tok/s, "
          f"{r.generated_tokens} tokens, stop: {r.stop_reason}]", file=sys.stderr)
    return 0


class UsageError(ValueError):
    pass


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    p = argparse.ArgumentParser(prog="goosedump", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--version", action="version", version=f"goosedump {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("synth", help="write a synthetic GPT-OSS GGUF (real layout and vocabulary, "
                                     "random weights)")
    from .synth import PRESETS
    s.add_argument("--preset", choices=sorted(PRESETS), required=True)
    s.add_argument("--out", required=True, help="output file")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--routing", choices=["uniform", "skewed"], default="uniform",
                   help="skewed: router biases make a few experts popular and reused token after token, "
                        "as in trained models (default: uniform)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_synth)

    i = sub.add_parser("inspect", help="describe a model file and the memory a run needs")
    i.add_argument("model", help="GGUF file")
    _add_expert_cache(i)
    i.add_argument("--ctx", type=int, default=4096, help="context length for the estimate (default 4096)")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.set_defaults(func=cmd_inspect)

    r = sub.add_parser("run", help="answer a prompt (in the chat format; --raw for plain completion)")
    r.add_argument("model", nargs="?", default=None,
                   help="GGUF file, or a Hugging Face repo id REPO[:FILE] (default: $GOOSEDUMP_MODEL, "
                        "else ggml-org/gpt-oss-20b-GGUF)")
    r.add_argument("-p", "--prompt", help="the user's message (with --raw: text to continue, where special "
                                          "tokens such as <|start|> are recognised)")
    r.add_argument("--prompt-file", metavar="FILE", help="read the prompt from a file (- for stdin)")
    r.add_argument("--prompt-ids", metavar="IDS", help="comma-separated token ids, run raw (bypasses the "
                                                       "tokenizer and the chat format)")
    r.add_argument("--raw", action="store_true", help="plain completion of the prompt, no chat format")
    r.add_argument("-n", "--max-tokens", type=int, default=256, help="tokens to generate at most (default 256)")
    r.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="stop generating after this many seconds")
    r.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    _add_chat_options(r)
    _add_sampling(r)
    _add_runtime(r)
    r.add_argument("--routing-trace", metavar="FILE",
                   help="write the (token, layer, experts) routing of the run, for goosedump cache-sim")
    _add_profile(r)
    r.set_defaults(func=cmd_run)

    ch = sub.add_parser("chat", help="chat with the model in the terminal")
    ch.add_argument("model", nargs="?", default=None, help="GGUF file or Hugging Face repo id (as for run)")
    ch.add_argument("-n", "--max-tokens", type=int, default=2048, help="tokens per answer at most (default 2048)")
    _add_chat_options(ch)
    _add_sampling(ch)
    _add_runtime(ch)
    ch.add_argument("--profile", action="store_true", help="after each answer, report where time, memory "
                                                          "and routing went")
    ch.set_defaults(func=cmd_chat)

    b = sub.add_parser("bench", help="prefill and decode tokens/s with their spread (like llama-bench)")
    b.add_argument("model", nargs="?", default=None, help="GGUF file or Hugging Face repo id (as for run)")
    b.add_argument("-p", "--prompt-tokens", type=int, default=512, help="prompt length (default 512)")
    b.add_argument("-n", "--gen-tokens", type=int, default=128, help="tokens to decode (default 128)")
    b.add_argument("-r", "--reps", type=int, default=3, help="repetitions after one warm-up (default 3)")
    b.add_argument("--threads", type=int, default=None, help="threads (default: one per core)")
    _add_expert_cache(b)
    b.add_argument("--json", action="store_true", help="print one JSON object")
    _add_profile(b)
    b.set_defaults(func=cmd_bench)

    pl = sub.add_parser("plot", help="draw a profile (from --profile-out) as PNG pictures")
    pl.add_argument("profile", help="a JSON file written by run/bench --profile-out")
    pl.add_argument("--out", required=True, metavar="DIR", help="folder for the pictures (created if missing)")
    pl.set_defaults(func=cmd_plot)

    cs = sub.add_parser("cache-sim", help="replay a routing trace against each cache policy and budget")
    cs.add_argument("trace", help="a file written by goosedump run --routing-trace")
    cs.add_argument("--budget", action="append", metavar="SIZE",
                    help="expert cache budget (repeatable; default 1G, 2G, 4G)")
    cs.add_argument("--slot-bytes", type=int, default=None, help="bytes per expert slot (default: the trace's)")
    cs.add_argument("--json", action="store_true")
    cs.set_defaults(func=cmd_cache_sim)

    sv = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API (see docs/server.md)")
    add_serve_arguments(sv)
    sv.set_defaults(func=cmd_serve)

    d = sub.add_parser("demo", help="write a tiny synthetic model into the cache and run it end to end")
    d.add_argument("--max-tokens", type=int, default=32)
    d.add_argument("--threads", type=int, default=None)
    d.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (GGUFError, SizeError, FileNotFoundError, UsageError, ValueError, OSError) as e:
        print(f"goosedump: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
