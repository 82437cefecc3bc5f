"""What the command line writes: a reply as it streams (reasoning dimmed on
stderr, the answer on stdout, tool calls named), the profile's tables and the
expert cache's line. Imports neither the CLI nor the REPL, which both use it."""
from __future__ import annotations

import contextlib
import signal
import sys

from .budget import format_bytes
from .reply import ReplyEvent

DIM, RESET = "\x1b[2m", "\x1b[0m"


class ReplyPrinter:
    """Writes reply events as they stream: the answer (content) to `out`;
    reasoning to `err`, dimmed when `err` is a terminal, or not at all when
    hidden; a tool call as `[tool call] NAME(ARGUMENTS)` on `err`."""

    def __init__(self, out=sys.stdout, err=sys.stderr, show_reasoning: bool = True, color: bool | None = None):
        self.out, self.err, self.show_reasoning = out, err, show_reasoning
        self.color = err.isatty() if color is None else color

    def __call__(self, ev: ReplyEvent) -> None:
        kind = ev.item.kind
        if kind == "content":
            if ev.what == "delta":
                self.out.write(ev.text)
                self.out.flush()
            return
        if kind == "reasoning" and not self.show_reasoning:
            return
        if ev.what == "start":
            if kind == "tool_call":
                self.err.write(f"[tool call] {ev.item.name}(")
            else:
                self.err.write(DIM if self.color else "[reasoning] ")
        elif ev.what == "delta":
            self.err.write(ev.text)
        else:
            self.err.write(")\n" if kind == "tool_call" else (RESET if self.color else "") + "\n")
        self.err.flush()

    def finish(self) -> None:
        self.out.flush()
        self.err.flush()


@contextlib.contextmanager
def ctrl_c_cancels(stream):
    """While an answer streams, Ctrl-C asks it to stop before its next token
    (the model's state stays consistent) instead of raising mid-computation."""
    def handler(signum, frame):
        stream.cancel("interrupted")
    old = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def print_reply(stream, printer: ReplyPrinter | None, interruptible: bool = False) -> None:
    """Run a chat stream to its end through the printer (None: silently)."""
    with ctrl_c_cancels(stream) if interruptible else contextlib.nullcontext():
        for ev in stream:
            if printer is not None:
                printer(ev)
    if printer is not None:
        printer.finish()


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
    """The expert cache's counters over the whole generation (prefill and decode)."""
    if st is None:
        return
    if st["in_place"]:
        print("experts: in memory, used in place from the map (the budget covers them all: no cache, no reads)",
              file=out)
        return
    demand = st.get("demand_hit_rate", st["hit_rate"])
    line = (f"expert cache over prefill and decode: {st['slots']} slots of {format_bytes(st['slot_bytes'])}; "
            f"hits {st['hits']}, misses {st['misses']} (hit rate {100 * st['hit_rate']:.0f}%; on demand "
            f"{100 * demand:.0f}%" +
            (f", Belady's oracle on the same requests {100 * st['belady_hit_rate']:.0f}%" if "belady_hit_rate" in st
             else "") +
            f"), evictions {st['evictions']}; read {format_bytes(st['bytes_read'])} "
            f"({format_bytes(st['bytes_read_per_token'])}/token) at {st['read_gb_per_s']:.2f} GB/s per reader; "
            f"stalled {st['stall_seconds']:.2f} s; prefetch: {st['prefetched']} read ahead, "
            f"{st['prefetch_used']} used, {st.get('prefetch_wasted', 0)} wasted (accuracy "
            f"{100 * st['prefetch_accuracy']:.0f}%)")
    print(line, file=out)


def duration(seconds: float) -> str:
    """A duration as ollama prints one (Go's): 1.234567s, 12.345ms."""
    return f"{seconds:.6g}s" if seconds >= 1 else f"{seconds * 1e3:.6g}ms"


def print_timings(r, total: float, load: float = 0.0, out=sys.stderr) -> None:
    """An answer's counts and timings as ollama's --verbose prints them (the
    prompt's count and rate: the tokens the prefill computed, not those
    from a cache)."""
    computed = r.prompt_tokens - r.cached_tokens
    rows = [("total duration", duration(total)), ("load duration", duration(load)),
            ("prompt eval count", f"{computed} token(s)"), ("prompt eval duration", duration(r.prefill_seconds)),
            ("prompt eval rate", f"{r.prefill_tokens_per_s:.2f} tokens/s"),
            ("eval count", f"{r.generated_tokens} token(s)"), ("eval duration", duration(r.decode_seconds)),
            ("eval rate", f"{r.decode_tokens_per_s:.2f} tokens/s")]
    for name, value in rows:
        print(f"{name + ':':22s}{value}", file=out)
