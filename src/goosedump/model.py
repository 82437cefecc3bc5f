"""A loaded model: the file, its config, its tokenizer and the layout of its
weights (what is dense, what streams through the expert cache)."""
from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass

from .config import ModelConfig, check_tensors, read_config
from .gguf import GGUFFile
from .tokenizer import Tokenizer

# Per-expert pieces a cache slot holds: (tensor suffix, is bias).
EXPERT_PIECES = ("ffn_gate_exps.weight", "ffn_gate_exps.bias", "ffn_up_exps.weight",
                 "ffn_up_exps.bias", "ffn_down_exps.weight", "ffn_down_exps.bias")
PREFILL_BATCH = 128


@dataclass(frozen=True)
class WeightLayout:
    dense_bytes: int           # memory-mapped, resident while running
    expert_bytes: int          # all experts of all layers
    expert_slot_bytes: int     # one expert's six pieces: one cache slot
    n_expert_slots: int        # layers x experts
    by_type: dict              # ggml type name -> (tensor count, bytes)


def weight_layout(f: GGUFFile, c: ModelConfig) -> WeightLayout:
    by_type: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    expert = 0
    for t in f.tensors.values():
        by_type[t.type_name][0] += 1
        by_type[t.type_name][1] += t.nbytes
        if t.name.split(".", 2)[-1] in EXPERT_PIECES:
            expert += t.nbytes
    total = sum(b for _, b in by_type.values())
    slot = sum(f.tensors[f"blk.0.{p}"].nbytes for p in EXPERT_PIECES) // c.n_expert
    return WeightLayout(total - expert, expert, slot, c.n_layer * c.n_expert,
                        {k: tuple(v) for k, v in sorted(by_type.items())})


@dataclass(frozen=True)
class MemoryEstimate:
    dense: int
    expert_cache: int
    expert_slots: int          # slots the budget holds
    experts_in_place: bool     # the budget covers every expert: no copies
    kv_cache: int
    scratch: int

    @property
    def total(self) -> int:
        return self.dense + self.expert_cache + self.kv_cache + self.scratch


def estimate_memory(c: ModelConfig, layout: WeightLayout, budget: int, ctx: int) -> MemoryEstimate:
    """What a run needs: dense weights, the expert cache (whole slots within
    the budget; all experts in place when it covers them), the fp16 KV cache
    (sliding layers keep only their window) and prefill scratch buffers."""
    in_place = budget >= layout.expert_bytes
    slots = layout.n_expert_slots if in_place else budget // layout.expert_slot_bytes
    per_pos = c.n_head_kv * (c.head_dim + c.value_dim) * 2
    kv = sum(per_pos * (min(ctx, c.sliding_window) if c.is_sliding(i) else ctx) for i in range(c.n_layer))
    T = PREFILL_BATCH
    acts = T * (4 * c.n_embd + c.n_head * (c.head_dim + c.value_dim) + 2 * c.n_ff_expert) * 4
    scores = T * c.n_head * ctx * 4
    logits = c.n_vocab * 4 * 2
    return MemoryEstimate(layout.dense_bytes, slots * layout.expert_slot_bytes, slots, in_place, kv,
                          acts + scores + logits)


class Model:
    """`goosedump.load(path)` returns this."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self.file = GGUFFile(self.path)
        self.config: ModelConfig = read_config(self.file)
        check_tensors(self.file, self.config)
        self.tokenizer = Tokenizer(self.file)
        self.layout = weight_layout(self.file, self.config)

    @property
    def chat_template(self) -> str | None:
        return self.file.get("tokenizer.chat_template")

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        c = self.config
        return (f"Model({self.path!r}, {c.n_layer} layers, {c.n_expert} experts, "
                f"hidden {c.n_embd}, vocab {c.n_vocab})")


def load(path: str | os.PathLike) -> Model:
    """Open a GPT-OSS GGUF file: metadata, config, tensor checks, tokenizer."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{os.fspath(path)}: no such file")
    return Model(path)
