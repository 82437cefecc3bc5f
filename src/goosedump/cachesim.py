"""Replay routing traces against expert cache policies, without the model.

A trace is the experts each token chose at each layer, in the order the
engine asks for them: (token, layer, experts). The cache holds `slots`
experts; a request for a layer's experts needs them all resident at once.
Policies: LRU; LFU (use counts, oldest first among equals) and LFU with
decay (counts halve every `slots` requests, so old popularity fades: what the
store runs, chosen on such traces); and Belady's oracle (evict the expert used
furthest in the future: the best any policy could do on that trace).
"""
from __future__ import annotations

import bisect
import json
import os
from collections import OrderedDict, defaultdict
from typing import Iterable, Sequence

Trace = list[tuple[int, int, tuple[int, ...]]]   # (token, layer, experts)
POLICIES = ("lru", "lfu", "lfu-decay", "belady")


TRACE_FORM = ("a trace is what `goosedump run MODEL --routing-trace FILE` writes: a first line of metadata (JSON), "
              "then one JSON line {\"token\": T, \"layer\": L, \"experts\": [...]} per token and layer")


def read_trace(path: str) -> tuple[dict, Trace]:
    """(metadata, rows) of a trace file: a first line of metadata (model,
    slot_bytes, ...), then JSON lines {"token": t, "layer": l, "experts": [...]},
    as `goosedump run --routing-trace` writes them."""
    out: Trace = []
    meta: dict = {}
    if os.path.exists(path) and not os.path.isfile(path):
        raise ValueError(f"{path} is not a file; {TRACE_FORM}")
    with open(path, "rb") as f:
        head = f.read(4)
    if head == b"GGUF":
        raise ValueError(f"{path} is a GGUF model file, not a routing trace; {TRACE_FORM}")
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                    if n == 1 and isinstance(r, dict) and "token" not in r:
                        meta = r
                        continue
                    out.append((int(r["token"]), int(r["layer"]), tuple(int(e) for e in r["experts"])))
                except (ValueError, KeyError, TypeError) as e:
                    raise ValueError(f"{path}:{n}: not a routing trace line ({e}): {line[:80]!r}; "
                                     f"{TRACE_FORM}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a routing trace (not text); {TRACE_FORM}") from None
    if not out:
        raise ValueError(f"{path} holds no routing requests; {TRACE_FORM}")
    # ids within the shape the metadata gives (where it gives one), never negative
    n_layer, n_expert = meta.get("n_layer"), meta.get("n_expert")
    for i, (t, layer, experts) in enumerate(out):
        bad = (layer < 0 or (isinstance(n_layer, int) and layer >= n_layer) or
               any(e < 0 or (isinstance(n_expert, int) and e >= n_expert) for e in experts))
        if bad:
            shape = (f"the trace's {n_layer} layers of {n_expert} experts" if isinstance(n_layer, int) and
                     isinstance(n_expert, int) else "ids from 0")
            raise ValueError(f"{path}: request {i + 1} (token {t}) names layer {layer}, experts {list(experts)}: "
                             f"outside {shape}")
    return meta, out


def write_trace(path: str, meta: dict, rows: Iterable[tuple[int, int, Sequence[int]]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(meta) + "\n")
        for t, layer, experts in rows:
            f.write(json.dumps({"token": t, "layer": layer, "experts": [int(e) for e in experts]}) + "\n")


def simulate(trace: Trace, slots: int, policy: str, pinned: bool = True) -> dict:
    """Hits and misses of one policy on the trace with `slots` expert slots.
    pinned: a request's experts must all be resident at once (a token's, as
    the forward pass asks for them); else (the store's own requests: a
    prompt's layer at a time, streamed through the slots) an expert served
    may give its slot to the rest of its request."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    need = max((len(set(x)) for _, _, x in trace), default=0)
    if pinned and slots < need:
        raise ValueError(f"{slots} slots cannot hold the {need} experts one request needs")
    if slots < 1:
        raise ValueError(f"an expert cache needs at least one slot, got {slots}")
    # One entry per (layer, expert) asked for, tagged with its request's number.
    entries = [((layer, e), r) for r, (_, layer, experts) in enumerate(trace) for e in dict.fromkeys(experts)]
    positions: defaultdict[tuple[int, int], list[int]] = defaultdict(list)
    for n, (key, _) in enumerate(entries):
        positions[key].append(n)

    def next_use(key: tuple[int, int], n: int) -> float:
        pos = positions[key]
        i = bisect.bisect_right(pos, n)
        return pos[i] if i < len(pos) else float("inf")

    resident: OrderedDict[tuple[int, int], None] = OrderedDict()   # least recently used first
    freq: defaultdict[tuple[int, int], float] = defaultdict(float)
    seen: dict[tuple[int, int], int] = {}   # entry number of the last count update
    half_life = float(slots)

    def decayed(k: tuple[int, int], n: int) -> float:
        return freq[k] * 0.5 ** ((n - seen.get(k, n)) / half_life)
    current: set[tuple[int, int]] = set()   # the request being served: must stay resident
    hits = misses = 0
    for n, (key, r) in enumerate(entries):
        if n == 0 or entries[n - 1][1] != r:
            current = set()
        current.add(key)
        if policy == "lfu-decay":
            freq[key] = decayed(key, n) + 1
            seen[key] = n
        else:
            freq[key] += 1
        if key in resident:
            hits += 1
            resident.move_to_end(key)
            continue
        misses += 1
        if len(resident) >= slots:
            candidates = [k for k in resident if k not in current] or list(resident)
            if policy == "lru":
                victim = candidates[0]
            elif policy == "lfu":   # least used; min keeps the oldest among equals
                victim = min(candidates, key=lambda k: freq[k])
            elif policy == "lfu-decay":
                victim = min(candidates, key=lambda k: decayed(k, n))
            else:                   # Belady: used furthest in the future
                victim = max(candidates, key=lambda k: next_use(k, n))
            del resident[victim]
        resident[key] = None
    total = hits + misses
    return {"policy": policy, "slots": slots, "hits": hits, "misses": misses,
            "hit_rate": hits / total if total else 0.0}


def belady_hit_rate(trace: Trace, slots: int, pinned: bool = True) -> float:
    """The best hit rate any eviction policy could reach on trace with slots."""
    return simulate(trace, slots, "belady", pinned)["hit_rate"]
