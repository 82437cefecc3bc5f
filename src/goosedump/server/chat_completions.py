"""POST /v1/chat/completions: a chat turn, whole or streamed as
chat.completion.chunk deltas (llama.cpp's and vLLM's form: reasoning_content
beside content; tool calls by index). Both are built from the same reply
events, so they are equal by construction."""
from __future__ import annotations

from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import Response

from ..reply import ReplyEvent, ReplyStream
from .bridge import EventStream, Submitted
from .errors import bad_request
from .params import check_common, finish_reason, max_tokens, response_id, stop_strings, usage
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


async def handle(server, body: ChatBody, request: Request):
    server.check_model(body.model)
    check_common(body)
    if body.logprobs or body.top_logprobs:
        raise bad_request("logprobs are not supported", param="logprobs")
    stops = stop_strings(body.stop)
    prompt, plan = server.render(body.messages, body.tools, body.tool_choice, body.reasoning_effort, "messages",
                                 body, body.response_format)
    limit = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    n = max_tokens(limit, len(prompt), server.model.n_ctx, param, "messages")
    sub = server.submit(prompt, n, body, param, "messages", plan.gate(server.tok))
    reply = ReplyStream(server.tok, stops, plan.prefix)
    rid, created = response_id("chatcmpl-")
    if body.stream:
        chunks = Chunks(rid, created, "chat.completion.chunk", server.name, "delta",
                        bool((body.stream_options or {}).get("include_usage")))
        return EventStream(completion_stream(_stream(server, sub, reply, chunks)), sub.gen)
    await server.run_reply(sub, reply, request)
    r = sub.gen.result
    if r is None:              # the client went away
        return Response(status_code=499)
    return {"id": rid, "object": "chat.completion", "created": created, "model": server.name,
            "system_fingerprint": FINGERPRINT,
            "choices": [{"index": 0, "message": chat_message(reply), "logprobs": None,
                         "finish_reason": _finish(r, reply)}],
            "usage": usage(r, reply.reasoning_tokens)}


async def _stream(server, sub: Submitted, reply: ReplyStream, chunks: Chunks) -> AsyncIterator[str]:
    deltas = ChatDeltas()
    started = False
    async with sub.events() as stream:
        async for token, _ in stream:
            if token is None:
                continue
            if not started:       # the role comes with the first generated token
                started = True
                yield chunks.choice({"role": "assistant", "content": ""})
            for d in deltas(server.feed(sub, reply, token)):
                yield chunks.choice(d)
    r = sub.gen.result
    if r is None:
        return
    if not started:
        yield chunks.choice({"role": "assistant", "content": ""})
    for d in deltas(reply.close()):
        yield chunks.choice(d)
    for s in chunks.ending({}, _finish(r, reply), usage(r, reply.reasoning_tokens)):
        yield s
