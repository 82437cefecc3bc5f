"""Where a model's bytes go: the dense weights (resident), the experts (streamed
through the expert cache) and one expert's cache slot; and what a run needs
in memory."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from .config import ModelConfig
from .expert_slots import PIECES as EXPERT_PIECES
from .expert_slots import slot_layout
from .gguf import GGUFFile
from .kvcache import PREFILL_BATCH, kv_bytes


def is_expert_tensor(name: str) -> bool:
    return name.split(".", 2)[-1] in EXPERT_PIECES


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
        if is_expert_tensor(t.name):
            expert += t.nbytes
    total = sum(b for _, b in by_type.values())
    _, slot = slot_layout(f, c)
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


def estimate_memory(c: ModelConfig, layout: WeightLayout, budget: int, ctx: int,
                    prefill_tokens: int = 4096) -> MemoryEstimate:
    """What a run needs: dense weights, the expert cache (whole slots within
    the budget; all experts in place when it covers them), the fp16 KV cache
    (as KVCache allocates it) and prefill scratch buffers (a pass of up to
    prefill_tokens tokens keeps a few rows of the residual stream per token;
    attention runs PREFILL_BATCH tokens at a time)."""
    in_place = budget >= layout.n_expert_slots * layout.expert_slot_bytes   # as the store decides
    slots = layout.n_expert_slots if in_place else budget // layout.expert_slot_bytes
    kv = kv_bytes(c, ctx)
    T, P = PREFILL_BATCH, max(1, min(prefill_tokens, ctx))
    rows = P * 6 * c.n_embd * 4 + P * c.n_expert_used * 8 * 2            # residual, norms, outputs; routing
    acts = T * (c.n_head * (c.head_dim + c.value_dim) + 2 * c.n_ff_expert) * 4
    scores = T * c.n_head * ctx * 4
    logits = c.n_vocab * 4 * 2
    experts = layout.expert_bytes if in_place else slots * layout.expert_slot_bytes   # in place: mapped
    return MemoryEstimate(layout.dense_bytes, experts, slots, in_place, kv, rows + acts + scores + logits)


def auto_expert_budget(c: ModelConfig, layout: WeightLayout, ctx: int, prefill_tokens: int = 4096,
                       available: int | None = None, source: str = "", kv_caches: int = 1):
    """The expert cache budget `--expert-cache auto` takes (goosedump.budget.auto_budget);
    kv_caches: the KV caches the run may hold at once (a server's --max-batch)."""
    from .budget import auto_budget
    mem = estimate_memory(c, layout, 0, ctx, prefill_tokens)
    slot = layout.expert_slot_bytes
    return auto_budget(layout.n_expert_slots * slot, slot, mem.dense + kv_caches * mem.kv_cache + mem.scratch,
                       c.n_expert_used * c.n_layer * slot, c.n_expert_used * slot, available, source)
