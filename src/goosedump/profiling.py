"""Where a run's time, memory and routing go: process samples and their differences.

A `ProcessSample` is what the operating system says about this process at one
instant; two of them bracket a phase (prefill, decode) and `phase_stats` turns
the pair into the numbers a profile records. `routing_stats` summarises the
experts the router chose, for the profile and its heatmap (see goosedump.plot).
"""
from __future__ import annotations

import os
import resource
import sys
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import psutil

from .probe import PARTS, Probe


@dataclass(frozen=True)
class ProcessSample:
    wall: float          # time.perf_counter(), seconds
    cpu_user: float      # seconds, all threads
    cpu_system: float    # seconds, all threads
    rss: int             # bytes resident now
    peak_rss: int        # bytes, the process's high-water mark since it started
    major_faults: int    # page faults that waited for storage
    minor_faults: int    # page faults served from memory (first touch, page cache)
    read_bytes: int      # bytes the process made the kernel fetch from storage
    read_chars: int      # bytes returned by read syscalls, page-cache hits included
    io_available: bool   # False: read_bytes and read_chars are 0 because the OS would not say


_process: psutil.Process | None = None


def _proc() -> psutil.Process:
    # One handle per process: a forked child must not report its parent.
    global _process
    if _process is None or _process.pid != os.getpid():
        _process = psutil.Process()
    return _process


