"""Anthropic's Messages API (POST /v1/messages, POST
/v1/messages/count_tokens) over the same engine and reply layer, for the
anthropic SDKs and the tools built on them (pointed here by
ANTHROPIC_BASE_URL): a reply's thinking, text and tool_use content blocks,
whole or streamed as Anthropic's server-sent events. Errors are
Anthropic's {"type": "error", "error": {"type", "message"}} (errors.py
writes them for these paths)."""
from __future__ import annotations

import json
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import Response

from ..reply import ReplyStream, call_arguments, new_id
from .anthropic_params import CountBody, MessagesBody, chat_messages, function_tools, reasoning, tool_choice
from .bridge import EventStream, Submitted
from .errors import bad_request
from .params import check_common
from .schemas import openapi_extra

MESSAGE_REPLY = {"type": "object", "required": ["id", "type", "role", "content", "stop_reason", "usage"],
                 "properties": {"type": {"const": "message"}, "content": {"type": "array"}}}
COUNT_REPLY = {"type": "object", "required": ["input_tokens"], "properties": {"input_tokens": {"type": "integer"}}}
MESSAGE = {"type": "object", "required": ["role", "content"],
           "properties": {"role": {"type": "string", "enum": ["user", "assistant"]},
                          "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]}}}
ERROR = {"type": "object", "required": ["type", "error"],
         "properties": {"type": {"const": "error"},
                        "error": {"type": "object", "required": ["type", "message"],
                                  "properties": {"type": {"type": "string"}, "message": {"type": "string"}}}}}


def event(name: str, data: dict) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def register(app: FastAPI, server, read) -> None:
    """The routes on app; read(request, Body) parses a body (parse_body with
    the server's limits)."""

    @app.post("/v1/messages", openapi_extra=openapi_extra(MessagesBody, MESSAGE_REPLY, MESSAGE, ERROR))
    async def messages(request: Request):
        return await handle(server, await read(request, MessagesBody), request)

    @app.post("/v1/messages/count_tokens", openapi_extra=openapi_extra(CountBody, COUNT_REPLY, MESSAGE, ERROR))
    async def count_tokens(request: Request):
        body = await read(request, CountBody)
        server.check_model(body.model)
        prompt, _, _ = render(server, body)
        return {"input_tokens": len(prompt)}


def render(server, body: MessagesBody):
    """(prompt ids, the reply's plan, whether thinking is shown)."""
    effort, budget, show = reasoning(body)
    if body.reasoning_budget is None:
        body.reasoning_budget = budget
    fmt, where = (body.output_config or {}).get("format"), "output_config.format"
    if fmt is None and body.output_format is not None:
        fmt, where = body.output_format, "output_format"
    prompt, plan = server.render(chat_messages(body), function_tools(body.tools), tool_choice(body.tool_choice),
                                 effort, "messages", body, fmt, where, object_arguments=True, prefill=True)
    return prompt, plan, show


async def handle(server, body: MessagesBody, request: Request):
    server.check_model(body.model)
    check_common(body)
    stops = body.stop_sequences or []
    if not all(isinstance(s, str) and s for s in stops):
        raise bad_request("stop_sequences must be non-empty strings", param="stop_sequences")
    prompt, plan, show = render(server, body)
    n = server.limit(body.max_tokens, len(prompt), "max_tokens", "messages")
    sub = server.submit(prompt, n, body, "max_tokens", "messages", plan.gate(server.tok))
    reply = ReplyStream(server.tok, stops, plan.prefix)
    msg = Message(server.name, show)
    if body.stream:
        return EventStream(with_error_event(msg.stream(server, sub, reply, len(prompt))), sub.gen)
    await server.run_reply(sub, reply, request)
    if sub.gen.result is None:       # the client went away
        return Response(status_code=499)
    return msg.whole(reply, sub.gen.result)


def usage(r) -> dict:
    """Anthropic's counts: input_tokens leaves out those read from the KV cache."""
    return {"input_tokens": r.prompt_tokens - r.cached_tokens, "output_tokens": r.generated_tokens,
            "cache_read_input_tokens": r.cached_tokens, "cache_creation_input_tokens": 0}


def stop_reason(r, reply: ReplyStream) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence); the engine's own stops (repetition,
    time_budget) keep their names, as on /v1."""
    if reply.stopped:
        return "stop_sequence", reply.stop.matched
    if r.stop_reason in ("eos", "stop"):
        return ("tool_use" if reply.tool_calls else "end_turn"), None
    return ("max_tokens" if r.stop_reason == "max_tokens" else r.stop_reason), None


class Message:
    """One reply as Anthropic's message, whole or as its stream's events."""

    def __init__(self, model: str, show_thinking: bool):
        self.id, self.model, self.show = new_id("msg_"), model, show_thinking

    def head(self) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model}

    def block(self, item, whole: bool) -> dict | None:
        """An item's content block: whole (its text), or the empty one a stream starts."""
        if item.kind == "reasoning":
            return {"type": "thinking", "thinking": item.text if whole and self.show else "", "signature": ""}
        if item.kind == "content":
            return {"type": "text", "text": item.text if whole else ""}
        args = call_arguments(item) if whole else {}
        return None if args is None else {"type": "tool_use", "id": item.call_id, "name": item.name, "input": args}

    def whole(self, reply: ReplyStream, r) -> dict:
        blocks = [b for b in (self.block(i, True) for i in reply.items) if b is not None]
        why, seq = stop_reason(r, reply)
        return {**self.head(), "content": blocks, "stop_reason": why, "stop_sequence": seq, "usage": usage(r)}

    def deltas(self, events, index: dict) -> list[str]:
        out = []
        for what, item, text in events:
            if what == "start":
                index[item.id] = len(index)
                out.append(event("content_block_start", {"type": "content_block_start", "index": index[item.id],
                                                         "content_block": self.block(item, False)}))
            elif what == "delta" and text and (item.kind != "reasoning" or self.show):
                delta = {"reasoning": {"type": "thinking_delta", "thinking": text},
                         "content": {"type": "text_delta", "text": text},
                         "tool_call": {"type": "input_json_delta", "partial_json": text}}[item.kind]
                out.append(event("content_block_delta", {"type": "content_block_delta", "index": index[item.id],
                                                         "delta": delta}))
            elif what == "end":
                out.append(event("content_block_stop", {"type": "content_block_stop", "index": index[item.id]}))
        return out

    async def stream(self, server, sub: Submitted, reply: ReplyStream, n_prompt: int) -> AsyncIterator[str]:
        yield event("message_start", {"type": "message_start", "message": {
            **self.head(), "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": n_prompt, "output_tokens": 0}}})
        yield event("ping", {"type": "ping"})
        index: dict = {}
        async with sub.events() as stream:
            async for token, _ in stream:
                if token is not None:
                    for s in self.deltas(server.feed(sub, reply, token), index):
                        yield s
        r = sub.gen.result
        if r is None:
            return
        for s in self.deltas(reply.close(), index):
            yield s
        why, seq = stop_reason(r, reply)
        yield event("message_delta", {"type": "message_delta", "delta": {"stop_reason": why, "stop_sequence": seq},
                                      "usage": usage(r)})
        yield event("message_stop", {"type": "message_stop"})


async def with_error_event(body: AsyncIterator[str]) -> AsyncIterator[str]:
    """A stream's events; if it fails, Anthropic's error event (the headers
    are sent: no status can tell)."""
    try:
        async for s in body:
            yield s
    except Exception as e:
        yield event("error", {"type": "error", "error": {"type": "api_error", "message": f"generation failed: {e}"}})
