"""Pictures of a profile: expert heatmap, decode timeline, expert cache hit rate.

A profile is the JSON file `goosedump run --profile-out` writes (version 1):

    {
      "version": 1,
      "model": str,                  # the GGUF path; plots show its basename
      "n_layer": int, "n_expert": int, "n_expert_used": int,
      "phases": {
        "prefill": PHASE,
        "decode": PHASE
      },
      "routing_counts": [[int] * n_expert] * n_layer,   # selections over the whole run
      "decode_tokens": [TOKEN, ...]  # one per generated token, in order
    }

    PHASE = goosedump.profiling.phase_stats(...) plus "tokens" and "routing":
      {"wall_seconds": float, "cpu_user_seconds": float, "cpu_system_seconds": float,
       "peak_rss_bytes": int,        # process-wide high-water mark at the phase's end
       "rss_bytes": int, "major_faults": int, "minor_faults": int,
       "read_bytes": int,            # from storage (page-cache misses)
       "read_chars": int,            # through read(), page-cache hits included
       "io_available": bool,         # optional; false: the two reads are 0, not measured
       "tokens": int,
       "routing": {"selections": int, "unique_pairs": int,
                   "unique_experts_per_layer": [int] * n_layer},
       "expert_cache": {...} | null} # the store's counters; null: experts in memory

    TOKEN = {"index": int, "token_id": int,
             "seconds": float,           # the whole token
             "stall_seconds": float,     # waiting for expert reads
             "compute_seconds": float,   # seconds - stall_seconds
             "hits": int, "misses": int} # expert cache; both 0 when experts are in memory

`validate_profile` checks this and names the first key that is wrong;
`figures` draws (for tests and callers that want the Figures), `plot_profile`
saves PNGs, `main` does both from a file. matplotlib is imported inside the
functions so that importing goosedump does not pay for it.
"""
from __future__ import annotations

import json
import math
import os
import sys

import numpy as np

VERSION = 1
PHASE_INTS = ("peak_rss_bytes", "rss_bytes", "major_faults", "minor_faults",
              "read_bytes", "read_chars", "tokens")
PHASE_FLOATS = ("wall_seconds", "cpu_user_seconds", "cpu_system_seconds")
TOKEN_INTS = ("index", "token_id", "hits", "misses")
TOKEN_FLOATS = ("seconds", "compute_seconds", "stall_seconds")
FILES = {"expert_heatmap": "expert_heatmap.png",
         "decode_timeline": "decode_timeline.png",
         "cache_hit_rate": "cache_hit_rate.png"}


def _get(d: dict, key: str, where: str):
    if not isinstance(d, dict):
        raise ValueError(f"{where or 'profile'}: expected an object, got {type(d).__name__}")
    if key not in d:
        raise ValueError(f"{where + '.' if where else ''}{key}: missing")
    return d[key]


def _int(d: dict, key: str, where: str, lo: int = 0) -> int:
    v = _get(d, key, where)
    # bool is an int in Python, but true is not a count.
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ValueError(f"{where + '.' if where else ''}{key}: expected an integer >= {lo}, got {v!r}")
    return v


def _float(d: dict, key: str, where: str) -> float:
    v = _get(d, key, where)
    # Differences of clocks can come out a hair below zero; NaN never should.
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < -1e-9:
        raise ValueError(f"{where}.{key}: expected a finite number >= 0, got {v!r}")
    return float(v)


