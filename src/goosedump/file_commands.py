"""The subcommands about files and traces (goosedump.parser builds the parser,
goosedump.cli calls these; commands.py holds those that run the model): synth, inspect,
pull, list, plot and cache-sim."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .budget import expert_cache_budget, format_bytes
from .arguments import UsageError, check_ctx, context_for, model_arg


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
    if not args.out or os.path.isdir(args.out):
        raise UsageError(f"--out {args.out!r}: name the file to write (a .gguf path), not a folder")
    if args.seed < 0:
        raise UsageError(f"--seed must be 0 or more, got {args.seed}")
    folder = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(folder):
        raise UsageError(f"--out {args.out}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"--out {args.out}: the folder {folder} is not writable")
    import shutil
    from .synth import planned_bytes
    need, free = planned_bytes(args.preset, args.recipe, args.routing), shutil.disk_usage(folder).free
    if need + (64 << 20) > free:
        raise UsageError(f"--out {args.out}: the {args.preset} preset in the {args.recipe} recipe needs about "
                         f"{format_bytes(need)}, and {folder} has {format_bytes(free)} free")
    paths: list[str] = []
    size = write_model(args.out, PRESETS[args.preset], seed=args.seed, progress=not args.quiet,
                       routing=args.routing, recipe=args.recipe, split_max_size=split, paths_out=paths)
    if not args.quiet:          # (a split set: its parts, named after --out)
        what = f"{paths[0]} .. {os.path.basename(paths[-1])}" if len(paths) > 1 else paths[0]
        print(f"wrote {what} ({format_bytes(size)}) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


def inspect_report(path: str, budget: int | str, ctx: int | None) -> dict:
    from .hub import resolve_model
    from .budget import AUTO
    from .layout import auto_expert_budget, estimate_memory
    from .model import DEFAULT_CTX, load
    path = resolve_model(path)
    check_ctx(ctx)
    t0 = time.perf_counter()
    from .options import Options
    model = load(path, options=Options())      # (the layout alone: no setting of the environment's is read)
    open_s = time.perf_counter() - t0
    c, lay = model.config, model.layout
    # (as run reads -c; unsaid: run's default, never past the model's own)
    ctx = min(DEFAULT_CTX, c.context_length) if ctx is None else context_for(ctx, c.context_length)
    note = None
    if budget == AUTO:
        auto = auto_expert_budget(c, lay, ctx, model.options.prefill_tokens)
        budget, note = auto.budget, auto.note
    mem = estimate_memory(c, lay, budget, ctx, model.options.prefill_tokens)
    tok = model.tokenizer
    from . import _kernels
    from .machine import amx_in_use, avx512_without_vbmi, cpu_description
    return {
        "path": path,
        "cpu": cpu_description(), "kernels": _kernels.active_impl(),
        "avx2_halves": _kernels.cpu_splits_256() and _kernels.active_impl() in ("avx2", "avx512"),
        "amx": amx_in_use(), "avx512_without_vbmi": avx512_without_vbmi(),
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
        "memory": {"expert_cache_budget": budget, "auto": note, "ctx": ctx, "dense": mem.dense,
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
    r = inspect_report(model_arg(args), budget, args.ctx)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    h, m, fb = r["hyperparameters"], r["memory"], format_bytes
    from .gguf import printable     # (the name is the file's: no control characters reach the terminal)
    print(f"{printable(r['path'])}: {r['architecture']} '{printable(str(r['name']), 200)}' "
          f"(opened in {r['open_seconds'] * 1000:.0f} ms)")
    print(f"  layers {h['n_layer']}, hidden {h['n_embd']}, heads {h['n_head']} (kv {h['n_head_kv']}, "
          f"dim {h['head_dim']}), experts {h['n_expert']} (top {h['n_expert_used']}, ff {h['n_ff_expert']})")
    print(f"  context {h['context_length']}, sliding window {h['sliding_window']} on even layers, "
          f"rms eps {h['rms_eps']:g}")
    print(f"  rope base {h['rope_base']:g}, yarn factor {h['rope_scaling_factor']:g} "
          f"(original context {h['rope_original_context']}, beta {h['yarn_beta_fast']:g}/"
          f"{h['yarn_beta_slow']:g})")
    halves = ", in 128-bit halves (this core splits 256-bit operations)" if r["avx2_halves"] else ""
    print(f"  kernels: {r['kernels']} on {r['cpu']}{halves} (GOOSEDUMP_ISA=generic|avx2|avx512|neon forces a path)")
    if r["avx512_without_vbmi"]:
        from .machine import NO_VBMI_NOTE
        print(f"  {NO_VBMI_NOTE}")
    if r["amx"]:
        from .machine import AMX_NOTE
        print(f"  {AMX_NOTE}")
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
    chosen = f"auto ({fb(m['expert_cache_budget'])})" if m["auto"] else fb(m["expert_cache_budget"])
    print(f"memory for a run with --expert-cache {chosen} at --ctx {m['ctx']}:")
    if m["auto"]:
        print(f"  ({m['auto']})")
    print(f"  dense weights {fb(m['dense'])} + expert cache {fb(m['expert_cache'])} ({place})")
    print(f"  + kv cache {fb(m['kv_cache'])} + scratch {fb(m['scratch'])} = {fb(m['total'])}")
    if not m["experts_in_place"] and m["expert_slots"] < h["n_expert_used"]:
        print(f"  warning: the budget holds {m['expert_slots']} slots; a token needs "
              f"{h['n_expert_used']} per layer")
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from .gguf import GGUFFile
    from .hub import default_name, resolve_model
    path = resolve_model(model_arg(args))
    f = GGUFFile(path)
    for part in f.parts:
        print(part.path)
    print(f"{model_arg(args) or default_name()}: {len(f.parts)} file{'s' if len(f.parts) > 1 else ''}, "
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
    out = args.out or os.path.dirname(os.path.abspath(args.profile))
    for path in plot_main(args.profile, out):
        print(path)
    return 0


def cmd_cache_sim(args: argparse.Namespace) -> int:
    from .budget import parse_size
    from .cachesim import POLICIES, read_trace, simulate
    if args.slot_bytes is not None and args.slot_bytes < 1:
        raise UsageError(f"--slot-bytes must be at least 1, got {args.slot_bytes}")
    meta, trace = read_trace(args.trace)
    slot = args.slot_bytes or meta.get("slot_bytes")
    if not slot:
        raise UsageError(f"{args.trace} names no slot size: pass --slot-bytes")
    if not isinstance(slot, int) or slot < 1:
        raise UsageError(f"{args.trace}: its slot_bytes is {slot!r}, expected a positive integer (or pass --slot-bytes)")
    if args.budget:
        budgets = [(b, parse_size(b, "--budget") // slot) for b in args.budget]
    else:    # 1/8, 1/4 and 1/2 of the trace model's experts (of those seen, without its shape)
        total = meta.get("n_layer", 0) * meta.get("n_expert", 0) or len({(l, e) for _, l, x in trace for e in x})
        budgets = [(format_bytes(total // d * slot), total // d) for d in (8, 4, 2)]
    results = []
    for b, n in budgets:
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
