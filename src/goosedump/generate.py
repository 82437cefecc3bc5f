"""The generation loop: prefill, then one token at a time, greedy, until a
stop condition says otherwise. The loop sees token ids only; text comes from
the tokenizer's stream decoder as code points complete."""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from . import profiling
from .experts import StoreStats
from .forward import ContextOverflowError, KVCache, Transformer
from .profiling import ProcessSample
from .sampling import GREEDY, SamplingParams, make_rng, sample
from .tokenizer import Tokenizer

# Stop reasons, as the result and the CLI's --json report them.
STOP_EOS = "eos"                  # an end-of-generation token (<|return|>, <|call|>, <|endoftext|>)
STOP_MAX_TOKENS = "max_tokens"
STOP_REPETITION = "repetition"    # a repetition loop
STOP_TIME_BUDGET = "time_budget"
STOP_CANCELLED = "cancelled"      # the consumer stopped it (a client gone, Ctrl-C)

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
    cached_tokens: int = 0            # prompt tokens whose KV cache was reused, not recomputed

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def generated_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def prefill_tokens_per_s(self) -> float:
        n = self.prompt_tokens - self.cached_tokens   # those the prefill computed
        return n / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        # the first generated token comes from the prefill's logits
        n = self.decode_steps
        return n / self.decode_seconds if n > 0 and self.decode_seconds > 0 else 0.0

    def to_dict(self) -> dict:
        d = {
            "prompt_token_ids": self.prompt_token_ids, "token_ids": self.token_ids, "text": self.text,
            "stop_reason": self.stop_reason, "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens, "cached_tokens": self.cached_tokens,
            "prefill_seconds": self.prefill_seconds,
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


def stop_after(generated: list[int], max_tokens: int, deadline: float | None, cancelled: str | None,
               loops: bool = True) -> str | None:
    """Why generation stops after the token just added to generated, if it
    does (an end-of-generation token is checked before it is added): the
    consumer's cancel, max_tokens, a repetition loop (unless loops is False),
    the time budget's deadline (a time.perf_counter() value)."""
    if cancelled is not None:
        return cancelled
    if len(generated) >= max_tokens:
        return STOP_MAX_TOKENS
    if loops and repetition_loop(generated):
        return STOP_REPETITION
    if deadline is not None and time.perf_counter() >= deadline:
        return STOP_TIME_BUDGET
    return None


class Generation:
    """A running generation. Iterating gives text pieces (whole code points);
    `events()` gives (token id, text piece) per generated token instead. The
    consumer may `cancel(reason)` between items: the loop then ends with that
    stop reason before the next forward pass. `.result` holds the
    GenerationResult once the iteration ends. ignore_eos (benchmarks, as
    llama-bench): run to max_tokens through end-of-generation tokens and
    repetition loops."""

    def __init__(self, transformer: Transformer, tokenizer: Tokenizer, cache: KVCache, prompt: list[int],
                 max_tokens: int, time_budget: float | None, profile: bool = False,
                 sampling: SamplingParams = GREEDY, reuse_cache: bool = True, ignore_eos: bool = False):
        sampling.check_vocab(transformer.config.n_vocab)
        self.result: GenerationResult | None = None
        self._cancel: str | None = None
        self._events = self._run(transformer, tokenizer, cache, prompt, max_tokens, time_budget, profile,
                                 sampling, reuse_cache, ignore_eos)

    def events(self) -> Iterator[tuple[int | None, str]]:
        return self._events

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        for _, piece in self._events:
            if piece:
                return piece
        raise StopIteration

    def cancel(self, reason: str = STOP_CANCELLED) -> None:
        self._cancel = reason

    def _run(self, tr: Transformer, tok: Tokenizer, cache: KVCache, prompt: list[int], max_tokens: int,
             time_budget: float | None, profile: bool, sampling: SamplingParams,
             reuse_cache: bool, ignore_eos: bool) -> Iterator[tuple[int | None, str]]:
        rec = _Recorder(tr, profile)
        t0 = time.perf_counter()
        deadline = None if time_budget is None else t0 + time_budget
        # A new turn of a conversation: keep the cached positions of the prefix
        # this prompt shares with what the cache holds (at least one token is
        # always run, for its logits).
        reused = cache.reuse(prompt) if reuse_cache else cache.truncate(0)
        rng = make_rng(sampling)
        prompt_arr = np.asarray(prompt, dtype=np.int64)
        generated: list[int] = []

        def next_token(tokens: np.ndarray) -> int:
            if sampling.plain_greedy:
                token, _ = tr.forward(tokens, cache, logits="argmax")
                return int(token)
            logits = tr.forward(tokens, cache, logits="last")
            return sample(logits, sampling, rng, prompt_arr, np.asarray(generated, dtype=np.int64))

        decoder = tok.stream_decoder()
        eos_id, steps = None, 0
        rec.phase("prefill")
        token = next_token(prompt_arr[reused:])
        cache.save_window()           # lets the next turn rewind to this prompt's end
        t_prefill = time.perf_counter()
        rec.phase("decode")
        t_decode_compute = 0.0  # forward passes only, for the profile's split
        while True:
            if token in tok.eog_ids and not ignore_eos:
                stop, eos_id = STOP_EOS, token
                break
            generated.append(token)
            yield token, decoder.add(token)
            stop = stop_after(generated, max_tokens, deadline, self._cancel, loops=not ignore_eos)
            if stop is not None:
                break
            t_step = time.perf_counter()
            token = next_token(np.asarray([token]))
            dt = time.perf_counter() - t_step
            t_decode_compute += dt
            steps += 1
            rec.token(token, dt)
        tail = decoder.flush()
        if tail:
            yield None, tail
        t_end = time.perf_counter()
        report, cache_stats = rec.finish(len(prompt) - reused, steps, t_prefill - t0, t_decode_compute,
                                         len(prompt) + len(generated))
        self.result = GenerationResult(
            text=tok.decode(generated), prompt_token_ids=list(map(int, prompt)), token_ids=generated,
            stop_reason=stop, prefill_seconds=t_prefill - t0, decode_seconds=t_end - t_prefill,
            decode_steps=steps, eos_token_id=eos_id, profile=report, expert_cache=cache_stats,
            cached_tokens=reused)


class _Recorder:
    """What a generation records besides its tokens: the expert store's
    counters always; with profiling, time per part of the forward pass,
    process figures and routing per phase, and per decode token its time,
    read stalls and cache hits (the schema goosedump.plot reads)."""

    def __init__(self, tr: Transformer, profile: bool):
        self.tr, self.profile = tr, profile
        self.store = tr.store
        if self.store is not None:
            self.store.stats = StoreStats()   # counters for this generation
        self.own_routing = profile and tr.routing is None
        if self.own_routing:
            tr.routing = []                   # this generation's routing, for the profile
        self.parts = {"prefill": defaultdict(float), "decode": defaultdict(float)}
        self.samples: list[tuple[str, ProcessSample, int, dict | None]] = []
        self.tokens: list[dict] = []

    def _counters(self) -> dict | None:
        return dict(self.store.stats.__dict__) if self.store is not None else None

    def phase(self, name: str) -> None:
        if self.profile:
            self.tr.timings = self.parts[name]
            self.samples.append((name, profiling.sample(), len(self.tr.routing), self._counters()))
            self._last = self._counters()

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

    def finish(self, prefill_tokens: int, steps: int, prefill_s: float, decode_s: float, total_tokens: int):
        tr, store = self.tr, self.store
        tr.timings = None
        cache_stats = None
        if store is not None:
            cache_stats = store.snapshot()
            cache_stats["bytes_read_per_token"] = cache_stats["bytes_read"] / total_tokens if total_tokens else 0.0
            if self.profile and not store.in_place and tr.routing is not None:
                from .cachesim import simulate
                cache_stats["belady_hit_rate"] = simulate(tr.routing_trace(), store.n_slots, "belady")["hit_rate"]
        report = None
        if self.profile:
            report = self._report(prefill_tokens, steps, prefill_s, decode_s, cache_stats)
        if self.own_routing:
            tr.routing = None
        return report, cache_stats

    def _report(self, prefill_tokens, steps, prefill_s, decode_s, cache_stats) -> dict:
        c, tr = self.tr.config, self.tr
        end = (None, profiling.sample(), len(tr.routing), self._counters())
        marks = self.samples + [end]
        routing = routing_array(tr.routing, c.n_layer, c.n_expert_used)
        phases = {}
        for (name, s0, r0, c0), (_, s1, r1, c1) in zip(marks, marks[1:]):
            tokens, seconds = (prefill_tokens, prefill_s) if name == "prefill" else (steps, decode_s)
            sel = routing_array(tr.routing[r0:r1], c.n_layer, c.n_expert_used)
            stats = profiling.routing_stats(sel, c.n_layer, c.n_expert)
            stats.pop("counts")
            phase_cache = None
            if c0 is not None and not self.store.in_place:
                n = {k: c1[k] - c0[k] for k in ("hits", "misses", "bytes_read", "stall_seconds",
                                                 "predicted", "predicted_right")}
                n["hit_rate"] = n["hits"] / (n["hits"] + n["misses"]) if n["hits"] + n["misses"] else 0.0
                n["prefetch_accuracy"] = n["predicted_right"] / n["predicted"] if n["predicted"] else 0.0
                phase_cache = n
            stats["hit_rate"] = phase_cache["hit_rate"] if phase_cache else 1.0
            stats["prefetch_accuracy"] = phase_cache["prefetch_accuracy"] if phase_cache else None
            phases[name] = {**profiling.phase_stats(s0, s1), "tokens": tokens, "routing": stats,
                            "expert_cache": phase_cache, "split": profile_split(self.parts[name], seconds, tokens)}
        return {"version": 1, "n_layer": c.n_layer, "n_expert": c.n_expert, "n_expert_used": c.n_expert_used,
                "phases": phases,
                "routing_counts": profiling.routing_stats(routing, c.n_layer, c.n_expert)["counts"],
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
