"""The subcommands (goosedump.cli builds the parser and calls these): each takes
the parsed arguments and returns the exit status; errors are raised as
exceptions that cli.main turns into one line."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .budget import expert_cache_budget, format_bytes
from .terminal import ReplyPrinter, print_cache, print_profile, print_reply


class UsageError(ValueError):
    pass


def load_model(args: argparse.Namespace):
    """The model the arguments name, with the runtime options they give."""
    from .hub import resolve_model
    from .model import load
    from .options import Options
    options = Options.from_env(expert_cache=args.expert_cache, threads=args.threads,
                               page_cache=getattr(args, "page_cache", False))
    return load(resolve_model(args.model), n_ctx=args.ctx, options=options)


def sampling_from(args: argparse.Namespace):
    from .sampling import SamplingParams
    return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
                          repetition_penalty=args.repetition_penalty, seed=args.seed)


def write_profile(path: str, model, profile: dict) -> None:
    """The profile as JSON for `goosedump plot` and for comparing runs."""
    doc = {**profile, "model": model.path}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    print(f"profile written to {path}", file=sys.stderr)


# --- run -------------------------------------------------------------------------

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


def cmd_run(args: argparse.Namespace) -> int:
    prompt = _read_prompt(args)
    # Token ids are a raw prompt by nature; text is a user message unless --raw.
    chat = not args.raw and not isinstance(prompt, list)
    if not chat and args.system is not None:
        raise UsageError("--system needs the chat format (leave out --raw and --prompt-ids)")
    sampling = sampling_from(args)
    model = load_model(args)
    profile = args.profile or bool(args.profile_out)
    trace = bool(args.routing_trace)
    reply = None
    if chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
            [{"role": "user", "content": prompt}]
        stream = model.chat_stream(messages, args.max_tokens, reasoning_effort=args.reasoning_effort,
                                   date=args.date, sampling=sampling, time_budget=args.time_budget,
                                   profile=profile, record_routing=trace)
        print_reply(stream, None if args.json else ReplyPrinter(show_reasoning=not args.hide_reasoning))
        r, reply = stream.result, stream.reply
    else:
        on_text = None
        if not args.json:
            def on_text(piece: str) -> None:
                sys.stdout.write(piece)
                sys.stdout.flush()
        r = model.generate(prompt, max_tokens=args.max_tokens, time_budget=args.time_budget, on_text=on_text,
                           profile=profile, sampling=sampling, record_routing=trace)
    if trace:
        from .cachesim import write_trace
        c = model.config
        write_trace(args.routing_trace, {"model": model.path, "slot_bytes": model.store.slot_bytes,
                                         "n_layer": c.n_layer, "n_expert": c.n_expert, "k": c.n_expert_used},
                    r.routing)
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


def cmd_chat(args: argparse.Namespace) -> int:
    from .repl import ChatSession, run_chat
    sampling = sampling_from(args)
    model = load_model(args)
    session = ChatSession(model, system=args.system, reasoning_effort=args.reasoning_effort, date=args.date,
                          sampling=sampling, max_tokens=args.max_tokens, show_reasoning=not args.hide_reasoning,
                          profile=args.profile)
    return run_chat(session)


def cmd_serve(args: argparse.Namespace) -> int:
    from .server import serve   # FastAPI and uvicorn load only for serve
    return serve(args)


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
    stream = model.chat_stream(messages, args.max_tokens)
    print_reply(stream, ReplyPrinter())
    r = stream.result
    print(file=sys.stderr)
    print(f"[prefill {r.prefill_tokens_per_s:.0f} tok/s, decode {r.decode_tokens_per_s:.0f} tok/s, "
          f"{r.generated_tokens} tokens, stop: {r.stop_reason}]", file=sys.stderr)
    return 0


# --- files ---------------------------------------------------------------------------

def split_size(text: str) -> int:
    """Bytes of "500M" / "2G", decimal as llama-gguf-split's --split-max-size."""
    import re
    m = re.fullmatch(r"\s*(\d+)\s*([MG])\s*", text or "")
    if not m or int(m.group(1)) == 0:
        raise UsageError(f"--split-max-size={text!r} is not a size: expected a positive integer followed by M or G "
                         f"(for example 500M or 2G)")
    return int(m.group(1)) * (10 ** 6 if m.group(2) == "M" else 10 ** 9)


