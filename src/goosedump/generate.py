"""The generation loop: prefill, then one token at a time, greedy, until a
stop condition says otherwise. The loop sees token ids only; text comes from
the tokenizer's stream decoder as code points complete."""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from .experts import StoreStats
from .forward import ContextOverflowError, KVCache, Transformer
from .tokenizer import Tokenizer

# Stop reasons, as the result and the CLI's --json report them.
STOP_EOS = "eos"                  # an end-of-generation token (<|return|>, <|call|>, <|endoftext|>)
STOP_MAX_TOKENS = "max_tokens"
STOP_REPETITION = "repetition"    # a repetition loop
STOP_TIME_BUDGET = "time_budget"

# A repetition loop: the last tokens repeat a cycle of period 1..32 at least
# 4 times and over at least 16 tokens, looked for in the last 128.
LOOP_MAX_PERIOD, LOOP_MIN_REPEATS, LOOP_MIN_TOKENS, LOOP_WINDOW = 32, 4, 16, 128


@dataclass
class GenerationResult:
    text: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    stop_reason: str
    prefill_seconds: float
    decode_seconds: float
    decode_steps: int = 0             # forward passes after the prefill
    eos_token_id: int | None = None   # the end-of-generation token, when that was the stop
    profile: dict | None = None       # with profile=True: seconds per part, per phase
    expert_cache: dict | None = None  # the expert store's counters for this generation

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def generated_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        # the first generated token comes from the prefill's logits
        n = self.decode_steps
        return n / self.decode_seconds if n > 0 and self.decode_seconds > 0 else 0.0

    def to_dict(self) -> dict:
        d = {
            "prompt_token_ids": self.prompt_token_ids, "token_ids": self.token_ids, "text": self.text,
            "stop_reason": self.stop_reason, "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens, "prefill_seconds": self.prefill_seconds,
            "decode_seconds": self.decode_seconds, "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
        }
        if self.profile is not None:
            d["profile"] = self.profile
        if self.expert_cache is not None:
            d["expert_cache"] = self.expert_cache
        return d


def repetition_loop(tokens: list[int]) -> bool:
    """True when the tail of tokens is a loop (see LOOP_*)."""
    tail = tokens[-LOOP_WINDOW:]
    n = len(tail)
    for period in range(1, min(LOOP_MAX_PERIOD, n // LOOP_MIN_REPEATS) + 1):
        run = period  # the last `run` tokens have this period
        while run < n and tail[n - 1 - run] == tail[n - 1 - run + period]:
            run += 1
        if run >= max(LOOP_MIN_TOKENS, LOOP_MIN_REPEATS * period):
            return True
    return False


@dataclass
class _State:
    generated: list[int] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)


class Generation:
    """An iterator of text pieces; `.result` holds the GenerationResult once
    the iteration ends (generate() runs it to the end)."""

    def __init__(self, transformer: Transformer, tokenizer: Tokenizer, cache: KVCache, prompt: list[int],
                 max_tokens: int, time_budget: float | None, on_token: Callable[[int], None] | None = None,
                 profile: bool = False):
        self.result: GenerationResult | None = None
        self._it = self._run(transformer, tokenizer, cache, prompt, max_tokens, time_budget, on_token, profile)

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        return next(self._it)

    def _run(self, tr: Transformer, tok: Tokenizer, cache: KVCache, prompt: list[int], max_tokens: int,
             time_budget: float | None, on_token, profile: bool) -> Iterator[str]:
        phases = {"prefill": defaultdict(float), "decode": defaultdict(float)} if profile else None
        tr.timings = phases["prefill"] if phases else None
        store = tr.store
        if store is not None:
            store.stats = StoreStats()   # counters for this generation
        own_routing = profile and store is not None and not store.in_place and tr.routing is None
        if own_routing:
            tr.routing = []              # this generation's routing, for the oracle's hit rate below
        t0 = time.perf_counter()
        deadline = None if time_budget is None else t0 + time_budget
        cache.reset()
        decoder = tok.stream_decoder()
        st = _State()
        stop, eos_id, steps = STOP_MAX_TOKENS, None, 0
        token, _ = tr.forward(np.asarray(prompt), cache, logits="argmax")   # prefill
        t_prefill = time.perf_counter()
        tr.timings = phases["decode"] if phases else None
        t_decode_compute = 0.0  # forward passes only, for the profile's split
        while True:
            if token in tok.eog_ids:
                stop, eos_id = STOP_EOS, token
                break
            st.generated.append(int(token))
            if on_token is not None:
                on_token(int(token))
            piece = decoder.add(int(token))
            if piece:
                st.pieces.append(piece)
                yield piece
            if len(st.generated) >= max_tokens:
                stop = STOP_MAX_TOKENS
                break
            if repetition_loop(st.generated):
                stop = STOP_REPETITION
                break
            if deadline is not None and time.perf_counter() >= deadline:
                stop = STOP_TIME_BUDGET
                break
            t_step = time.perf_counter()
            token, _ = tr.forward(np.asarray([token]), cache, logits="argmax")  # decode one
            t_decode_compute += time.perf_counter() - t_step
            steps += 1
        tail = decoder.flush()
        if tail:
            st.pieces.append(tail)
            yield tail
        t_end = time.perf_counter()
        tr.timings = None
        report = None
        if phases is not None:
            report = {
                "prefill": profile_split(phases["prefill"], t_prefill - t0, len(prompt)),
                "decode": profile_split(phases["decode"], t_decode_compute, steps),
            }
        cache_stats = None
        if store is not None:
            cache_stats = store.snapshot()
            tokens = len(prompt) + len(st.generated)
            cache_stats["bytes_read_per_token"] = cache_stats["bytes_read"] / tokens if tokens else 0.0
            if profile and not store.in_place and tr.routing is not None:
                from .cachesim import simulate
                cache_stats["belady_hit_rate"] = simulate(tr.routing_trace(), store.n_slots, "belady")["hit_rate"]
            if own_routing:
                tr.routing = None
        self.result = GenerationResult(
            text="".join(st.pieces), prompt_token_ids=list(map(int, prompt)), token_ids=st.generated,
            stop_reason=stop, prefill_seconds=t_prefill - t0, decode_seconds=t_end - t_prefill,
            decode_steps=steps, eos_token_id=eos_id, profile=report, expert_cache=cache_stats)


PROFILE_PARTS = ("attn_proj", "attention", "router", "experts", "output_head")


def profile_split(parts: dict, total: float, tokens: int) -> dict:
    """Seconds per part and per token; "other" is what no part accounts for
    (Python orchestration, norms, RoPE, embeddings), so the parts add up to
    the measured total."""
    named = {p: float(parts.get(p, 0.0)) for p in PROFILE_PARTS}
    named["other"] = max(0.0, total - sum(named.values()))
    return {"total_seconds": total, "tokens": tokens, "seconds": named,
            "ms_per_token": {p: 1000 * v / tokens for p, v in named.items()} if tokens else {}}


def check_context(n_prompt: int, max_tokens: int, n_ctx: int) -> None:
    """Context overflow is an error before any work is done."""
    if n_prompt == 0:
        raise ValueError("the prompt is empty: nothing to continue from")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    if n_prompt + max_tokens > n_ctx:
        raise ContextOverflowError(
            f"the prompt ({n_prompt} tokens) plus max_tokens ({max_tokens}) exceeds the context of "
            f"{n_ctx} tokens: raise the context (--ctx) or lower max_tokens (--max-tokens)")
