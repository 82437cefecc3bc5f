"""Many generations on one model: requests queue in arrival order and one
worker thread runs them, so callers on other threads (the server's event
loop) never touch the model themselves.

Up to `max_batch` requests are active at once. A request joins between
decode steps (its prompt is prefilled alone), then every step decodes one
token of every active request in a single batched forward pass: the dense
weights, and the experts the tokens share, are read once per step instead of
once per request. Kernels are batch-invariant, so a request's tokens are the
same bits whoever shares its steps.

    engine = Engine(model)
    req = engine.submit(prompt_ids, max_tokens=64, sampling=SamplingParams(...))
    for token, piece in req:        # blocks; or poll req.events from async code
        ...
    req.result                      # a GenerationResult
    req.cancel()                    # from any thread: stops before its next token
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from .forward import KVCache
from .generate import STOP_EOS, GenerationResult, check_context, stop_after
from .sampling import GREEDY, SamplingParams, make_rng, sample

_DONE = object()


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams = GREEDY
    time_budget: float | None = None
    id: int = 0
    submitted: float = field(default_factory=time.perf_counter)
    started: float | None = None          # when its prefill began
    result: GenerationResult | None = None
    error: BaseException | None = None
    events: "queue.Queue" = field(default_factory=queue.Queue)   # (token id | None, text piece), then _DONE
    _cancel: str | None = None
    _done: threading.Event = field(default_factory=threading.Event)

    def cancel(self, reason: str = "cancelled") -> None:
        self._cancel = reason

    @property
    def cancelled(self) -> str | None:
        return self._cancel

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def get(self, timeout: float | None = None):
        """The next event: (token, piece), or None once the request is over
        (then .result or .error is set). Raises queue.Empty on timeout."""
        item = self.events.get(timeout=timeout)
        return None if item is _DONE else item

    def __iter__(self) -> Iterator[tuple[int | None, str]]:
        while True:
            item = self.get()
            if item is None:
                if self.error is not None:
                    raise self.error
                return
            yield item

    def wait(self) -> GenerationResult:
        for _ in self:
            pass
        assert self.result is not None
        return self.result


class _Active:
    """A request being generated: its cache, sampler and tokens so far."""

    def __init__(self, req: Request, cache: KVCache, tokenizer):
        self.req, self.cache = req, cache
        self.rng = make_rng(req.sampling)
        self.prompt = np.asarray(req.prompt, dtype=np.int64)
        self.generated: list[int] = []
        self.decoder = tokenizer.stream_decoder()
        self.deadline = None if req.time_budget is None else req.started + req.time_budget
        self.cached = 0
        self.steps = 0
        self.t_prefill = 0.0
        self.next: int | None = None     # the token to feed at the next step


class Engine:
    """Runs submitted requests on one worker thread: first come first
    served, up to max_batch decoded together."""

    def __init__(self, model, max_batch: int = 4):
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.model = model
        self.max_batch = max_batch
        self._queue: "queue.Queue[Request | None]" = queue.Queue()
        self._lock = threading.Lock()
        self._next_id = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        self._idle: list[KVCache] = []   # caches of finished requests, kept for prefix reuse
        self.active = 0                   # requests being generated now
        self.completed = 0
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.busy_seconds = 0.0           # time spent generating
        self.steps = 0                    # batched decode steps
        self.batched_tokens = 0           # tokens those steps decoded

    @property
    def queue_length(self) -> int:
        return self._queue.qsize()

    def submit(self, prompt: list[int], max_tokens: int, sampling: SamplingParams | None = None,
               time_budget: float | None = None) -> Request:
        """Queue a generation. Bad input (an empty prompt, one that does not
        fit the context, token ids or a logit bias outside the vocabulary)
        raises here, before anything is queued."""
        if self._closed:
            raise RuntimeError("the engine is closed")
        sampling = sampling or GREEDY
        n_vocab = self.model.config.n_vocab
        prompt = [int(t) for t in prompt]
        bad = [t for t in prompt if not 0 <= t < n_vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{n_vocab - 1})")
        check_context(len(prompt), max_tokens, self.model.n_ctx)
        sampling.check_vocab(n_vocab)
        with self._lock:
            self._next_id += 1
            req = Request(prompt, max_tokens, sampling, time_budget, id=self._next_id)
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="goosedump-engine", daemon=True)
                self._thread.start()
        self._queue.put(req)
        return req

    # -- the worker ------------------------------------------------------------
    def _work(self) -> None:
        active: list[_Active] = []
        while True:
            # Join waiting requests between steps; block only when idle.
            while len(active) < self.max_batch:
                try:
                    req = self._queue.get(block=not active)
                except queue.Empty:
                    break
                if req is None:
                    return
                a = self._start(req)
                if a is not None:
                    active.append(a)
            if active:
                active = self._step(active)

    def _cache_for(self, prompt: list[int]) -> KVCache:
        """The idle cache sharing the longest prefix with prompt, else a new one."""
        if self._idle:
            best = max(range(len(self._idle)), key=lambda j: self._idle[j].shared_prefix(prompt))
            return self._idle.pop(best)
        return self.model.new_cache()

    def _start(self, req: Request) -> _Active | None:
        """Prefill a request and give its first token; None if it is over."""
        req.started = time.perf_counter()
        self.active += 1
        if req.cancelled is not None:   # cancelled while it waited: nothing is computed
            self._finish_result(req, GenerationResult(text="", prompt_token_ids=req.prompt, token_ids=[],
                                                      stop_reason=req.cancelled, prefill_seconds=0.0,
                                                      decode_seconds=0.0))
            return None
        a = _Active(req, self._cache_for(req.prompt), self.model.tokenizer)
        try:
            tr = self.model.transformer
            a.cached = a.cache.reuse(req.prompt)
            prompt = a.prompt[a.cached:]
            if req.sampling.plain_greedy:
                token = int(tr.forward(prompt, a.cache, logits="argmax")[0])
            else:
                token = sample(tr.forward(prompt, a.cache, logits="last"), req.sampling, a.rng, a.prompt, None)
            a.cache.save_window()
            a.t_prefill = time.perf_counter()
        except Exception as e:
            self._fail(a, e)
            return None
        return a if self._accept(a, token) else None

    def _step(self, active: list[_Active]) -> list[_Active]:
        tr = self.model.transformer
        try:
            tokens = np.array([a.next for a in active])
            greedy = all(a.req.sampling.plain_greedy for a in active)
            out = tr.forward_multi(tokens, [a.cache for a in active], logits="argmax" if greedy else "last")
        except Exception as e:     # a failed step (a read error) fails the requests in it
            for a in active:
                self._fail(a, e)
            return []
        self.steps += 1
        self.batched_tokens += len(active)
        still = []
        for b, a in enumerate(active):
            a.steps += 1
            if greedy or a.req.sampling.plain_greedy:
                token = int(out[b]) if greedy else int(np.argmax(out[b]))
            else:
                token = sample(out[b], a.req.sampling, a.rng, a.prompt, np.asarray(a.generated, dtype=np.int64))
            if self._accept(a, token):
                still.append(a)
        return still

    def _accept(self, a: _Active, token: int) -> bool:
        """Deliver a token; True while the request goes on (as Generation)."""
        req, stop = a.req, None
        if token in self.model.tokenizer.eog_ids:
            stop = STOP_EOS
        else:
            a.generated.append(token)
            req.events.put((token, a.decoder.add(token)))
            stop = stop_after(a.generated, req.max_tokens, a.deadline, req.cancelled)
        if stop is None:
            a.next = token
            return True
        tail = a.decoder.flush()
        if tail:
            req.events.put((None, tail))
        now = time.perf_counter()
        self._finish_result(req, GenerationResult(
            text=self.model.tokenizer.decode(a.generated), prompt_token_ids=req.prompt, token_ids=a.generated,
            stop_reason=stop, prefill_seconds=a.t_prefill - req.started, decode_seconds=now - a.t_prefill,
            decode_steps=a.steps, eos_token_id=token if stop == STOP_EOS else None, cached_tokens=a.cached))
        self._idle.append(a.cache)
        return False

    def _fail(self, a: _Active, e: BaseException) -> None:
        a.cache.reset()
        self._idle.append(a.cache)
        a.req.error = e
        self._end(a.req)

    def _finish_result(self, req: Request, result: GenerationResult) -> None:
        req.result = result
        self.prompt_tokens += result.prompt_tokens
        self.generated_tokens += result.generated_tokens
        self._end(req)

    def _end(self, req: Request) -> None:
        self.active -= 1
        self.completed += 1
        self.busy_seconds += time.perf_counter() - req.started
        del self._idle[:-self.max_batch]      # keep as many idle caches as can be active
        req._done.set()
        req.events.put(_DONE)

    def expert_stats(self) -> dict | None:
        """The expert store's counters since the model was loaded."""
        store = self.model.store
        return None if store is None else store.snapshot()

    def close(self) -> None:
        self._closed = True
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)
