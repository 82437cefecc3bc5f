"""From the engine's worker thread to the event loop: each event a generation
produces is pushed onto the loop (loop.call_soon_threadsafe) into an asyncio
queue, so the loop never blocks on the engine and no thread waits per
request. A client that goes away cancels its generation before the engine's
next step: for a streamed response Starlette notices and closes the
stream; for a plain one a watcher reads the connection's disconnect."""
from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import StreamingResponse

from ..sampling import NoTokenLeft
from .errors import bad_request
from .metrics import Metrics


def stop_at_string(sub: "Submitted") -> None:
    """A stop string ended the reply: the generation stops, and its result
    (usage, token ids) will hold the tokens taken so far, not those the
    worker made before it heard or ended for another reason meanwhile."""
    if sub.stopped_at is None:
        sub.stopped_at = sub.taken
    if sub.gen.cancelled is None:
        sub.gen.cancel("stop")


def cancel_unfinished(gen) -> None:
    """The client went away, the response was abandoned, or never started:
    the engine stops before its next token (a stop string's cancel stays)."""
    if not gen.done and gen.cancelled is None:
        gen.cancel("disconnected")


class Submitted:
    """A generation submitted from the event loop, its events queued on the loop."""

    def __init__(self, engine, prompt: list[int], max_tokens: int, sampling, time_budget: float | None,
                 metrics: Metrics, live: dict, constraint=None, logprobs: int | None = None,
                 prompt_logprobs: int | None = None):
        loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.taken = 0          # token events the consumer has taken
        self.stopped_at: int | None = None     # how many when a stop string ended the reply
        self.tokenizer = engine.model.tokenizer

        def on_event(gen, event) -> None:        # on the engine's thread
            if event is None:
                metrics.finished(gen)
                live.pop(gen.id, None)
            elif event[0] is not None:
                metrics.token()
            try:
                loop.call_soon_threadsafe(self.queue.put_nowait, event)
            except RuntimeError:      # the loop is closed: the server is shutting down
                pass

        self.gen = engine.submit(prompt, max_tokens, sampling, time_budget=time_budget, on_event=on_event,
                                 constraint=constraint, logprobs=logprobs, prompt_logprobs=prompt_logprobs)
        live[self.gen.id] = self.gen

    async def _events(self, request: Request | None) -> AsyncIterator[tuple]:
        watcher = asyncio.create_task(self._watch(request)) if request is not None else None
        try:
            while True:
                event = await self.queue.get()
                if event is None:
                    if self.stopped_at is not None:     # (the result is settled once the end is heard)
                        self.gen.cut(self.stopped_at, self.tokenizer)
                    if isinstance(self.gen.error, NoTokenLeft):     # the request's doing: a 400
                        raise bad_request(str(self.gen.error)) from None
                    if self.gen.error is not None:
                        raise self.gen.error
                    return
                if event[0] is not None:
                    self.taken += 1
                yield event
        finally:
            if watcher is not None:
                watcher.cancel()
            cancel_unfinished(self.gen)

    def events(self, request: Request | None = None):
        """The generation's (token, text) events as they come, closed (the
        generation cancelled if unfinished) when the consumer leaves its
        `async with`. With request: a disconnect of its client cancels too."""
        return contextlib.aclosing(self._events(request))

    async def _watch(self, request: Request) -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                cancel_unfinished(self.gen)
                return


class EventStream(StreamingResponse):
    """A generation's stream: server-sent events (or ollama's lines of
    JSON). However the response ends (finished, client gone, cancelled
    before its first event), the generation does not outlive it."""

    def __init__(self, content, gen, media_type: str = "text/event-stream"):
        super().__init__(content, media_type=media_type, headers={"Cache-Control": "no-cache"})
        self.gens = gen if isinstance(gen, list) else [gen]     # a response of several choices: theirs

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            for gen in self.gens:
                cancel_unfinished(gen)
