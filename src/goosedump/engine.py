"""Many generations on one model: they queue in arrival order and one worker
thread runs them through the model's Stepper, so callers on other threads
(the server's event loop) never touch the model themselves.

Up to `max_batch` generations are active at once. One joins between decode
steps (its prompt is prefilled alone), then every step decodes one token of
every active generation in a single batched forward pass: the dense
weights, and the experts the tokens share, are read once per step instead
of once per generation. Kernels are batch-invariant, so a generation's
tokens are the same bits whoever shares its steps.

    engine = Engine(model)
    gen = engine.submit(prompt_ids, max_tokens=64, sampling=SamplingParams(...))
    for token, piece in gen.events():   # blocks; or on_event=f: f(gen, event) on the worker thread
        ...
    gen.result                          # a GenerationResult
    gen.cancel()                        # from any thread: stops before its next token
"""
from __future__ import annotations

import queue
import threading
import time

from .generate import Generation
from .kvcache import KVCache


class Engine:
    """Runs submitted generations on one worker thread: first come first
    served, up to max_batch decoded together."""

    def __init__(self, model, max_batch: int = 4):
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.model = model
        self.max_batch = max_batch
        self._queue: "queue.Queue[Generation | None]" = queue.Queue()
        self._lock = threading.Lock()
        self._next_id = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        self._idle: list[KVCache] = []   # caches of finished generations, kept for prefix reuse
        self._prompt_len: dict[int, int] = {}   # id(idle cache) -> the prompt it last held
        self.active = 0                   # generations being run now
        self.completed = 0
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.busy_seconds = 0.0           # from each generation's start to its end, summed
        self.steps = 0                    # batched decode steps
        self.batched_tokens = 0           # tokens those steps decoded

    @property
    def alive(self) -> bool:
        """Its worker is running (or not started yet): what a health check asks."""
        return not self._closed and (self._thread is None or self._thread.is_alive())

    @property
    def queue_length(self) -> int:
        return self._queue.qsize()

    def submit(self, prompt: list[int], max_tokens: int, sampling=None, time_budget: float | None = None,
               on_event=None, profile: bool = False, constraint=None, logprobs: int | None = None,
               prompt_logprobs: int | None = None) -> Generation:
        """Queue a generation. Bad input (an empty prompt, one that does not
        fit the context, token ids or a logit bias outside the vocabulary)
        raises here, before anything is queued. on_event(generation, event) is
        called on the worker thread with each (token, piece), then with None
        once the generation is over; without it, events() gives them.
        constraint: goosedump.structured's mask of the tokens allowed next
        (a Gate or Free), this generation's own. logprobs, prompt_logprobs:
        see Model.generate_stream."""
        if self._closed:
            raise RuntimeError("the engine is closed")
        if self._thread is not None and not self._thread.is_alive():
            raise RuntimeError("the engine's worker has stopped: a generation would wait for ever")
        gen = self.model.stepper.new(prompt, max_tokens, sampling, profile=profile, time_budget=time_budget,
                                     on_event=on_event, before_end=self._ended, constraint=constraint,
                                     keep_whole_prompt=False, logprobs=logprobs, prompt_logprobs=prompt_logprobs)
        with self._lock:
            self._next_id += 1
            gen.id = self._next_id
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="goosedump-engine", daemon=True)
                self._thread.start()
        self._queue.put(gen)
        return gen

    # -- the worker ------------------------------------------------------------
    def _work(self) -> None:
        stepper = self.model.stepper
        active: list[Generation] = []
        while True:
            if self._closed:         # (between steps: a full batch had run on to its limits)
                return self._shut(active)
            # Join waiting generations between steps; block only when idle.
            while len(active) < self.max_batch:
                try:
                    gen = self._queue.get(block=not active)
                except queue.Empty:
                    break
                if gen is None:
                    return self._shut(active)
                self.active += 1
                # (cancelled while it waited: no cache, so none is taken from, or written for, another)
                if self._run(lambda: stepper.prefill(gen, None if gen.cancelled else self._cache_for(gen.prompt)),
                             [gen]):
                    active.append(gen)
            if active:
                step = active
                active = self._run(lambda: stepper.decode(step), step) or []
                self.steps += 1
                self.batched_tokens += len(step)

    def _shut(self, active: list[Generation]) -> None:
        """close(): the generations running and those queued end now,
        cancelled (their consumers had waited for ever)."""
        stepper = self.model.stepper
        for g in active:
            if not g.done:
                if g.cancelled is None:
                    g.cancel("cancelled")
                self._run(lambda g=g: stepper.finish(g, g.cancelled), [g])
        while True:
            try:
                g = self._queue.get_nowait()
            except queue.Empty:
                return
            if g is not None and not g.done:
                if g.cancelled is None:
                    g.cancel("cancelled")
                self.active += 1
                self._run(lambda g=g: stepper.prefill(g, None), [g])     # (cancelled: computes nothing)

    @staticmethod
    def _run(step, gens: list[Generation]):
        """A step; its failure (a read error) fails the generations in it."""
        try:
            return step()
        except Exception as e:
            for g in gens:
                if not g.done:
                    g.end(None, e)
            return None

    def _cache_for(self, prompt: list[int]) -> KVCache:
        """An idle cache for prompt, else a new one. Reusing a cache discards
        its tokens past the shared prefix, so a prompt that continues a
        cache's last prompt (the next turn of its conversation) takes that
        cache, the one sharing the longest prefix among such (the oldest of
        equals), even where another conversation's cache shares more (the
        same turns, asked again in another conversation); while there are
        fewer than max_batch caches, a prompt that continues none (a new
        conversation with a known system prompt, say) gets a new cache
        instead of erasing another conversation; at max_batch it takes the
        cache sharing the longest prefix."""
        if self._idle:
            shared = [c.shared_prefix(prompt) for c in self._idle]
            own = [j for j, c in enumerate(self._idle) if shared[j] >= self._prompt_len.get(id(c), 0)]
            room = self.active + len(self._idle) <= self.max_batch     # self.active counts this one
            if own or not room:
                best = max(own or range(len(shared)), key=lambda j: (shared[j], -j))
                cache = self._idle.pop(best)
                keep = self.model.stepper.prompt_cache
                if not own and keep is not None:
                    keep.save_cache(cache)    # another conversation's: to disk before it is overwritten
                return cache
        return self.model.new_cache()

    def _ended(self, gen: Generation) -> None:
        """Counts a generation that is over and keeps its cache (on the worker
        thread, before its consumer hears of the end)."""
        self.active -= 1
        self.completed += 1
        self.busy_seconds += time.perf_counter() - (gen.started or gen.submitted)
        if gen.result is not None:
            self.prompt_tokens += gen.result.prompt_tokens
            self.generated_tokens += gen.result.generated_tokens
        if gen.cache is not None:
            if gen.error is not None:
                gen.cache.reset()
            self._idle.append(gen.cache)
            # (a prefill stopped midway holds part of its prompt: a retry of it is its own)
            self._prompt_len[id(gen.cache)] = 0 if gen.error is not None else min(len(gen.prompt), gen.cache.n)
        keep = self.model.stepper.prompt_cache
        for dropped in self._idle[:-self.max_batch]:
            self._prompt_len.pop(id(dropped), None)
            if keep is not None:
                keep.save_cache(dropped)      # a conversation set aside goes to disk, not away
        del self._idle[:-self.max_batch]      # keep as many idle caches as can be active

    def close(self) -> None:
        self._closed = True
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)
