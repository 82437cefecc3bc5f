"""Several choices in one response (OpenAI's `n`, a batch of prompts on
/v1/completions): each choice its own generation, all submitted at once so
that the engine decodes them together (each prompt is still prefilled on
its own); one watcher of the client for them all; streamed, their chunks
merged as they come, each under its choice's index."""
from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator

from fastapi import Request

from .bridge import cancel_unfinished
from .errors import bad_request

MAX_CHOICES = 8


def choice_count(n, prompts: int = 1) -> int:
    """The choices per prompt a request asks for (n; None: 1), at most
    MAX_CHOICES in all."""
    n = 1 if n is None else n
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise bad_request(f"n must be a whole number of choices, at least 1, got {n!r}", param="n")
    if n * prompts > MAX_CHOICES:
        what = f"n={n} for each of {prompts} prompts" if prompts > 1 else f"n={n}"
        raise bad_request(f"{what} asks for {n * prompts} choices; this server gives at most {MAX_CHOICES} in "
                          "one response", param="n" if prompts == 1 else "prompt")
    return n


def candidate_count(best_of, n: int, prompts: int, stream: bool) -> int:
    """How many completions each prompt's n choices are picked from
    (OpenAI's legacy best_of; None: n), at most MAX_CHOICES in all."""
    if best_of is None:
        return n
    if isinstance(best_of, bool) or not isinstance(best_of, int) or best_of < n:
        raise bad_request(f"best_of must be a whole number of completions, at least n ({n}), got {best_of!r}",
                          param="best_of")
    if best_of > n and stream:
        raise bad_request(f"best_of={best_of} above n={n} cannot be streamed: which completions are the best is "
                          "known only when all have ended", param="best_of")
    if best_of * prompts > MAX_CHOICES:
        what = f"best_of={best_of} for each of {prompts} prompts" if prompts > 1 else f"best_of={best_of}"
        raise bad_request(f"{what} asks for {best_of * prompts} completions; this server generates at most "
                          f"{MAX_CHOICES} for one response", param="best_of")
    return best_of


def seeded(body, k: int, defaults: dict):
    """Choice k's fields: the request's with its seed (else serve's -s)
    plus k (choice 0 has the seed itself; without one every choice draws
    a fresh one)."""
    seed = body.seed if body.seed is not None else defaults.get("seed")
    if k == 0 or seed is None or seed == -1:
        return body
    return body.model_copy(update={"seed": seed + k})


@contextlib.asynccontextmanager
async def watched(request: Request | None, gens: list):
    """While the body runs, a disconnect of the client cancels every
    choice's generation; none outlives it."""
    async def watch():
        while True:
            if (await request.receive())["type"] == "http.disconnect":
                for g in gens:
                    cancel_unfinished(g)
                return
    task = asyncio.create_task(watch()) if request is not None else None
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
        for g in gens:
            cancel_unfinished(g)


async def merged(streams: list[AsyncIterator[str]]) -> AsyncIterator[str]:
    """The items of several streams, each as it comes (one stream: itself)."""
    if len(streams) == 1:
        async for x in streams[0]:
            yield x
        return
    queue: asyncio.Queue = asyncio.Queue()
    end = object()

    async def pump(stream):
        try:
            async for x in stream:
                await queue.put(x)
        except Exception as e:          # raised to the consumer, in order
            await queue.put(e)
        finally:
            await queue.put(end)

    tasks = [asyncio.create_task(pump(s)) for s in streams]
    left = len(tasks)
    try:
        while left:
            x = await queue.get()
            if x is end:
                left -= 1
            elif isinstance(x, Exception):
                raise x
            else:
                yield x
    finally:
        for t in tasks:
            t.cancel()


def summed_usage(usages: list[dict], firsts: list[bool]) -> dict:
    """The usage of several choices: each prompt's tokens once (firsts: the
    choices that are their prompt's first), the completions' all."""
    out: dict = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0,
                 "prompt_tokens_details": {"cached_tokens": 0}}
    reasoning = None
    for u, first in zip(usages, firsts):
        if first:
            out["prompt_tokens"] += u["prompt_tokens"]
            out["prompt_tokens_details"]["cached_tokens"] += u["prompt_tokens_details"]["cached_tokens"]
        out["completion_tokens"] += u["completion_tokens"]
        if "completion_tokens_details" in u:
            reasoning = (reasoning or 0) + u["completion_tokens_details"]["reasoning_tokens"]
    out["total_tokens"] = out["prompt_tokens"] + out["completion_tokens"]
    if reasoning is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return out
