"""POST /v1/completions: raw text continuation (no chat format), whole or
streamed, cut at a stop string; with echo the prompt comes first, with
logprobs its tokens' log-probabilities too (how evaluation harnesses score
a text: lm-evaluation-harness's loglikelihood requests)."""
from __future__ import annotations

import asyncio
import contextlib
import math
from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import Response

from ..logprobs import TextLogprobs, completion_logprobs
from ..reply import StopFilter
from ..reply_plan import PlanError, raw_constraint
from .bridge import EventStream, Submitted, cancel_unfinished, stop_at_string
from .choices import candidate_count, choice_count, merged, seeded, summed_usage, watched
from .errors import bad_request
from .params import (check_common, check_text_fits, finish_reason, response_id, stop_strings, token_ids,
                     top_count, usage)
from .schemas import CompletionBody
from .sse import FINGERPRINT, Chunks, completion_stream


async def handle(server, body: CompletionBody, request: Request):
    server.check_model(body.model)
    check_common(body, choices=True)
    if body.suffix:
        raise bad_request("suffix is not supported: the model does not fill in the middle", param="suffix")
    top_count(body.logprobs, "logprobs")
    batch = isinstance(body.prompt, list) and body.prompt and isinstance(body.prompt[0], (str, list))
    prompts = [prompt_ids(server, p) for p in (body.prompt if batch else [body.prompt])]
    n = choice_count(body.n, len(prompts))
    pool = candidate_count(body.best_of, n, len(prompts), bool(body.stream))
    # echo with max_tokens 0 (OpenAI's legacy use, older harnesses'): the
    # prompt scored, nothing generated (the prefill's one token is dropped)
    score_only = bool(body.echo) and body.max_tokens == 0
    limits = [1 if score_only else server.limit(body.max_tokens, len(ids), "max_tokens", "prompt") for ids in prompts]
    choices: list[TextChoice] = []
    try:
        for ids, limit in zip(prompts, limits):
            for k in range(pool):
                fields = seeded(body, k, server.defaults.sampling)
                choices.append(TextChoice(server, fields, ids, limit, k == 0, score_only, pool > n))
    except BaseException:
        for c in choices:
            cancel_unfinished(c.sub.gen)
        raise
    rid, created = response_id("cmpl-")
    gens = [c.sub.gen for c in choices]
    if body.stream:
        chunks = Chunks(rid, created, "text_completion", server.name, "text",
                        bool((body.stream_options or {}).get("include_usage")))
        return EventStream(completion_stream(_streams(choices, chunks)), gens)
    async with watched(request, gens):
        texts = await asyncio.gather(*(c.text() for c in choices))
    if any(g.result is None for g in gens):
        return Response(status_code=499)       # the client went away
    picked = best(list(zip(choices, texts)), pool, n)
    return {"id": rid, "object": "text_completion", "created": created, "model": server.name,
            "system_fingerprint": FINGERPRINT,
            "choices": [{"index": i, "text": text, "logprobs": c.logprobs(), "finish_reason": c.finish()}
                        for i, (c, text) in enumerate(picked)],
            # every completion generated counts, as OpenAI bills best_of's
            "usage": summed_usage([c.usage() for c in choices], [c.first for c in choices])}


def best(done: list, pool: int, n: int) -> list:
    """Each prompt's n completions of the highest log-probability per token
    out of its pool (best_of), most likely first (ties: in the order made);
    all of them, in order, when the pool is n."""
    if pool == n:
        return done
    out = []
    for i in range(0, len(done), pool):
        group = done[i:i + pool]
        out += sorted(group, key=lambda ct: -ct[0].mean_logprob())[:n]
    return out


def prompt_ids(server, prompt) -> list[int]:
    """A prompt's token ids: text (special tokens such as "<|start|>" read as
    such, as llama.cpp reads raw text) or ids, checked."""
    if isinstance(prompt, str):
        check_text_fits(len(prompt), server.tok, server.model.n_ctx, "prompt")
    ids = server.tok.encode(prompt, allow_special=True) if isinstance(prompt, str) else \
        token_ids(server.tok, prompt, "prompt")
    if not ids:
        raise bad_request("The prompt is empty: nothing to continue from.", param="prompt")
    return ids