def validate_profile(d: dict) -> None:
    """Raise ValueError naming the first missing key or wrong value of a profile."""
    version = _get(d, "version", "")
    if version != VERSION:
        raise ValueError(f"version: expected {VERSION}, got {version!r}")
    if not isinstance(_get(d, "model", ""), str):
        raise ValueError(f"model: expected a string, got {d['model']!r}")
    n_layer = _int(d, "n_layer", "", lo=1)
    n_expert = _int(d, "n_expert", "", lo=1)
    used = _int(d, "n_expert_used", "", lo=1)
    if used > n_expert:
        raise ValueError(f"n_expert_used: {used} is more than n_expert={n_expert}")

    phases = _get(d, "phases", "")
    for name in ("prefill", "decode"):
        where = f"phases.{name}"
        p = _get(phases, name, "phases")
        for k in PHASE_INTS:
            _int(p, k, where)
        for k in PHASE_FLOATS:
            _float(p, k, where)
        if "io_available" in p and not isinstance(p["io_available"], bool):
            raise ValueError(f"{where}.io_available: expected true or false, got {p['io_available']!r}")
        r = _get(p, "routing", where)
        _int(r, "selections", f"{where}.routing")
        _int(r, "unique_pairs", f"{where}.routing")
        per_layer = _get(r, "unique_experts_per_layer", f"{where}.routing")
        if (not isinstance(per_layer, list) or len(per_layer) != n_layer
                or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= n_expert for x in per_layer)):
            raise ValueError(f"{where}.routing.unique_experts_per_layer: expected {n_layer} integers "
                             f"in [0, {n_expert}]")
        cache = _get(p, "expert_cache", where)
        if cache is not None and not isinstance(cache, dict):
            raise ValueError(f"{where}.expert_cache: expected an object or null, got {cache!r}")

    counts = _get(d, "routing_counts", "")
    if (not isinstance(counts, list) or len(counts) != n_layer
            or not all(isinstance(row, list) and len(row) == n_expert for row in counts)):
        raise ValueError(f"routing_counts: expected {n_layer} rows (layers) of {n_expert} counts (experts)")
    try:
        c = np.array(counts)
    except ValueError:
        c = None
    if c is None or c.dtype.kind not in "iu" or (c.size and c.min() < 0):
        raise ValueError("routing_counts: expected integers >= 0")

    tokens = _get(d, "decode_tokens", "")
    if not isinstance(tokens, list):
        raise ValueError(f"decode_tokens: expected a list, got {type(tokens).__name__}")
    for i, t in enumerate(tokens):
        where = f"decode_tokens[{i}]"
        for k in TOKEN_INTS:
            _int(t, k, where)
        s, compute, stall = (_float(t, k, where) for k in TOKEN_FLOATS)
        # compute is defined as seconds - stall; a mismatch means the writer is wrong.
        if abs(compute + stall - s) > 1e-6 * max(1.0, s):
            raise ValueError(f"{where}: compute_seconds + stall_seconds = {compute + stall!r}, "
                             f"not seconds = {s!r}")


def _token_columns(profile: dict) -> dict[str, np.ndarray]:
    """decode_tokens as one array per field."""
    toks = profile["decode_tokens"]
    return {k: np.array([t[k] for t in toks], dtype=np.float64 if k in TOKEN_FLOATS else np.int64)
            for k in TOKEN_INTS + TOKEN_FLOATS}


def _heatmap(fig, profile: dict) -> None:
    ax = fig.add_subplot()
    counts = np.array(profile["routing_counts"], dtype=np.int64)
    # nearest: one cell per (layer, expert), no smoothing between experts that have nothing in common.
    # the colour scale starts at zero: an expert never chosen is the darkest cell
    im = ax.imshow(counts, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0)
    fig.colorbar(im, ax=ax, label="selections")
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("expert")
    ax.set_ylabel("layer")
    ax.set_title(f"expert selections: {os.path.basename(profile['model'])} "
                 f"({int(counts.sum())} in all, top-{profile['n_expert_used']})")


