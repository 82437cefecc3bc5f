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
from ..reply_plan import tool_names
from .anthropic_params import CountBody, MessagesBody, chat_messages, function_tools, reasoning, tool_choice
from .bridge import EventStream, Submitted
from .errors import APIError, bad_request
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
    """(prompt ids, the reply's plan, how thinking is shown: anthropic_params.reasoning)."""
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
    # Anthropic's API serves a max_tokens past the context (clients send 32000 and more) and stops
    # where the context is full, saying so; only a prompt that leaves no room is refused
    room = server.model.n_ctx - len(prompt)
    clamped = 1 <= room < n
    sub = server.submit(prompt, min(n, room) if clamped else n, body, "max_tokens", "messages",
                        plan.gate(server.tok))
    reply = ReplyStream(server.tok, stops, plan.prefix, tools=tool_names(plan.tools))
    msg = Message(server.name, show, clamped)
    if body.stream:
        return EventStream(with_error_event(msg.stream(server, sub, reply)), sub.gen)
    await server.run_reply(sub, reply, request)
    if sub.gen.result is None:       # the client went away
        return Response(status_code=499)
    return msg.whole(reply, sub.gen.result)


def usage(r) -> dict:
    """Anthropic's counts: input_tokens leaves out those read from the KV cache."""
    return counts(r.prompt_tokens, r.cached_tokens, r.generated_tokens)


def counts(prompt: int, cached: int, generated: int) -> dict:
    return {"input_tokens": prompt - cached, "output_tokens": generated,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


# the engine's own stops as the API's stop reasons (its name goes beside, as goosedump_stop_reason)
ENGINE_STOPS = {"time_budget": "max_tokens", "repetition": "end_turn", "shutdown": "end_turn"}


def stop_reason(r, reply: ReplyStream, clamped: bool = False) -> tuple[str, str | None, str | None]:
    """(stop_reason, stop_sequence, the engine's own stop where it is none
    of the API's reasons); clamped: the limit was the context's room, not
    max_tokens."""
    if reply.stopped:
        return "stop_sequence", reply.stop.matched, None
    if r.stop_reason in ("eos", "stop"):
        return ("tool_use" if reply.tool_calls else "end_turn"), None, None
    if r.stop_reason == "max_tokens":
        return ("model_context_window_exceeded" if clamped else "max_tokens"), None, None
    return ENGINE_STOPS.get(r.stop_reason, "end_turn"), None, r.stop_reason


def stop_fields(why: str, seq: str | None, engine: str | None) -> dict:
    return {"stop_reason": why, "stop_sequence": seq, **({"goosedump_stop_reason": engine} if engine else {})}


class Message:
    """One reply as Anthropic's message, whole or as its stream's events."""

    def __init__(self, model: str, thinking: str, clamped: bool = False):
        # thinking: "shown", "omitted" (blocks left empty) or "none" (no thinking blocks)
        self.id, self.model, self.thinking, self.clamped = new_id("msg_"), model, thinking, clamped

    def head(self) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model}

    def block(self, item, whole: bool) -> dict | None:
        """An item's content block: whole (its text), or the empty one a stream starts."""
        if item.kind == "reasoning":
            if self.thinking == "none":
                return None
            return {"type": "thinking", "thinking": item.text if whole and self.thinking == "shown" else "",
                    "signature": ""}
        if item.kind == "content":
            return {"type": "text", "text": item.text if whole else ""}
        args = call_arguments(item) if whole else {}
        return None if args is None else {"type": "tool_use", "id": tool_use_id(item), "name": item.name,
                                          "input": args}

    def whole(self, reply: ReplyStream, r) -> dict:
        blocks = [b for b in (self.block(i, True) for i in reply.items) if b is not None]
        return {**self.head(), "content": blocks, **stop_fields(*stop_reason(r, reply, self.clamped)),
                "usage": usage(r)}

    def deltas(self, events, index: dict) -> list[str]:
        out = []
        for what, item, text in events:
            if what == "start":
                block = self.block(item, False)
                if block is None:       # (thinking not asked for: no block, the next block takes the index)
                    continue
                index[item.id] = len(index)
                out.append(event("content_block_start", {"type": "content_block_start", "index": index[item.id],
                                                         "content_block": block}))
            elif item.id not in index:
                continue
            elif what == "delta" and text and (item.kind != "reasoning" or self.thinking == "shown"):
                delta = {"reasoning": {"type": "thinking_delta", "thinking": text},
                         "content": {"type": "text_delta", "text": text},
                         "tool_call": {"type": "input_json_delta", "partial_json": text}}[item.kind]
                out.append(event("content_block_delta", {"type": "content_block_delta", "index": index[item.id],
                                                         "delta": delta}))
            elif what == "end":
                out.append(event("content_block_stop", {"type": "content_block_stop", "index": index[item.id]}))
        return out

    def start(self, gen) -> list[str]:
        """message_start and a ping, once the prompt is read: its usage splits
        the prompt as the final usage does (input and cache_read)."""
        return [event("message_start", {"type": "message_start", "message": {
                    **self.head(), "content": [], "stop_reason": None, "stop_sequence": None,
                    "usage": counts(len(gen.prompt), gen.cached or 0, 0)}}),
                event("ping", {"type": "ping"})]

    async def stream(self, server, sub: Submitted, reply: ReplyStream) -> AsyncIterator[str]:
        index: dict = {}
        started = False
        async with sub.events() as stream:
            async for token, _ in stream:
                if not started:
                    started = True
                    for s in self.start(sub.gen):
                        yield s
                if token is not None:
                    for s in self.deltas(server.feed(sub, reply, token), index):
                        yield s
        r = sub.gen.result
        if r is None:
            return
        if not started:
            for s in self.start(sub.gen):
                yield s
        for s in self.deltas(reply.close(), index):
            yield s
        yield event("message_delta", {"type": "message_delta",
                                      "delta": stop_fields(*stop_reason(r, reply, self.clamped)), "usage": usage(r)})
        yield event("message_stop", {"type": "message_stop"})


async def with_error_event(body: AsyncIterator[str]) -> AsyncIterator[str]:
    """A stream's events; if it fails, Anthropic's error event (the headers
    are sent: no status can tell)."""
    try:
        async for s in body:
            yield s
    except APIError as e:           # the request's own doing (no token left to choose): its type, as unstreamed
        yield event("error", e.anthropic())
    except Exception as e:
        yield event("error", {"type": "error", "error": {"type": "api_error", "message": f"generation failed: {e}"}})


def tool_use_id(item) -> str:
    """A call's id as Anthropic's API names them (toolu_...), the same in the stream and the whole reply."""
    return "toolu_" + item.call_id.removeprefix("call_")
