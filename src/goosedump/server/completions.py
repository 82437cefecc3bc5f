"""POST /v1/completions: raw text continuation (no chat format), whole or
streamed, cut at a stop string."""
from __future__ import annotations

import contextlib
from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import Response

from ..logprobs import TextLogprobs
from ..reply import StopFilter
from ..reply_plan import PlanError, raw_constraint
from .bridge import EventStream, Submitted
from .errors import bad_request
from .params import (check_common, check_text_fits, finish_reason, response_id, stop_strings, top_count,
                     usage)
from .schemas import CompletionBody
from .sse import FINGERPRINT, Chunks, completion_stream


async def handle(server, body: CompletionBody, request: Request):
    server.check_model(body.model)
    check_common(body)
    for field, bad in (("echo", body.echo), ("suffix", body.suffix), ("best_of", body.best_of not in (None, 1))):
        if bad:
            raise bad_request(f"{field} is not supported", param=field)
    top_count(body.logprobs, "logprobs")
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise bad_request("a batch of prompts is not supported: send one prompt per request", param="prompt")
        prompt = prompt[0]
    # Raw text may spell special tokens ("<|start|>"), as llama.cpp reads it.
    if isinstance(prompt, str):
        check_text_fits(len(prompt), server.tok, server.model.n_ctx, "prompt")
    ids = server.tok.encode(prompt, allow_special=True) if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise bad_request("The prompt is empty: nothing to continue from.", param="prompt")
    n = server.limit(body.max_tokens, len(ids), "max_tokens", "prompt")
    try:
        constraint = raw_constraint(server.tok, body.grammar, body.json_schema)
    except PlanError as e:
        raise bad_request(str(e), param=e.param) from None
    sub = server.submit(ids, n, body, "max_tokens", "prompt", constraint, body.logprobs)
    stop = StopFilter(stop_strings(body.stop))
    logs = None if body.logprobs is None else TextLogprobs(server.tok, sub.gen)
    rid, created = response_id("cmpl-")
    if body.stream:
        chunks = Chunks(rid, created, "text_completion", server.name, "text",
                        bool((body.stream_options or {}).get("include_usage")))
        return EventStream(completion_stream(_stream(sub, stop, chunks, logs)), sub.gen)
    text = []
    async with text_pieces(sub, stop, logs, request) as pieces:
        async for piece in pieces:
            text.append(piece)
    r = sub.gen.result
    if r is None:
        return Response(status_code=499)
    return {"id": rid, "object": "text_completion", "created": created, "model": server.name,
            "system_fingerprint": FINGERPRINT,
            "choices": [{"index": 0, "text": "".join(text), "logprobs": logs.all() if logs is not None else None,
                         "finish_reason": finish_reason(r.stop_reason, stop.hit)}],
            "usage": usage(r)}


def text_pieces(sub: Submitted, stop: StopFilter, logs: TextLogprobs | None, request: Request | None = None,
                tokens: list | None = None):
    """The generated text in pieces, cut at a stop string (_cut); tokens, if
    given, gets each token id up to the one that completes it."""
    return contextlib.aclosing(_cut(sub, stop, logs, request, tokens))


async def _cut(sub: Submitted, stop: StopFilter, logs: TextLogprobs | None,
               request: Request | None, tokens: list | None) -> AsyncIterator[str]:
    """The generated text in pieces, cut at a stop string; logs takes each
    token up to the one that completes the stop string."""
    async with sub.events(request) as stream:
        async for token, piece in stream:
            if stop.hit:
                continue
            if token is not None and tokens is not None:
                tokens.append(token)
            if token is not None and logs is not None:
                logs.add(piece)
            if not piece:
                continue
            out = stop.push(piece)
            if stop.hit and sub.gen.cancelled is None:
                sub.gen.cancel("stop")
            if out:
                yield out
    if sub.gen.result is not None and not stop.hit:
        tail = stop.flush()
        if tail:
            yield tail


async def _stream(sub: Submitted, stop: StopFilter, chunks: Chunks, logs: TextLogprobs | None) -> AsyncIterator[str]:
    """The chunks; each carries the log-probabilities of the tokens taken
    since the last one (text held back for a stop string comes later)."""
    async with text_pieces(sub, stop, logs) as pieces:
        async for piece in pieces:
            yield chunks.choice(piece, logprobs=logs.take() if logs is not None else None)
    r = sub.gen.result
    if r is None:
        return
    for s in chunks.ending("", finish_reason(r.stop_reason, stop.hit), usage(r),
                           logs.take() if logs is not None else None):
        yield s