def _peak_rss() -> int:
    """VmHWM from /proc/self/status; elsewhere ru_maxrss (KiB on Linux, bytes on macOS)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss if sys.platform == "darwin" else maxrss * 1024


def sample() -> ProcessSample:
    """This process, now."""
    wall = time.perf_counter()
    # RUSAGE_SELF sums every thread of the process, which is what we want: the
    # matmul and expert-reader threads do the work the phase is charged for.
    # getrusage's CPU times count microseconds, psutil's cpu_times clock ticks
    # (10 ms), too coarse for one decode token; faults only getrusage gives.
    ru = resource.getrusage(resource.RUSAGE_SELF)
    proc = _proc()
    rss = proc.memory_info().rss
    try:
        # Linux /proc/self/io: read_bytes is what reached the block layer (page-
        # cache misses, O_DIRECT), read_chars (rchar) everything read() returned.
        io = proc.io_counters()
        read_bytes, read_chars, io_ok = io.read_bytes, getattr(io, "read_chars", 0), True
    except (AttributeError, NotImplementedError, psutil.Error):
        # macOS has no io_counters; a locked-down /proc refuses it.
        read_bytes, read_chars, io_ok = 0, 0, False
    return ProcessSample(
        wall=wall, cpu_user=ru.ru_utime, cpu_system=ru.ru_stime,
        rss=rss, peak_rss=_peak_rss(),
        major_faults=ru.ru_majflt, minor_faults=ru.ru_minflt,
        read_bytes=read_bytes, read_chars=read_chars, io_available=io_ok)


def phase_stats(start: ProcessSample, end: ProcessSample) -> dict:
    """What happened between two samples. peak_rss_bytes is the high-water mark
    at `end`, process-wide since the process started (the OS keeps only one),
    so a phase that stayed below an earlier peak reports that earlier peak."""
    return {
        "wall_seconds": end.wall - start.wall,
        "cpu_user_seconds": end.cpu_user - start.cpu_user,
        "cpu_system_seconds": end.cpu_system - start.cpu_system,
        "peak_rss_bytes": end.peak_rss,
        "rss_bytes": end.rss,
        "major_faults": end.major_faults - start.major_faults,
        "minor_faults": end.minor_faults - start.minor_faults,
        "read_bytes": end.read_bytes - start.read_bytes,
        "read_chars": end.read_chars - start.read_chars,
        "io_available": start.io_available and end.io_available,
    }


def routing_stats(selections, n_layer: int, n_expert: int) -> dict:
    """Summary of router choices: `selections` is an int array [tokens, n_layer, k]
    of expert ids (what each token chose at each layer). Returns the number of
    (token, layer, expert) choices, distinct (layer, expert) pairs, distinct
    experts per layer, and `counts` [n_layer][n_expert] for the heatmap."""
    sel = np.asarray(selections)
    if sel.size == 0:
        sel = np.zeros((0, n_layer, 0), dtype=np.int64)
    if sel.ndim != 3 or sel.shape[1] != n_layer:
        raise ValueError(f"selections must have shape [tokens, {n_layer}, k], got {list(sel.shape)}")
    if not np.issubdtype(sel.dtype, np.integer):
        raise ValueError(f"selections must be expert ids (integers), got dtype {sel.dtype}")
    if sel.size and (sel.min() < 0 or sel.max() >= n_expert):
        raise ValueError(f"expert ids must lie in [0, {n_expert}), got {sel.min()}..{sel.max()}")
    # Flatten (layer, expert) to one index so one bincount counts every pair.
    layer = np.arange(n_layer).reshape(1, n_layer, 1)
    flat = (layer * n_expert + sel.astype(np.int64)).ravel()
    counts = np.bincount(flat, minlength=n_layer * n_expert).reshape(n_layer, n_expert)
    used = counts > 0
    return {
        "selections": int(sel.size),
        "unique_pairs": int(used.sum()),
        "unique_experts_per_layer": used.sum(axis=1).tolist(),
        "counts": counts.tolist(),
    }


# --- a generation's recording ---------------------------------------------------

class Recorder(Probe):
    """What a generation records besides its tokens, as a probe of its forward
    passes. With `profile`: time per part of the pass, process figures,
    routing and expert cache counters per phase, and per decode token its
    time, read stalls and cache hits (the schema goosedump.plot reads). With
    `profile` or `routing`: the routing trace (token position, layer,
    experts), and Belady's hit rate on it when experts stream."""

    def __init__(self, config, store, profile: bool = False, routing: bool = False):
        self.config, self.store, self.profile = config, store, profile
        self.timing = profile
        self.routing: list[tuple[int, int, np.ndarray]] = []     # (first position, layer, top [T, k])
        self.parts = {"prefill": defaultdict(float), "decode": defaultdict(float)}
        self._current = self.parts["prefill"]
        self.marks: list[tuple[str, ProcessSample, int, dict | None]] = []
        self.tokens: list[dict] = []
        self._last: dict | None = None

    # -- the probe
    def add_time(self, part: str, seconds: float) -> None:
        self._current[part] += seconds

    def on_route(self, layer: int, top: np.ndarray, spans) -> None:
        for pos0, r0, r1 in spans:
            self.routing.append((pos0, layer, top[r0:r1]))

    # -- the generation's steps
    def _counters(self) -> dict | None:
        return None if self.store is None else dict(self.store.counters().__dict__)

    def phase(self, name: str) -> None:
        if self.profile:
            self._current = self.parts[name]
            self._last = self._counters()
            self.marks.append((name, sample(), len(self.routing), self._last))

    def token(self, token: int, seconds: float) -> None:
        if not self.profile:
            return
        now = self._counters() or {}
        last = self._last or {}
        d = {k: now.get(k, 0) - last.get(k, 0) for k in ("stall_seconds", "hits", "misses")}
        stall = min(max(d["stall_seconds"], 0.0), seconds)
        self.tokens.append({"index": len(self.tokens), "token_id": int(token), "seconds": seconds,
                            "compute_seconds": seconds - stall, "stall_seconds": stall,
                            "hits": int(d["hits"]), "misses": int(d["misses"])})
        self._last = now

    def trace(self) -> list[tuple[int, int, tuple[int, ...]]]:
        """The recorded routing as (token position, layer, experts) rows, in
        the order the experts were asked for."""
        return [(pos0 + t, layer, tuple(int(e) for e in top[t]))
                for pos0, layer, top in self.routing for t in range(len(top))]

    def report(self, prefill_tokens: int, steps: int, prefill_s: float, decode_s: float,
               cache_stats: dict | None) -> dict:
        c, store = self.config, self.store
        streamed = store is not None and not store.in_place
        end = (None, sample(), len(self.routing), self._counters())
        marks = self.marks + [end]
        phases = {}
        for (name, s0, r0, c0), (_, s1, r1, c1) in zip(marks, marks[1:]):
            tokens, seconds = (prefill_tokens, prefill_s) if name == "prefill" else (steps, decode_s)
            sel = routing_array(self.routing[r0:r1], c.n_layer, c.n_expert_used)
            stats = routing_stats(sel, c.n_layer, c.n_expert)
            stats.pop("counts")
            phase_cache = None
            if c0 is not None and streamed:
                n = {k: c1[k] - c0[k] for k in ("hits", "misses", "bytes_read", "stall_seconds",
                                                 "predicted", "predicted_right")}
                n["hit_rate"] = n["hits"] / (n["hits"] + n["misses"]) if n["hits"] + n["misses"] else 0.0
                n["prefetch_accuracy"] = n["predicted_right"] / n["predicted"] if n["predicted"] else 0.0
                phase_cache = n
            stats["hit_rate"] = phase_cache["hit_rate"] if phase_cache else 1.0
            stats["prefetch_accuracy"] = phase_cache["prefetch_accuracy"] if phase_cache else None
            phases[name] = {**phase_stats(s0, s1), "tokens": tokens, "routing": stats,
                            "expert_cache": phase_cache, "split": profile_split(self.parts[name], seconds, tokens)}
        routing = routing_array(self.routing, c.n_layer, c.n_expert_used)
        return {"version": 1, "n_layer": c.n_layer, "n_expert": c.n_expert, "n_expert_used": c.n_expert_used,
                "phases": phases, "routing_counts": routing_stats(routing, c.n_layer, c.n_expert)["counts"],
                "decode_tokens": self.tokens, "expert_cache": cache_stats}


def routing_array(rows, n_layer: int, k: int) -> np.ndarray:
    """Recorded (first position, layer, top [T, k]) rows as one array of
    expert ids [tokens, layers, k], tokens in order."""
    batches: dict[int, dict[int, np.ndarray]] = defaultdict(dict)
    for pos0, layer, top in rows:
        batches[pos0][layer] = top
    parts = [np.stack([b[i] for i in range(n_layer)], axis=1) for _, b in sorted(batches.items())
             if len(b) == n_layer]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros((0, n_layer, k), np.int64)


def profile_split(parts: dict, total: float, tokens: int) -> dict:
    """Seconds per part and per token; "other" is what no part accounts for
    (Python orchestration, norms, RoPE, embeddings), so the parts add up to
    the measured total."""
    named = {p: float(parts.get(p, 0.0)) for p in PARTS}
    named["other"] = max(0.0, total - sum(named.values()))
    return {"total_seconds": total, "tokens": tokens, "seconds": named,
            "ms_per_token": {p: 1000 * v / tokens for p, v in named.items()} if tokens else {}}