def _timeline(fig, profile: dict) -> None:
    ax = fig.add_subplot()
    col = _token_columns(profile)
    x = col["index"]
    compute, stall = col["compute_seconds"] * 1e3, col["stall_seconds"] * 1e3
    # Bars touch (width 1, no edges) so a thousand tokens still read as a profile.
    ax.bar(x, compute, width=1.0, linewidth=0, color="tab:blue", label="compute")
    ax.bar(x, stall, width=1.0, linewidth=0, bottom=compute, color="tab:red", label="read stall")
    ax.set_xlabel("decode token")
    ax.set_ylabel("ms")
    total = col["seconds"].sum()
    share = col["stall_seconds"].sum() / total if total > 0 else 0.0
    ax.set_title(f"decode: {len(x)} tokens, {total:.2f} s, {share:.0%} waiting for expert reads")
    # beside the plot, where it covers no bar
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def _hit_rate(fig, profile: dict) -> None:
    ax = fig.add_subplot()
    col = _token_columns(profile)
    x = col["index"]
    hits, asked = col["hits"], col["hits"] + col["misses"]
    if asked.sum() == 0:
        # No cache was asked: experts are in memory, every lookup is a hit.
        ax.plot(x, np.ones(len(x)), color="tab:green", label="experts in memory")
        ax.text(0.5, 0.5, "experts in memory", transform=ax.transAxes, ha="center", va="center")
        ax.set_title("expert cache: none, experts in memory (no reads)")
    else:
        # A token that asked nothing has no rate: NaN leaves a gap in the line.
        per_token = np.divide(hits, asked, out=np.full(len(x), np.nan), where=asked > 0)
        cum_hits, cum_asked = np.cumsum(hits), np.cumsum(asked)
        cumulative = np.divide(cum_hits, cum_asked, out=np.full(len(x), np.nan), where=cum_asked > 0)
        ax.plot(x, per_token, color="tab:blue", linewidth=0.8, label="per token")
        ax.plot(x, cumulative, color="tab:orange", linewidth=2, label="cumulative")
        ax.set_title(f"expert cache during decode: {int(hits.sum())} hits, {int(asked.sum() - hits.sum())} "
                     f"misses, hit rate {hits.sum() / asked.sum():.1%}")
    if len(x):
        ax.legend(loc="lower right")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("decode token")
    ax.set_ylabel("hit rate")


def figures(profile: dict) -> dict:
    """{name: matplotlib Figure} for a validated profile, drawn but not saved."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = {}
    # Figures of their own (not pyplot's): nothing global, nothing to close.
    for name, draw, size in (("expert_heatmap", _heatmap, (10, 6)),
                             ("decode_timeline", _timeline, (10, 4)),
                             ("cache_hit_rate", _hit_rate, (10, 4))):
        fig = Figure(figsize=size, dpi=100, layout="constrained")
        FigureCanvasAgg(fig)
        draw(fig, profile)
        out[name] = fig
    return out


def plot_profile(profile: dict, out_dir) -> list[str]:
    """Write expert_heatmap.png, decode_timeline.png and cache_hit_rate.png into
    out_dir (which must exist); their paths."""
    validate_profile(profile)
    paths = []
    for name, fig in figures(profile).items():
        path = os.path.join(os.fspath(out_dir), FILES[name])
        fig.savefig(path, format="png")
        paths.append(path)
    return paths


def main(profile_path, out_dir) -> list[str]:
    """Read a profile file, check it, draw its pictures into out_dir (made if missing)."""
    path = os.fspath(profile_path)
    if os.path.exists(path) and not os.path.isfile(path):
        raise ValueError(f"{path}: not a file (a profile from --profile-out)")
    try:
        with open(path, encoding="utf-8") as f:
            profile = json.load(f)
        validate_profile(profile)
    except ValueError as e:   # json's errors are ValueErrors too
        raise ValueError(f"{path}: not a goosedump profile: {e}") from None
    out = os.fspath(out_dir)
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--out {out}: not a folder (the pictures' folder; it is made if missing)")
    os.makedirs(out, exist_ok=True)
    return plot_profile(profile, out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m goosedump.plot PROFILE.json OUT_DIR")
    try:
        for p in main(sys.argv[1], sys.argv[2]):
            print(p)
    except (OSError, ValueError) as e:
        sys.exit(f"error: {e}")
