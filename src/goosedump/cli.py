"""The goosedump command line."""
from __future__ import annotations

import argparse
import json
import sys
import time

from .budget import ENV_EXPERT_CACHE, SizeError, expert_cache_budget, format_bytes
from .gguf import GGUFError


def _add_expert_cache(p: argparse.ArgumentParser) -> None:
    p.add_argument("--expert-cache", metavar="SIZE", default=None,
                   help=f"expert cache budget, an integer followed by M or G, 1M..16G "
                        f"(default: ${ENV_EXPERT_CACHE}, else 2G)")


def cmd_synth(args: argparse.Namespace) -> int:
    from .synth import PRESETS, write_model
    t0 = time.perf_counter()
    size = write_model(args.out, PRESETS[args.preset], seed=args.seed, progress=not args.quiet)
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
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_synth)

    i = sub.add_parser("inspect", help="describe a model file and the memory a run needs")
    i.add_argument("model", help="GGUF file")
    _add_expert_cache(i)
    i.add_argument("--ctx", type=int, default=4096, help="context length for the estimate (default 4096)")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.set_defaults(func=cmd_inspect)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (GGUFError, SizeError, FileNotFoundError) as e:
        print(f"goosedump: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
