"""The expert store's vocabulary (experts.py holds the store): an expert's six
pieces, where each lies in a cache slot, the arrays a fetch hands out, and the
store's counters. layout.py sizes a run's memory from the slot layout alone."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import ModelConfig
from .gguf import GGUFFile

PIECES = ("ffn_gate_exps.weight", "ffn_gate_exps.bias", "ffn_up_exps.weight", "ffn_up_exps.bias",
          "ffn_down_exps.weight", "ffn_down_exps.bias")
PAGE = 4096  # O_DIRECT reads: file offsets, lengths and buffers aligned to this


def slot_layout(f: GGUFFile, c: ModelConfig) -> tuple[dict[str, int], int]:
    """Offsets of the six pieces' regions inside a slot and the slot's size.
    A region is page-aligned and one page longer than its piece rounded up to
    pages: a direct read covers the piece's pages whole, and the piece starts
    at its offset within its first page. A piece's region fits its largest
    layer's: a file may give a piece another type on some layers (llama-quantize
    gives ffn_down more bits on some)."""
    offsets, size = {}, 0
    for name in PIECES:
        offsets[name] = size
        largest = max(f.tensors[f"blk.{i}.{name}"].nbytes for i in range(c.n_layer))
        size += -(-(largest // c.n_expert) // PAGE) * PAGE + PAGE
    return offsets, size


@dataclass
class ExpertView:
    """One expert's pieces as arrays (views into a slot or into the map)."""
    gate: np.ndarray        # (F, bytes per row of D)
    gate_bias: np.ndarray   # (F,)
    up: np.ndarray
    up_bias: np.ndarray
    down: np.ndarray        # (D, bytes per row of F)
    down_bias: np.ndarray   # (D,)


@dataclass
class StoreStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes_read: int = 0
    read_seconds: float = 0.0    # summed over reader threads
    stall_seconds: float = 0.0   # time the computation waited for reads
    prefetched: int = 0          # reads started ahead of need
    prefetch_used: int = 0       # of those, asked for before their slot was given to another expert
    prefetch_wasted: int = 0     # of those, evicted (or failed) without ever being asked for
    predicted: int = 0           # expert predictions made
    predicted_right: int = 0     # predictions that the layer's router then chose

    def minus(self, start: "StoreStats") -> "StoreStats":
        """The counts since `start` (an earlier copy of the same counters)."""
        return StoreStats(**{k: v - getattr(start, k) for k, v in self.__dict__.items()})

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        n = self.hits + self.misses
        d["hit_rate"] = self.hits / n if n else 0.0
        # Hits without the prefetch's help: the rate a cache that only reads
        # on demand would have had, which Belady's oracle bounds from above.
        d["demand_hit_rate"] = (self.hits - self.prefetch_used) / n if n else 0.0
        d["read_gb_per_s"] = self.bytes_read / self.read_seconds / 1e9 if self.read_seconds else 0.0
        d["prefetch_accuracy"] = self.predicted_right / self.predicted if self.predicted else 0.0
        return d