def cmd_synth(args: argparse.Namespace) -> int:
    from .synth import PRESETS, write_model
    t0 = time.perf_counter()
    split = split_size(args.split_max_size) if args.split_max_size is not None else None
    folder = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(folder):
        raise UsageError(f"--out {args.out}: the folder {folder} does not exist")
    size = write_model(args.out, PRESETS[args.preset], seed=args.seed, progress=not args.quiet,
                       routing=args.routing, recipe=args.recipe, split_max_size=split)
    if not args.quiet:
        print(f"wrote {args.out} ({format_bytes(size)}) in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr)
    return 0


def inspect_report(path: str, budget: int, ctx: int) -> dict:
    from .hub import resolve_model
    from .layout import estimate_memory
    from .model import load
    path = resolve_model(path)
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
        "files": [{"path": part.path, "bytes": part.size,
                   "tensors": sum(1 for t in model.file.tensors.values() if t.part == k)}
                  for k, part in enumerate(model.file.parts)],
        "recipe": recipe_of(model.file),
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


def recipe_of(f) -> str | None:
    """The recipe (goosedump.recipes) whose types the file's tensors have, if any."""
    from .recipes import RECIPES, tensor_type
    c = f.tensors
    try:
        n_layer = 1 + max(int(n.split(".")[1]) for n in c if n.startswith("blk."))
        n_expert = c["blk.0.ffn_gate_exps.weight"].dims[2]
        n_gqa = c["blk.0.attn_q.weight"].dims[1] // c["blk.0.attn_k.weight"].dims[1]
    except (KeyError, ValueError):
        return None
    for name in RECIPES:
        if all(tensor_type(name, t.name, t.dims, n_layer, n_expert, n_gqa) in (None, t.type) for t in c.values()):
            return name
    return None


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
    files = r["files"]
    if len(files) > 1:
        print(f"a split set of {len(files)} parts:")
        for k, part in enumerate(files):
            print(f"  {k + 1}. {part['path']} ({fb(part['bytes'])}, {part['tensors']} tensors)")
    print(f"tensors: {r['tensors']}" + (f" (the {r['recipe']} recipe's types)" if r["recipe"] else ""))
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


def cmd_pull(args: argparse.Namespace) -> int:
    from .gguf import GGUFFile
    from .hub import resolve_model
    path = resolve_model(args.model)
    f = GGUFFile(path)
    for part in f.parts:
        print(part.path)
    print(f"{args.model}: {len(f.parts)} file{'s' if len(f.parts) > 1 else ''}, "
          f"{format_bytes(sum(p.size for p in f.parts))}", file=sys.stderr)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from .hub import cached_models
    models = cached_models()
    if args.json:
        print(json.dumps({"models": models}))
        return 0
    if not models:
        from huggingface_hub import constants
        print(f"no GGUF models in the Hugging Face cache ({constants.HF_HUB_CACHE}); `goosedump pull NAME` "
              f"downloads one", file=sys.stderr)
        return 0
    width = max(len(m["name"]) for m in models)
    print(f"{'NAME':{width}s} {'SIZE':>10s} {'PARTS':>5s}  FILE")
    for m in models:
        print(f"{m['name']:{width}s} {format_bytes(m['bytes']):>10s} {m['parts']:5d}  {m['file']}"
              + ("" if m["complete"] else "  (incomplete: `goosedump pull` fetches the rest)"))
    return 0


# --- profiles and traces --------------------------------------------------------------

def cmd_plot(args: argparse.Namespace) -> int:
    from .plot import main as plot_main
    for path in plot_main(args.profile, args.out):
        print(path)
    return 0


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
