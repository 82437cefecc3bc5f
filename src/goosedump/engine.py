"""Many generations on one model: requests queue in arrival order and one
worker thread runs them, so callers on other threads (the server's event
loop) never touch the model themselves.

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

from .generate import GenerationResult, check_context
from .sampling import GREEDY, SamplingParams

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


class Engine:
    """Runs submitted requests on one worker thread, first come first served."""

    def __init__(self, model):
        self.model = model
        self._queue: "queue.Queue[Request]" = queue.Queue()
        self._lock = threading.Lock()
        self._next_id = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        self.active = 0                   # requests being generated now
        self.completed = 0
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.busy_seconds = 0.0           # time spent generating

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

    def _work(self) -> None:
        while True:
            req = self._queue.get()
            if req is None:
                return
            self._run(req)

    def _run(self, req: Request) -> None:
        req.started = time.perf_counter()
        self.active += 1
        try:
            if req.cancelled is None:
                gen = self.model.generate_stream(req.prompt, req.max_tokens, req.time_budget, sampling=req.sampling)
                for token, piece in gen.events():
                    req.events.put((token, piece))
                    if req.cancelled is not None:
                        gen.cancel(req.cancelled)
                req.result = gen.result
            else:    # cancelled while it waited: nothing was computed
                req.result = GenerationResult(text="", prompt_token_ids=req.prompt, token_ids=[],
                                              stop_reason=req.cancelled, prefill_seconds=0.0, decode_seconds=0.0)
            if req.result is not None:
                self.prompt_tokens += req.result.prompt_tokens
                self.generated_tokens += req.result.generated_tokens
        except Exception as e:   # reported to the request's owner, the worker lives on
            req.error = e
        finally:
            self.active -= 1
            self.completed += 1
            self.busy_seconds += time.perf_counter() - req.started
            req._done.set()
            req.events.put(_DONE)

    def close(self) -> None:
        self._closed = True
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)
