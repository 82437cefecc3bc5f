"""The one generation loop: a step function over rows.

A `Generation` is one sequence in flight: its prompt, its KV cache, its
sampler, the tokens so far and, once over, its result. The `Stepper` moves
generations forward: `prefill` one (its first token comes from the prompt's
last position), `decode` any number of them by one token each in a single
batched forward pass. Picking the token (greedy or sampled), the stop
conditions, the stream decoding of text and the result are written here
once. `Model.generate` drives a batch of one as its consumer iterates; the
server's Engine drives many from its worker thread (goosedump.engine). The
loop sees token ids only; text comes from the tokenizer's stream decoder as
code points complete. Profiling and routing traces are a probe of each step
(goosedump.profiling.Recorder), not part of the model.
"""
from __future__ import annotations

import math
import queue
import sys
import threading
import time
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from .forward import Stopped
from .kvcache import KVCache
from .logprobs import Pending, check_logprobs, prompt_logprobs
from .probe import NO_PROBE, Rows
from .profiling import Recorder
from .result import (LOOP_MIN_TOKENS, STOP_CANCELLED, STOP_EOS, STOP_MAX_TOKENS, STOP_REPETITION, STOP_TIME_BUDGET,
                     ContextOverflowError, GenerationResult, repetition_loop, stop_after)
from .sampling import GREEDY, NoTokenLeft, SamplingParams, best, make_rng, sample

__all__ = ["Generation", "GenerationResult", "Stepper", "ContextOverflowError", "check_prompt", "check_context",
           "repetition_loop", "STOP_EOS", "STOP_MAX_TOKENS", "STOP_REPETITION", "STOP_TIME_BUDGET",
           "STOP_CANCELLED"]

Event = tuple  # (token id, text piece), or (None, text) for the decoder's tail
_DONE = object()


def check_prompt(ids: Sequence[int], n_vocab: int) -> list[int]:
    """Token ids as ints, each inside the vocabulary (integers only: 976.7,
    "976", True or bytes are no token ids, and had been taken as some)."""
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise ValueError(f"prompt: an array of token ids must be one-dimensional, of integers; got a "
                             f"{ids.ndim}-D array of {ids.dtype}")
        ids = ids.tolist()
    if isinstance(ids, (str, bytes, bytearray)) or not isinstance(ids, Iterable):
        raise ValueError(f"prompt must be text (a str) or a sequence of token ids, got {type(ids).__name__}")
    ids = list(ids)
    wrong = next((t for t in ids if isinstance(t, bool) or not isinstance(t, (int, np.integer))), None)
    if wrong is not None:
        raise ValueError(f"prompt: token ids are integers, got {wrong!r} ({type(wrong).__name__})")
    ids = [int(t) for t in ids]
    bad = [t for t in ids if not 0 <= t < n_vocab]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{n_vocab - 1})")
    return ids


