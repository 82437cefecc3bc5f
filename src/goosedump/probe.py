"""Observers of the forward pass. The forward pass holds no instrumentation of
its own: a caller that wants to know where time goes, or which experts were
chosen, passes a probe, and the pass reports to it.

    with probe.timer("experts"): ...        # seconds spent in a part
    probe.on_route(layer, top, spans)       # the router's choice for a batch

`spans` lists, per sequence in the batch, (first position, first row, end
row). The base class observes nothing and costs nothing; `Rows` hands each
sequence of a batched step its own share.
"""
from __future__ import annotations

import contextlib
import time
from typing import Sequence

import numpy as np

PARTS = ("attn_proj", "attention", "router", "experts", "output_head", "constraint")
_NULL = contextlib.nullcontext()


class _Timer:
    __slots__ = ("probe", "part", "t0")

    def __init__(self, probe: "Probe", part: str):
        self.probe, self.part = probe, part

    def __enter__(self):
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        self.probe.add_time(self.part, time.perf_counter() - self.t0)


class Probe:
    """Observes nothing. Subclasses set `timing` to receive add_time calls
    and override on_route to see routing."""
    timing = False

    def timer(self, part: str):
        return _Timer(self, part) if self.timing else _NULL

    def add_time(self, part: str, seconds: float) -> None:
        pass

    def on_route(self, layer: int, top: np.ndarray, spans: Sequence[tuple[int, int, int]]) -> None:
        pass


NO_PROBE = Probe()


class Rows(Probe):
    """A batched step seen by each of its sequences: row b's probe gets the
    routing of its own rows and the step's whole time (the time that
    sequence waited for its token)."""

    def __init__(self, probes: Sequence[Probe]):
        self.probes = list(probes)
        self.timing = any(p.timing for p in self.probes)

    def add_time(self, part: str, seconds: float) -> None:
        for p in self.probes:
            p.add_time(part, seconds)

    def on_route(self, layer: int, top: np.ndarray, spans) -> None:
        for p, (pos0, r0, r1) in zip(self.probes, spans):
            if p is not NO_PROBE:
                p.on_route(layer, top[r0:r1], [(pos0, 0, r1 - r0)])