class TextChoice:
    """One choice: its generation (submitted here), stop strings, echo and
    log-probabilities. first: its prompt's first choice (usage counts each
    prompt once); score_only: the echoed prompt alone, what was generated
    dropped."""

    def __init__(self, server, body: CompletionBody, ids: list[int], limit: int, first: bool,
                 score_only: bool = False, ranked: bool = False):
        try:
            constraint = raw_constraint(server.tok, body.grammar, body.json_schema,   # each its own state
                                        response_format=body.response_format)
        except PlanError as e:
            raise bad_request(str(e), param=e.param) from None
        self.echo = Echo(server.tok, ids) if body.echo else None
        scored = body.logprobs if self.echo is not None else None
        # ranked (a candidate of best_of): its tokens' log-probabilities are
        # kept to rank it, shown only if the request asks for them
        self.shown = body.logprobs is not None
        logprobs = 0 if ranked and body.logprobs is None else body.logprobs
        self.stop = StopFilter(stop_strings(body.stop))       # (checked before the generation is queued)
        self.sub = server.submit(ids, limit, body, "max_tokens", "prompt", constraint, logprobs, scored)
        self.logs = None if logprobs is None else \
            TextLogprobs(server.tok, self.sub.gen, self.echo.chars if self.echo else 0)
        self.first, self.score_only = first, score_only

    async def text(self) -> str:
        text = [self.echo.text] if self.echo is not None else []
        async with text_pieces(self.sub, self.stop, self.logs) as pieces:
            async for piece in pieces:
                text.append(piece)
        return text[0] if self.score_only else "".join(text)

    def logprobs(self) -> dict | None:
        if not self.shown:
            return None
        if self.echo is None:
            return self.logs.all()
        prompt = self.echo.logprobs(self.sub.gen.result.prompt_logprobs)
        return prompt if self.score_only else joined(prompt, self.logs.all())

    def mean_logprob(self) -> float:
        """The log-probability per token of what it generated (best_of's
        measure, as OpenAI's): its text's tokens, up to a stop string, and
        the end token when the model ended it (an empty completion is
        that token alone)."""
        if self.score_only:
            return 0.0
        lps = [lp.logprob for lp in self.logs.lps]
        end = self.sub.gen.end_logprob
        if end is not None and not self.stop.hit:
            lps.append(end.logprob)
        return sum(lps) / len(lps) if lps else -math.inf

    def finish(self) -> str:
        r = self.sub.gen.result
        return "length" if self.score_only else finish_reason(r.stop_reason, self.stop.hit)

    def usage(self) -> dict:
        u = usage(self.sub.gen.result)
        if self.score_only:
            u = {**u, "completion_tokens": 0, "total_tokens": u["prompt_tokens"]}
        return u


class Echo:
    """The prompt as echo returns it: its text (as the tokens decode) and
    where each token's text starts in it."""

    def __init__(self, tok, ids: list[int]):
        self.tok, self.ids = tok, ids
        decoder, pieces, self.offsets, chars = tok.stream_decoder(), [], [], 0
        for t in ids:
            self.offsets.append(chars)
            pieces.append(decoder.add(t))
            chars += len(pieces[-1])
        self.text = "".join(pieces) + decoder.flush()
        self.chars = len(self.text)

    def logprobs(self, lps: list | None) -> dict:
        """The prompt's tokens in the legacy form: the first with none (nothing
        comes before it), the rest as the generation scored them. A token the
        model never writes (an UNUSED id) has probability 0: -9999 stands for
        its -inf, which JSON cannot carry."""
        out = completion_logprobs(self.tok, lps or [], self.offsets[1:])
        first = self.tok.token_bytes(self.ids[0]).decode("utf-8", errors="replace")
        return {"tokens": [first] + out["tokens"],
                "token_logprobs": [None] + [v if math.isfinite(v) else -9999.0 for v in out["token_logprobs"]],
                "top_logprobs": [None] + out["top_logprobs"], "text_offset": [0] + out["text_offset"]}


def joined(a: dict, b: dict) -> dict:
    """Two runs of legacy log-probabilities, one after the other."""
    return {k: a[k] + b[k] for k in a}


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
            if stop.hit:
                stop_at_string(sub)
            if out:
                yield out
    if sub.gen.result is not None and not stop.hit:
        tail = stop.flush()
        if tail:
            yield tail


async def _streams(choices: list[TextChoice], chunks: Chunks) -> AsyncIterator[str]:
    """The choices' chunks, merged as they come, then the usage of all."""
    async for s in merged([_stream(c, chunks.at(i)) for i, c in enumerate(choices)]):
        yield s
    if chunks.include_usage and all(c.sub.gen.result is not None for c in choices):
        yield chunks.usage(summed_usage([c.usage() for c in choices], [c.first for c in choices]))


async def _stream(c: TextChoice, chunks: Chunks) -> AsyncIterator[str]:
    """A choice's chunks; each carries the log-probabilities of the tokens
    taken since the last one (text held back for a stop string comes later).
    With echo the prompt comes first, in a chunk of its own once the prefill
    has scored it."""
    sub, logs, echo = c.sub, c.logs, c.echo

    def echoed() -> str:
        return chunks.choice(echo.text, logprobs=None if logs is None else echo.logprobs(sub.gen.prompt_token_logprobs))

    said = echo is None
    async with text_pieces(sub, c.stop, logs) as pieces:
        async for piece in pieces:
            if not said:
                said = True
                yield echoed()
            if not c.score_only:
                yield chunks.choice(piece, logprobs=logs.take() if logs is not None else None)
    if sub.gen.result is None:
        return
    if not said:
        yield echoed()
    rest = logs.take() if logs is not None and not c.score_only else None
    for s in chunks.ending("", c.finish(), None, rest):
        yield s