def check_context(n_prompt: int, max_tokens: int, n_ctx: int) -> None:
    """Context overflow is an error before any work is done."""
    if n_prompt == 0:
        raise ValueError("the prompt is empty: nothing to continue from")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)):
        raise ValueError(f"max_tokens must be a whole number of tokens, at least 1, got {max_tokens!r}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    if n_prompt + max_tokens > n_ctx:
        raise ContextOverflowError(n_prompt, max_tokens, n_ctx)


class Generation:
    """One generation in flight. `events()` gives (token id, text piece) per
    generated token (text pieces are whole code points; the decoder's tail
    comes last as (None, text)); iterating gives the text pieces alone.
    `cancel(reason)` from any thread stops it before its next token, with
    that stop reason. `.result` holds the GenerationResult once it is over
    (or `.error` what failed it).

    Driven by its consumer (Model.generate_stream: each step runs when the
    consumer asks for more) or by an engine's worker thread (events queue up,
    or go to `on_event(generation, event)` as they happen, then event None once
    it is over)."""

    def __init__(self, prompt: list[int], max_tokens: int, sampling: SamplingParams = GREEDY,
                 time_budget: float | None = None, ignore_eos: bool = False, reuse_cache: bool = True,
                 recorder: Recorder | None = None, on_event: Callable[["Generation", Event | None], None] | None = None,
                 before_end: Callable[["Generation"], None] | None = None, id: int = 0, constraint=None,
                 keep_whole_prompt: bool = True, logprobs: int | None = None, prompt_logprobs: int | None = None):
        self.prompt, self.max_tokens, self.sampling = prompt, max_tokens, sampling
        # with logprobs (alternatives per token, 0: none): token_logprobs holds
        # each generated token's (goosedump.logprobs), set before its event;
        # end_logprob the end token's, when one ended the generation (it is
        # not generated text, so not in token_logprobs)
        self.logprobs, self.token_logprobs, self.pending = logprobs, [], None
        self.end_logprob = None
        # with prompt_logprobs: the prompt's tokens' from its second on, set
        # by the prefill (which then computes the whole prompt: no cache reuse)
        self.prompt_logprobs, self.prompt_token_logprobs = prompt_logprobs, None
        self.time_budget, self.ignore_eos, self.reuse_cache = time_budget, ignore_eos, reuse_cache
        self.recorder = recorder
        self.probe = recorder or NO_PROBE
        # goosedump.structured: allowed() -> mask of the tokens that may come
        # next, advance(token); None: any token
        self.constraint = constraint
        # whether the constraint left the token just picked the only choice, and how many such in a row: a
        # loop the grammar forces (thirty zeros of a schema) is no loop of the model's to stop
        self.forced, self.forced_run = False, 0
        self.id = id
        self.submitted = time.perf_counter()
        self.started: float | None = None     # when its prefill began
        self.result: GenerationResult | None = None
        self.error: BaseException | None = None
        self._cancel: str | None = None
        self._done = threading.Event()
        self._on_event = on_event
        self._before_end = before_end
        self._ending = False
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._drive: Callable[[Generation], None] | None = None   # set when its consumer drives it
        # the loop's state
        self.cache: KVCache | None = None
        self.rng = make_rng(sampling)
        self.prompt_arr = np.asarray(prompt, dtype=np.int64)
        self.keep = False                   # put the prompt's state on disk when it ends
        # with a prompt cache: keep the whole prompt's state too (the CLI: the
        # same prompt again); the server keeps conversations as it sets them aside
        self.keep_whole_prompt = keep_whole_prompt
        self.generated: list[int] = []
        self.decoder = None
        self.cached = 0
        self.steps = 0
        self.compute_seconds = 0.0            # decode's forward passes and picks
        self.t_prefill = 0.0
        self.deadline: float | None = None
        self.next: int | None = None          # the token to feed at the next step
        self.store_start = None
        self.store_log: list | None = None    # the store's requests, for Belady's oracle
        self.unlog: Callable[[], None] | None = None   # stops that log (at the end, whatever ends it)

    # -- for the consumer
    def cancel(self, reason: str = STOP_CANCELLED) -> None:
        self._cancel = reason

    def cut(self, n: int, tokenizer) -> None:
        """Hold only the first n generated tokens in the result (a stop
        string the consumer found ended there: the worker may have made more
        before it heard, or ended for another reason first). For the
        consumer, once it has heard of the end."""
        r = self.result
        if r is None or len(r.token_ids) <= n:
            return
        r.token_ids = r.token_ids[:n]
        r.text = tokenizer.decode(r.token_ids)
        if r.logprobs is not None:
            r.logprobs = r.logprobs[:n]

    @property
    def cancelled(self) -> str | None:
        return self._cancel

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def events(self) -> Iterator[Event]:
        """Its events, once: a generation whose events were all taken gives
        none again (it had waited for ever for an end it had already given)."""
        if self._on_event is not None:
            raise RuntimeError("this generation's events go to its on_event callback")
        while True:
            if self.done and self._queue.empty():     # (every event is queued before done is set)
                if self.error is not None:
                    raise self.error
                return
            if self._drive is not None and self._queue.empty() and not self.done:
                self._drive(self)
                continue
            item = self._queue.get()
            if item is _DONE:
                if self.error is not None:
                    raise self.error
                return
            yield item

    def __iter__(self) -> Iterator[str]:
        return (piece for _, piece in self.events() if piece)

    def wait(self) -> GenerationResult:
        for _ in self.events():
            pass
        assert self.result is not None
        return self.result

    # -- for the stepper
    def emit(self, event: Event) -> None:
        if self._on_event is not None:
            self._on_event(self, event)
        else:
            self._queue.put(event)

    def end(self, result: GenerationResult | None, error: BaseException | None = None) -> None:
        """Once: a second call (the engine failing a step whose end failed)
        changes nothing; the consumer hears of the end whatever before_end
        raises (the engine's bookkeeping: had it run twice, one cache would
        have been kept twice, for two later requests at once)."""
        if self._ending:
            return
        self._ending = True
        if self.unlog is not None:
            self.unlog()
            self.unlog = None
        self.result, self.error = result, error
        try:
            if self._before_end is not None:
                self._before_end(self)
        finally:
            self._done.set()
            if self._on_event is not None:
                try:
                    self._on_event(self, None)
                except Exception as e:     # (the consumer's own failure: it must not stop an engine's worker)
                    print(f"goosedump: generation {self.id}'s on_event callback failed at its end: "
                          f"{type(e).__name__}: {e}", file=sys.stderr)
            else:
                self._queue.put(_DONE)


class Stepper:
    """The step function over rows, for one model."""

    def __init__(self, transformer, tokenizer, n_ctx: int, prompt_cache=None):
        self.tr, self.tok, self.n_ctx = transformer, tokenizer, n_ctx
        self.store = transformer.store
        # goosedump.promptcache.PromptCache or None; a chat prompt's state is
        # kept at its last user message (the system prompt and tools before it)
        self.prompt_cache = prompt_cache
        try:
            self._user_header = np.array([tokenizer.special_token("<|start|>"), *tokenizer.encode("user")], np.int64)
        except KeyError:                    # not a harmony vocabulary: no chat marks to keep
            self._user_header = None

    def new(self, prompt: Sequence[int], max_tokens: int, sampling: SamplingParams | None = None, *,
            profile: bool = False, record_routing: bool = False, **kw) -> Generation:
        """A validated generation, not yet started. Bad input (an empty prompt,
        one that does not fit the context, token ids or a logit bias outside
        the vocabulary) raises here."""
        c = self.tr.config
        ids = check_prompt(prompt, c.n_vocab)
        check_context(len(ids), max_tokens, self.n_ctx)
        sampling = GREEDY if sampling is None else sampling
        if not isinstance(sampling, SamplingParams):
            raise ValueError(f"sampling must be a goosedump.sampling.SamplingParams, got {type(sampling).__name__}")
        sampling.check_vocab(c.n_vocab)
        check_logprobs(kw.get("logprobs"))
        check_logprobs(kw.get("prompt_logprobs"), "prompt_logprobs")
        budget = kw.get("time_budget")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                                   or not math.isfinite(budget) or budget < 0):
            raise ValueError(f"time_budget must be a number of seconds >= 0 (or None: none), got {budget!r}")
        recorder = Recorder(c, self.store, profile, record_routing) if profile or record_routing else None
        return Generation(ids, max_tokens, sampling, recorder=recorder, **kw)

    def drive(self, gen: Generation, cache: KVCache) -> Generation:
        """Let gen's consumer run it on this thread, one step per request for
        more events."""
        def step(g: Generation) -> None:
            try:
                if g.started is None:
                    self.prefill(g, cache)
                elif g.cancelled is not None:
                    self.finish(g, g.cancelled)
                else:
                    self.decode([g])
            except BaseException as e:
                if not g.done:
                    g.end(None, e)
                raise
        gen._drive = step
        return gen

    # -- the steps
    def prefill(self, gen: Generation, cache: KVCache | None) -> bool:
        """Run gen's prompt (past what its cache already holds) and deliver its
        first token; False if it is over."""
        gen.started = t0 = time.perf_counter()
        gen.deadline = None if gen.time_budget is None else t0 + gen.time_budget
        gen.cache, gen.decoder = cache, self.tok.stream_decoder()
        gen.store_start = None if self.store is None else self.store.counters()
        if gen.recorder is not None and self.store is not None and not self.store.in_place:
            gen.store_log = self.store.start_log()
            gen.unlog = lambda log=gen.store_log: self.store.stop_log(log)
        if gen.cancelled is not None:      # cancelled while it waited: nothing is computed
            gen.t_prefill = t0
            self.finish(gen, gen.cancelled)
            return False
        # A new turn of a conversation: keep the cached positions of the prefix
        # this prompt shares with what the cache holds (at least one token is
        # always run, for its logits).
        # Scoring the prompt needs every position's output: nothing is reused.
        scoring = gen.prompt_logprobs is not None
        reuse = gen.reuse_cache and not scoring
        keep = self.prompt_cache if reuse else None
        if keep is not None:
            keep.restore(gen.prompt, cache)      # a prefix kept on disk, where it beats this cache
        gen.cached = cache.reuse(gen.prompt) if reuse else cache.truncate(0)
        if gen.recorder is not None:
            gen.recorder.phase("prefill")
        mark = self._mark(gen) if keep is not None else None
        try:
            # a long prompt's prefill is minutes on a CPU, every other request waiting for it: a
            # cancel (a client gone) is heard between layers
            x = self.tr.forward(gen.prompt_arr[gen.cached:], cache, gen.probe, last_only=not scoring, mark=mark,
                                stop=lambda: gen.cancelled is not None)
        except Stopped:                    # (the cache holds the passes done: a retry starts there)
            gen.t_prefill = time.perf_counter()
            self.finish(gen, gen.cancelled)
            return False
        if scoring:
            with gen.probe.timer("output_head"):
                gen.prompt_token_logprobs = prompt_logprobs(self.tr.head.logits, x, gen.prompt,
                                                            gen.prompt_logprobs, self.tok.unused_ids)
            x = x[-1:]
        token = self.pick([gen], x, gen.probe)[0]
        if token is None:
            return False
        cache.save_window()                # lets the next turn rewind to this prompt's end
        gen.keep = keep is not None
        gen.t_prefill = time.perf_counter()
        if gen.recorder is not None:
            gen.recorder.phase("decode")
        return self.accept(gen, token)

    def decode(self, gens: list[Generation]) -> list[Generation]:
        """One token for each of gens, in one forward pass; returns those that
        go on. A cancelled one ends first, before anything is computed."""
        live = []
        for g in gens:
            if g.cancelled is not None:
                self.finish(g, g.cancelled)
            else:
                live.append(g)
        if not live:
            return []
        t0 = time.perf_counter()
        probe = live[0].probe if len(live) == 1 else Rows([g.probe for g in live])
        x = self.tr.forward_multi(np.array([g.next for g in live]), [g.cache for g in live], probe)
        tokens = self.pick(live, x, probe)
        dt = time.perf_counter() - t0
        still = []
        for g, token in zip(live, tokens):
            if token is None:
                continue
            g.steps += 1
            g.compute_seconds += dt
            if g.recorder is not None:
                g.recorder.token(token, dt)
            try:
                if self.accept(g, token):
                    still.append(g)
            except Exception as e:       # (its constraint, its consumer's callback) it alone ends
                if not g.done:
                    g.end(None, e)
        return still

    def pick(self, gens: list[Generation], x: np.ndarray, probe) -> list[int | None]:
        """The next token of each row of x [B, D]: greedy by the head's fused
        argmax when no row changes its logits, else from the logits. The
        vocabulary's UNUSED ids are never picked, nor what a row's constraint
        forbids (each row its own: the others are untouched). None for a row
        left no token (its generation ended with NoTokenLeft)."""
        head, unused = self.tr.head, self.tok.unused_ids
        with probe.timer("output_head"):
            if all(g.sampling.plain_greedy and g.constraint is None and g.logprobs is None for g in gens):
                ids = [int(t) for t in head.argmax(x)]
                if not np.isin(ids, unused).any():
                    return ids
            logits = head.logits(x)                                             # [B, V]
        logits[:, unused] = -np.inf
        for g, row in zip(gens, logits):
            if g.logprobs is not None:          # the model's own distribution, before any mask
                g.pending = Pending(row, g.logprobs)
        out: list[int | None] = []
        for g, row in zip(gens, logits):
            try:
                if g.constraint is not None:
                    with probe.timer("constraint"):
                        allowed = g.constraint.allowed()
                        g.forced = np.count_nonzero(allowed) == 1
                        row[~allowed] = -np.inf
                out.append(best(row) if g.sampling.plain_greedy else
                           sample(row, g.sampling, g.rng, g.prompt_arr, np.asarray(g.generated, dtype=np.int64)))
            except Exception as e:       # (NoTokenLeft, a constraint's failure) this generation ends with
                out.append(None)         # the error; the batch's others go on
                g.end(None, e)
        return out

    def accept(self, gen: Generation, token: int) -> bool:
        """Deliver a token; True while the generation goes on."""
        if gen.constraint is not None:
            gen.constraint.advance(token)
        if token in self.tok.eog_ids and not gen.ignore_eos:
            if gen.pending is not None:
                gen.end_logprob = gen.pending.of(token)
            self.finish(gen, STOP_EOS, eos=token)
            return False
        gen.generated.append(token)
        if gen.pending is not None:
            gen.token_logprobs.append(gen.pending.of(token))
        gen.emit((token, gen.decoder.add(token)))
        # (no loop stop where the constraint forced the loop's tokens: a schema's thirty zeros had been cut, its
        # JSON broken; a loop the model chose inside a held text, a string's "ababab", still stops)
        gen.forced_run, gen.forced = (gen.forced_run + 1 if gen.forced else 0), False
        stop = stop_after(gen.generated, gen.max_tokens, gen.deadline, gen.cancelled,
                          loops=not gen.ignore_eos and gen.forced_run < LOOP_MIN_TOKENS)
        if stop is not None:
            self.finish(gen, stop)
            return False
        gen.next = token
        return True

    def _mark(self, gen: Generation) -> int | None:
        """Where a chat prompt's last user message starts, when the state
        there is worth keeping: computed now, and not on disk yet."""
        from .promptcache import MIN_TOKENS
        p, h = gen.prompt_arr, self._user_header
        if h is None:
            return None
        starts = np.flatnonzero(p[:len(p) - len(h) + 1] == h[0]) if len(p) >= len(h) else []
        for b in reversed(starts):
            if np.array_equal(p[b:b + len(h)], h):
                b = int(b)
                if b >= MIN_TOKENS and b > gen.cached and self.prompt_cache.wants(gen.prompt[:b]):
                    return b
                return None
        return None

    def keep_prompt(self, gen: Generation) -> None:
        """Put on disk the states its prefill computed: at the mark, and the
        whole prompt when most of it was new (the rings as save_window kept
        them at the prompt's end; the full layers' first positions are
        untouched by decoding)."""
        from .promptcache import MIN_TOKENS
        cache, pc = gen.cache, self.prompt_cache

        def save(tokens, rings: dict) -> None:
            """The full layers as they are, the sliding ones as `rings` copied them."""
            pc.save(tokens, [rings[i][0] if i in rings else k for i, k in enumerate(cache.k)],
                    [rings[i][1] if i in rings else v for i, v in enumerate(cache.v)])
        if cache.marked is not None:
            b, snap = cache.marked
            cache.marked = None
            if len(snap) == len(cache.rings):
                save(gen.prompt[:b], snap)
        saved = cache._saved
        if gen.keep_whole_prompt and len(gen.prompt) - gen.cached >= MIN_TOKENS and saved is not None \
                and saved[0] == len(gen.prompt):
            save(gen.prompt, {i: (k, v) for i, k, v in saved[1]})

    def finish(self, gen: Generation, stop: str, eos: int | None = None) -> None:
        t_end = time.perf_counter()      # (before the prompt cache's writes: they are no decode time)
        if gen.keep:
            gen.keep = False
            self.keep_prompt(gen)
        tail = gen.decoder.flush() if gen.decoder is not None else ""
        if tail:
            gen.emit((None, tail))
        cache_stats = None
        if self.store is not None and gen.store_start is not None:
            cache_stats = self.store.snapshot(since=gen.store_start)
            # (the tokens computed: the prompt past its cached part, and each decode step's; the last token
            # generated is never run)
            total = len(gen.prompt) - gen.cached + gen.steps
            cache_stats["bytes_read_per_token"] = cache_stats["bytes_read"] / total if total else 0.0
        rec, report = gen.recorder, None
        if rec is not None:
            if gen.store_log is not None:
                # on the store's own requests, as it served them: no eviction
                # policy that reads only on demand can hit more often
                from .cachesim import belady_hit_rate
                requests = [(n, layer, experts) for n, (layer, experts) in enumerate(gen.store_log)]
                cache_stats["belady_hit_rate"] = belady_hit_rate(requests, self.store.n_slots, pinned=False)
            if rec.profile:
                report = rec.report(len(gen.prompt) - gen.cached, gen.steps, gen.t_prefill - gen.started,
                                    gen.compute_seconds, cache_stats)
        gen.end(GenerationResult(
            text=self.tok.decode(gen.generated), prompt_token_ids=list(gen.prompt), token_ids=gen.generated,
            stop_reason=stop, prefill_seconds=gen.t_prefill - gen.started, decode_seconds=t_end - gen.t_prefill,
            decode_steps=gen.steps, eos_token_id=eos, profile=report, expert_cache=cache_stats,
            cached_tokens=gen.cached, routing=rec.trace() if rec is not None else None,
            logprobs=gen.token_logprobs if gen.logprobs is not None else None,
            prompt_logprobs=gen.prompt_token_logprobs))
