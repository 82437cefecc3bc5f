"""POST /v1/chat/completions: a chat turn, whole or streamed as
chat.completion.chunk deltas (llama.cpp's and vLLM's form: reasoning_content
beside content; tool calls by index). Both are built from the same reply
events, so they are equal by construction."""
from __future__ import annotations

import asyncio
from typing import AsyncIterator, NamedTuple

from fastapi import Request
from fastapi.responses import Response

from ..logprobs import ContentLogprobs
from ..reply import ReplyEvent, ReplyStream
from ..reply_plan import tool_names
from .bridge import EventStream, Submitted, cancel_unfinished
from .choices import choice_count, merged, seeded, summed_usage, watched
from .errors import bad_request
from .params import check_common, finish_reason, response_id, stop_strings, top_count, usage
from .schemas import ChatBody
from .sse import FINGERPRINT, Chunks, completion_stream


class ChatDeltas:
    """Reply events as chat.completion.chunk deltas."""

    def __call__(self, events: list[ReplyEvent]) -> list[dict]:
        out = []
        for what, item, text in events:
            if what == "start":
                if item.kind == "reasoning" and item.seq > 0:
                    out.append({"reasoning_content": "\n"})    # reasoning items join with a newline
                elif item.kind == "tool_call":
                    out.append({"tool_calls": [{"index": item.seq, "id": item.call_id, "type": "function",
                                                "function": {"name": item.name, "arguments": ""}}]})
            elif what == "delta":
                if item.kind == "content":
                    out.append({"content": text})
                elif item.kind == "reasoning":
                    out.append({"reasoning_content": text})
                else:
                    out.append({"tool_calls": [{"index": item.seq, "function": {"arguments": text}}]})
        return out


def chat_message(reply: ReplyStream) -> dict:
    r = reply.reply
    m: dict = {"role": "assistant", "content": r.content}
    if r.tool_calls:
        m["tool_calls"] = r.tool_calls
        if not m["content"]:
            m["content"] = None        # as OpenAI: no text beside the calls
    if r.reasoning_content:
        m["reasoning_content"] = r.reasoning_content
    return m


def _finish(result, reply: ReplyStream) -> str:
    return finish_reason(result.stop_reason, reply.stopped, bool(reply.tool_calls))


def render(server, body: ChatBody):
    """(prompt ids, the reply's plan) of a chat body (here and in its token count)."""
    return server.render(body.messages, body.tools, body.tool_choice, body.reasoning_effort, "messages", body,
                         body.response_format, prefill=continues(body))


def continues(body: ChatBody) -> bool:
    """Whether the reply continues the last message (vLLM's fields: the
    prompt then ends in that message, with no new assistant turn)."""
    if body.continue_final_message:
        if body.add_generation_prompt:
            raise bad_request("continue_final_message and add_generation_prompt cannot both be true: the reply "
                              "either continues the last message or starts a new one", param="add_generation_prompt")
        last = body.messages[-1] if body.messages else None
        if not (isinstance(last, dict) and last.get("role") == "assistant"):
            raise bad_request("continue_final_message needs an assistant message last, the start of the reply",
                              param="continue_final_message")
        return True
    if body.add_generation_prompt is False:
        raise bad_request("add_generation_prompt false is supported only with continue_final_message true: a "
                          "reply starts a new assistant turn or continues the last one", param="add_generation_prompt")
    return False


async def handle(server, body: ChatBody, request: Request):
    server.check_model(body.model)
    check_common(body, choices=True)
    n_choices = choice_count(body.n)
    n_top = logprobs_asked(body.logprobs, body.top_logprobs)
    stops = stop_strings(body.stop)
    prompt, plan = render(server, body)
    limit = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    n = server.limit(limit, len(prompt), param, "messages")
    choices: list[ChatChoice] = []
    try:
        for k in range(n_choices):
            fields = seeded(body, k, server.defaults.sampling)
            sub = server.submit(prompt, n, fields, param, "messages", plan.gate(server.tok), n_top)
            choices.append(ChatChoice(sub, ReplyStream(server.tok, stops, plan.prefix, tools=tool_names(plan.tools)),
                                      None if n_top is None else ContentLogprobs(server.tok, sub.gen)))
    except BaseException:
        for c in choices:
            cancel_unfinished(c.sub.gen)
        raise
    rid, created = response_id("chatcmpl-")
    gens = [c.sub.gen for c in choices]
    if body.stream:
        chunks = Chunks(rid, created, "chat.completion.chunk", server.name, "delta",
                        bool((body.stream_options or {}).get("include_usage")))
        return EventStream(completion_stream(_streams(server, choices, chunks)), gens)
    async with watched(request, gens):
        await asyncio.gather(*(server.run_reply(c.sub, c.reply, None, c.lps) for c in choices))
    if any(g.result is None for g in gens):      # the client went away
        return Response(status_code=499)
    return {"id": rid, "object": "chat.completion", "created": created, "model": server.name,
            "system_fingerprint": FINGERPRINT,
            "choices": [{"index": i, "message": chat_message(c.reply), "logprobs": content_logprobs(c.lps),
                         "finish_reason": _finish(c.sub.gen.result, c.reply)} for i, c in enumerate(choices)],
            "usage": summed_usage([c.usage() for c in choices], [i == 0 for i in range(len(choices))])}


class ChatChoice(NamedTuple):
    sub: Submitted
    reply: ReplyStream
    lps: ContentLogprobs | None

    def usage(self) -> dict:
        return usage(self.sub.gen.result, self.reply.reasoning_tokens)


def logprobs_asked(logprobs: bool | None, top: int | None) -> int | None:
    """The alternatives per token a request asks for (None: no logprobs)."""
    if top is not None:
        if not logprobs:
            raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs")
    return (top_count(top, "top_logprobs") or 0) if logprobs else None


def content_logprobs(lps: ContentLogprobs | None, entries: list[dict] | None = None) -> dict | None:
    if lps is None:
        return None
    return {"content": lps.entries if entries is None else entries, "refusal": None}


async def _streams(server, choices: list[ChatChoice], chunks: Chunks) -> AsyncIterator[str]:
    """The choices' chunks, merged as they come, then the usage of all."""
    async for s in merged([_stream(server, c, chunks.at(i)) for i, c in enumerate(choices)]):
        yield s
    if chunks.include_usage and all(c.sub.gen.result is not None for c in choices):
        yield chunks.usage(summed_usage([c.usage() for c in choices], [i == 0 for i in range(len(choices))]))


async def _stream(server, c: ChatChoice, chunks: Chunks) -> AsyncIterator[str]:
    """A choice's chunks; a content delta carries the log-probabilities of
    the content tokens fed since the last one did (a stop string's held-back
    text can come a token later than the token)."""
    sub, reply, lps = c
    deltas = ChatDeltas()
    started = False

    def chunk(d: dict) -> str:
        new = lps.take() if lps is not None and "content" in d else None
        return chunks.choice(d, logprobs=content_logprobs(lps, new) if new else None)

    async with sub.events() as stream:
        async for token, _ in stream:
            if token is None:
                continue
            if not started:       # the role comes with the first generated token
                started = True
                yield chunks.choice({"role": "assistant", "content": ""})
            for d in deltas(server.feed(sub, reply, token, lps)):
                yield chunk(d)
    r = sub.gen.result
    if r is None:
        return
    if not started:
        yield chunks.choice({"role": "assistant", "content": ""})
    for d in deltas(reply.close()):
        yield chunk(d)
    rest = lps.take() if lps is not None else None
    for s in chunks.ending({}, _finish(r, reply), None, logprobs=content_logprobs(lps, rest) if rest else None):
        yield s
