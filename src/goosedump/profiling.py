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
from dataclasses import dataclass

import numpy as np
import psutil


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
