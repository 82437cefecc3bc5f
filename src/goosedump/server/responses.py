"""POST /v1/responses: the Responses API, whole or as its server-sent events
(response.created, output items added, their text's deltas and ends,
response.completed or .incomplete), built from the reply events."""
from __future__ import annotations

import json
import re
import time
from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import Response

from ..harmony import REASONING_EFFORTS
from ..logprobs import ContentLogprobs
from ..reply import Item, ReplyStream
from ..reply_plan import strict_by_default, tool_names
from .bridge import EventStream, Submitted
from .errors import APIError, bad_request
from .params import check_common, finish_reason, response_id, stop_strings, top_count
from .schemas import ResponsesBody


LOGPROBS = "message.output_text.logprobs"      # what `include` names to have them


def response_item(item: Item, status: str, lps: ContentLogprobs | None = None) -> dict:
    """An output item of the Responses API; in progress: without its text."""
    text = item.text if status != "in_progress" else ""
    if item.kind == "reasoning":
        return {"id": item.id, "type": "reasoning", "summary": [], "status": status,
                "content": [{"type": "reasoning_text", "text": text}] if status != "in_progress" else []}
    if item.kind == "content":
        return {"id": item.id, "type": "message", "role": "assistant", "status": status,
                "content": [_output_text(text, item_logprobs(lps, item))] if status != "in_progress" else []}
    return {"id": item.id, "type": "function_call", "call_id": item.call_id, "name": item.name,
            "arguments": text, "status": status}


def _output_text(text: str, logprobs: list | None = None) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def item_logprobs(lps: ContentLogprobs | None, item: Item) -> list:
    return lps.by_item.get(item.id, []) if lps is not None else []


def _part(item: Item, text: str, logprobs: list | None = None) -> dict:
    return {"type": "reasoning_text", "text": text} if item.kind == "reasoning" else _output_text(text, logprobs)


class ResponseEvents:
    """Item events as the Responses API's server-sent events, numbered; a
    text delta carries the log-probabilities of the tokens taken since the
    last one did (with lps)."""

    def __init__(self, lps: ContentLogprobs | None = None):
        self.seq = 0
        self.lps = lps

    def sse(self, type: str, **fields) -> str:
        data = {"type": type, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {type}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def items(self, events: list[tuple], incomplete: bool = False) -> list[str]:
        out = []
        for what, item, text in events:
            where = {"item_id": item.id, "output_index": item.index}
            if what == "start":
                out.append(self.sse("response.output_item.added", output_index=item.index,
                                    item=response_item(item, "in_progress")))
                if item.kind != "tool_call":
                    out.append(self.sse("response.content_part.added", **where, content_index=0,
                                        part=_part(item, "")))
            elif what == "delta":
                if item.kind == "content":
                    out.append(self.sse("response.output_text.delta", **where, content_index=0, delta=text,
                                        logprobs=self.lps.take() if self.lps is not None else []))
                elif item.kind == "reasoning":
                    out.append(self.sse("response.reasoning_text.delta", **where, content_index=0, delta=text))
                else:
                    out.append(self.sse("response.function_call_arguments.delta", **where, delta=text))
            else:
                if item.kind == "content":
                    out.append(self.sse("response.output_text.done", **where, content_index=0, text=item.text,
                                        logprobs=item_logprobs(self.lps, item)))
                elif item.kind == "reasoning":
                    out.append(self.sse("response.reasoning_text.done", **where, content_index=0,
                                        text=item.text))
                else:
                    out.append(self.sse("response.function_call_arguments.done", **where, name=item.name,
                                        arguments=item.text))
                if item.kind != "tool_call":
                    out.append(self.sse("response.content_part.done", **where, content_index=0,
                                        part=_part(item, item.text, item_logprobs(self.lps, item))))
                out.append(self.sse("response.output_item.done", output_index=item.index,
                                    item=response_item(item, item_status(item, incomplete), self.lps)))
        return out


def item_status(item: Item, incomplete: bool) -> str:
    return "incomplete" if incomplete and item.cut else "completed"


def responses_messages(body: ResponsesBody) -> tuple[list[dict], list[str]]:
    """The Responses API's input items as chat messages, and where each came
    from ("instructions", "input[3]": for errors, which name the body's
    fields, not the messages'). The items of one assistant turn (reasoning,
    a message, function calls) merge into one assistant message, so its
    reasoning stays with its calls."""
    msgs: list[dict] = []
    sources: list[str] = []
    if body.instructions:
        msgs.append({"role": "developer", "content": body.instructions})
        sources.append("instructions")
    if isinstance(body.input, str):
        return msgs + [{"role": "user", "content": body.input}], sources + ["input"]
    turn: dict | None = None
    turn_from = ""

    def flush():
        nonlocal turn
        if turn is not None:
            msgs.append(turn)
            sources.append(turn_from)
            turn = None

    def start_turn(where: str, **fields) -> dict:
        nonlocal turn, turn_from
        if turn is None:
            turn, turn_from = {"role": "assistant", **fields}, where
        return turn

    for i, it in enumerate(body.input):
        where = f"input[{i}]"
        kind = it.get("type", "message")
        if kind == "reasoning":
            parts = it.get("content") or it.get("summary") or []
            if not isinstance(parts, list) or not all(
                    isinstance(p, dict) and isinstance(p.get("text", ""), str) for p in parts):
                raise bad_request(f"{where}: a reasoning item's content and summary must be lists of text parts "
                                  '({"type": "reasoning_text", "text": "..."})', param="input")
            text = "".join(p.get("text", "") for p in parts)
            if turn is not None and (turn.get("content") or turn.get("tool_calls")):
                flush()
            start_turn(where, content="")
            turn["reasoning_content"] = "\n".join(x for x in (turn.get("reasoning_content"), text) if x)
        elif kind == "function_call":
            if not isinstance(it.get("call_id"), str) or not isinstance(it.get("name"), str):
                raise bad_request(f"{where}: a function_call item needs a call_id and a name", param="input")
            start_turn(where, content="").setdefault("tool_calls", []).append(
                {"id": it["call_id"], "type": "function",
                 "function": {"name": it["name"], "arguments": it.get("arguments", "")}})
        elif kind == "function_call_output":
            flush()
            if not isinstance(it.get("call_id"), str):
                raise bad_request(f"{where}: a function_call_output item needs a call_id", param="input")
            msgs.append({"role": "tool", "tool_call_id": it["call_id"], "content": it.get("output", "")})
            sources.append(where)
        elif kind == "message":
            if it.get("role") == "assistant":
                if turn is not None and (turn.get("content") or turn.get("tool_calls")):
                    flush()
                start_turn(where)["content"] = it.get("content")
            else:
                flush()
                msgs.append({"role": it.get("role"), "content": it.get("content")})
                sources.append(where)
        else:
            raise bad_request(f"{where}: input items of type {kind!r} are not supported (messages, "
                              "function_call, function_call_output and reasoning are)", param="input")
    flush()
    return msgs, sources


def named_by_input(e: APIError, sources: list[str]) -> APIError:
    """e with the messages it names (messages[2], "messages is empty") as the
    body's fields they came from (input[1], instructions, "input is empty")."""
    def source(m: re.Match) -> str:
        k = int(m.group(1))
        return sources[k] if k < len(sources) else m.group(0)
    e.message = re.sub(r"\bmessages\[(\d+)\]", source, e.message).replace("messages is empty", "input is empty")
    return e


class _Response:
    """A response being built: its request, its generation and its reply."""

    def __init__(self, server, body: ResponsesBody, effort: str, sub: Submitted, reply: ReplyStream,
                 lps: ContentLogprobs | None):
        self.server, self.body, self.effort, self.sub, self.reply = server, body, effort, sub, reply
        self.lps = lps
        self.id, self.created = response_id("resp_")

    def sampling(self, field: str, default: float) -> float:
        v = getattr(self.body, field)
        return v if v is not None else self.server.defaults.sampling.get(field, default)

    def status(self) -> tuple[str, dict | None]:
        """(status, incomplete_details) of a finished response."""
        reason = finish_reason(self.sub.gen.result.stop_reason, self.reply.stopped)
        if reason == "stop":
            return "completed", None
        if reason == "length":
            return "incomplete", {"reason": "max_output_tokens"}
        # the engine's own stops (repetition, time_budget, shutdown) are none of the API's reasons
        return "incomplete", {"reason": None, "goosedump_reason": reason}

    def object(self, final: bool = True) -> dict:
        body, r = self.body, self.sub.gen.result if final else None
        status, incomplete = self.status() if r is not None else ("in_progress", None)
        out = {"id": self.id, "object": "response", "created_at": self.created, "status": status,
               "model": self.server.name, "output": [], "error": None, "incomplete_details": incomplete,
               "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
               "metadata": body.metadata or {},
               "parallel_tool_calls": body.parallel_tool_calls if body.parallel_tool_calls is not None else True,
               "previous_response_id": None,
               "reasoning": {"effort": self.effort, "summary": (body.reasoning or {}).get("summary")},
               # what was applied: the request's, else serve's defaults, else the engine's
               "temperature": self.sampling("temperature", 1.0), "top_p": self.sampling("top_p", 1.0),
               "text": {"format": (body.text if isinstance(body.text, dict) else {}).get("format") or {"type": "text"}},
               "tool_choice": body.tool_choice or "auto",
               "tools": body.tools or [], "truncation": "disabled", "store": False, "usage": None,
               "top_logprobs": body.top_logprobs}
        if r is not None:
            if status == "completed":
                out["completed_at"] = int(time.time())
            out["output"] = [response_item(i, item_status(i, status == "incomplete"), self.lps)
                             for i in self.reply.items]
            out["usage"] = {"input_tokens": r.prompt_tokens,
                            # the prompt tokens computed now stay in the KV cache for the next request
                            "input_tokens_details": {"cached_tokens": r.cached_tokens,
                                                     "cache_write_tokens": r.prompt_tokens - r.cached_tokens},
                            "output_tokens": r.generated_tokens,
                            "output_tokens_details": {"reasoning_tokens": self.reply.reasoning_tokens},
                            "total_tokens": r.prompt_tokens + r.generated_tokens}
        return out

    async def stream(self) -> AsyncIterator[str]:
        ev = ResponseEvents(self.lps)
        yield ev.sse("response.created", response=self.object(final=False))
        yield ev.sse("response.in_progress", response=self.object(final=False))
        try:
            async with self.sub.events() as events:
                async for token, _ in events:
                    if token is not None:
                        for s in ev.items(self.server.feed(self.sub, self.reply, token, self.lps)):
                            yield s
            if self.sub.gen.result is None:
                return
            incomplete = self.status()[0] == "incomplete"
            for s in ev.items(self.reply.close(), incomplete=incomplete):
                yield s
            final = self.object()
            kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
            yield ev.sse(kind, response=final)
        except Exception as e:
            failed = self.object(final=False)
            if isinstance(e, APIError):      # the request's own doing (no token left to choose)
                yield ev.sse("error", code=e.code, message=e.message, param=e.param)
                failed.update(status="failed", error={"code": "invalid_prompt", "message": e.message})
            else:
                failed.update(status="failed", error={"code": "server_error", "message": f"generation failed: {e}"})
            yield ev.sse("response.failed", response=failed)


def logprobs_asked(body: ResponsesBody) -> int | None:
    """The alternatives per token asked for (top_logprobs, default 0): where
    include names LOGPROBS or top_logprobs is above 0; else None."""
    top = top_count(body.top_logprobs, "top_logprobs")      # include's type is the schema's check
    return (top or 0) if LOGPROBS in (body.include or []) or top else None


def render(server, body: ResponsesBody):
    """(prompt ids, the reply's plan, the reasoning effort) of a Responses
    API body (here and in its token count)."""
    effort = (body.reasoning or {}).get("effort") or server.template(body).effort or "medium"
    if effort not in REASONING_EFFORTS:
        raise bad_request(f"reasoning.effort must be one of {', '.join(REASONING_EFFORTS)} (gpt-oss's), got "
                          f"{effort!r}", param="reasoning")
    messages, sources = responses_messages(body)
    body.tools = strict_by_default(body.tools)     # (the echo says what was applied)
    try:
        prompt, plan = server.render(messages, body.tools, body.tool_choice, effort, "input", body,
                                     (body.text or {}).get("format"), "text.format")
    except APIError as e:
        raise named_by_input(e, sources) from None
    return prompt, plan, effort


async def handle(server, body: ResponsesBody, request: Request):
    server.check_model(body.model)
    check_common(body)
    for field in ("previous_response_id", "conversation"):
        if getattr(body, field):
            raise bad_request(f"{field} is not supported: this server keeps no state; send the whole "
                              "conversation in 'input'", param=field)
    prompt, plan, effort = render(server, body)
    n = server.limit(body.max_output_tokens, len(prompt), "max_output_tokens", "input")
    n_top = logprobs_asked(body)
    stops = stop_strings(body.stop)           # (checked before the generation is queued)
    sub = server.submit(prompt, n, body, "max_output_tokens", "input", plan.gate(server.tok), n_top)
    lps = None if n_top is None else ContentLogprobs(server.tok, sub.gen)
    resp = _Response(server, body, effort, sub, ReplyStream(server.tok, stops, plan.prefix, tools=tool_names(plan.tools)), lps)
    if body.stream:
        return EventStream(resp.stream(), sub.gen)
    await server.run_reply(sub, resp.reply, request, lps)
    if sub.gen.result is None:
        return Response(status_code=499)
    return resp.object()
