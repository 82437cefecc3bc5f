"""`goosedump serve`: an OpenAI-compatible HTTP server over one model.

    goosedump serve MODEL.gguf [--host 127.0.0.1] [--port 8080] [--api-key KEY]

Endpoints: GET /v1/models, POST /v1/chat/completions, POST /v1/completions,
POST /v1/responses, GET /health, GET /metrics (see docs/server.md).

How a request flows: the handler validates the body, renders the prompt
(chat.render_chat) and submits it to the Engine, whose one worker thread
generates for every client in arrival order. A small forwarding thread per
request moves the engine's (token, text) events onto the event loop
(loop.call_soon_threadsafe), so the loop never blocks on the engine. The
tokens of a chat reply go through a harmony parser (Turn) that splits them
into items: reasoning, content and tool calls, each streamed as it grows.
Streamed and non-streamed replies are built from the same item events, so
they are equal by construction. A client that goes away cancels its
generation before the engine's next token.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import json
import os
import queue
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any, AsyncIterator, Union

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import __version__
from .chat import ChatError, has_harmony_tokens
from .engine import Engine
from .forward import ContextOverflowError
from .harmony import HarmonyParser
from .sampling import SamplingError, SamplingParams

MAX_STOPS = 4                  # as OpenAI: up to 4 stop strings
DISCONNECT_POLL = 0.25         # seconds between checks that a client is still there
FINGERPRINT = f"goosedump-{__version__}"
ENDPOINTS = ("/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/responses", "/health", "/metrics")


# --- errors -------------------------------------------------------------------

class APIError(Exception):
    """An error answered as OpenAI does: {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param, code)


def _validation_error(exc: RequestValidationError | ValidationError) -> APIError:
    """A body that does not fit its model (FastAPI's 422) as OpenAI's 400,
    naming the field."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return bad_request(f"The request body is not valid JSON{': ' + str(detail) if detail else ''}.")
    loc = [x for x in first.get("loc", ()) if x != "body"]
    if not loc:
        if first.get("type") == "missing":
            return bad_request("The request body is missing: send a JSON object.")
        return bad_request(f"The request body must be a JSON object: {first.get('msg', 'invalid')}.")
    field = str(loc[0])
    # A union (stop: str | list) reports one error per branch: all for this field.
    msgs, got = [], ""
    for e in errors:
        eloc = [x for x in e.get("loc", ()) if x != "body"]
        if eloc and str(eloc[0]) == field:
            path = field + "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in eloc[1:]
                                   if not _union_branch(x))
            msgs.append((f"{path}: " if path != field else "") + str(e.get("msg")))
            if e.get("type") != "missing" and not isinstance(e.get("input"), (dict, list)):
                got = f" (got {e['input']!r})"
    return bad_request(f"Invalid '{field}': " + "; or ".join(dict.fromkeys(msgs)) + got, param=field)


def _union_branch(loc_part) -> bool:
    """pydantic names the branch of a union in the error's location ("str",
    "list[str]"); it is not part of the field's path."""
    return isinstance(loc_part, str) and (loc_part in ("str", "int", "float", "bool") or "[" in loc_part)


async def parse_body(request: Request, model: type[BaseModel]):
    """The JSON body as `model`, whatever the Content-Type says (curl -d
    sends form encoding; the body is JSON all the same)."""
    raw = await request.body()
    if not raw.strip():
        raise bad_request("The request body is missing: send a JSON object.")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"The request body is not valid JSON: {e}.") from None
    if not isinstance(data, dict):
        raise bad_request(f"The request body must be a JSON object, got {type(data).__name__}.")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _validation_error(e) from None


def _chat_error(e: ChatError, default_param: str = "messages") -> APIError:
    msg = str(e)
    for param in ("tools", "reasoning_effort", "date", "chat_format"):
        if msg.startswith(param):
            return bad_request(msg, param=param)
    return bad_request(msg, param=default_param)


# --- request bodies -----------------------------------------------------------
# Unknown fields (user, metadata, store, parallel_tool_calls, ...) are accepted
# and ignored, as clients send them freely.

class _Fields(BaseModel):
    """Fields every generating endpoint takes."""
    model_config = ConfigDict(extra="allow")
    model: Union[str, None] = None
    stream: bool = False
    stream_options: Union[dict[str, Any], None] = None
    temperature: Union[float, None] = None
    top_p: Union[float, None] = None
    top_k: Union[int, None] = None
    min_p: Union[float, None] = None
    repetition_penalty: Union[float, None] = None
    presence_penalty: Union[float, None] = None
    frequency_penalty: Union[float, None] = None
    logit_bias: Union[dict[str, float], None] = None
    seed: Union[int, None] = None
    stop: Union[str, list[str], None] = None
    n: Union[int, None] = None
    time_budget: Union[float, None] = None     # goosedump: seconds of generation at most


class ChatBody(_Fields):
    messages: list[dict[str, Any]]
    tools: Union[list[dict[str, Any]], None] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    reasoning_effort: Union[str, None] = None
    max_tokens: Union[int, None] = None
    max_completion_tokens: Union[int, None] = None
    response_format: Union[dict[str, Any], None] = None
    logprobs: Union[bool, None] = None
    top_logprobs: Union[int, None] = None


class CompletionBody(_Fields):
    prompt: Union[str, list[int], list[str]]
    max_tokens: Union[int, None] = 16          # OpenAI's default for this endpoint
    echo: Union[bool, None] = None
    suffix: Union[str, None] = None
    best_of: Union[int, None] = None
    logprobs: Union[int, None] = None


class ResponsesBody(_Fields):
    input: Union[str, list[dict[str, Any]]]
    instructions: Union[str, None] = None
    tools: Union[list[dict[str, Any]], None] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    reasoning: Union[dict[str, Any], None] = None
    max_output_tokens: Union[int, None] = None
    previous_response_id: Union[str, None] = None
    text: Union[dict[str, Any], None] = None
    metadata: Union[dict[str, Any], None] = None


# --- options shared by the endpoints ------------------------------------------

def sampling_params(b: _Fields) -> SamplingParams:
    bias = {}
    for k, v in (b.logit_bias or {}).items():
        try:
            bias[int(k)] = v
        except ValueError:
            raise bad_request(f"logit_bias keys must be token ids, got {k!r}", param="logit_bias") from None
    fields = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
              "frequency_penalty", "seed")
    kw = {f: getattr(b, f) for f in fields if getattr(b, f) is not None}
    try:
        return SamplingParams(logit_bias=bias, **kw)
    except SamplingError as e:          # its message starts with the field's name
        raise bad_request(str(e), param=str(e).split()[0]) from None


def stop_strings(stop: str | list[str] | None) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOPS:
        raise bad_request(f"stop takes at most {MAX_STOPS} strings, got {len(stops)}", param="stop")
    if any(s == "" for s in stops):
        raise bad_request("stop strings must not be empty", param="stop")
    return stops


def check_common(b: _Fields) -> None:
    if b.n not in (None, 1):
        raise bad_request(f"n={b.n} is not supported: this server returns one choice (n=1)", param="n")
    if b.time_budget is not None and not b.time_budget > 0:
        raise bad_request(f"time_budget must be a number of seconds > 0, got {b.time_budget}", param="time_budget")


def tool_names(tools: list[dict] | None) -> list[str]:
    names = []
    for t in tools or []:
        fn = t.get("function", t) if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.append(fn["name"])
    return names


def resolve_tool_choice(choice, tools: list[dict] | None) -> tuple[list[dict] | None, str | None]:
    """(the tools to render, the function to force or None). "none" renders
    no tools; a named function (or "required" with a single tool) is forced
    by writing the call's header into the prompt; "required" with several
    tools is only asked for by the tools being there."""
    if choice is None or choice == "auto":
        return tools, None
    if choice == "none":
        return None, None
    names = tool_names(tools)
    if choice == "required":
        if not tools:
            raise bad_request("tool_choice 'required' needs tools", param="tool_choice")
        return tools, names[0] if len(names) == 1 else None
    if isinstance(choice, dict) and choice.get("type") == "function":
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else choice.get("name")
        if name not in names:
            raise bad_request(f"tool_choice names the function {name!r}, which is not among the tools "
                              f"({', '.join(names) or 'none'})", param="tool_choice")
        return tools, name
    raise bad_request("tool_choice must be 'auto', 'none', 'required' or a function "
                      f"({{'type': 'function', ...}}), got {choice!r}", param="tool_choice")


def forced_call_header(tokenizer, name: str) -> list[int]:
    """The header the model writes before a call's arguments; put in the
    prompt, the model can only go on with that function's arguments."""
    return tokenizer.encode(f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>",
                            allow_special=True)


def finish_reason(stop_reason: str, stopped: bool, tool_calls: bool = False) -> str:
    """The engine's stop as OpenAI's finish_reason; its own stops
    (repetition, time_budget) keep their names."""
    if stopped or stop_reason == "stop":
        return "stop"
    if stop_reason == "eos":
        return "tool_calls" if tool_calls else "stop"
    if stop_reason == "max_tokens":
        return "length"
    return stop_reason


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


# --- a reply as it streams ------------------------------------------------------

class StopFilter:
    """Stop strings over a text that arrives in pieces: text that could be the
    start of a stop string is held back until the next piece decides."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.held = ""
        self.hit = False

    def push(self, piece: str) -> str:
        """The part of held + piece that is safe to emit; sets .hit (and drops
        the rest) when a stop string appears."""
        buf = self.held + piece
        found = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if found:
            self.held, self.hit = "", True
            return buf[:min(found)]
        keep = 0      # the longest tail of buf that begins some stop string
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), keep, -1):
                if s.startswith(buf[-n:]):
                    keep = n
                    break
        self.held = buf[len(buf) - keep:]
        return buf[:len(buf) - keep]

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


@dataclass
class Item:
    """One harmony message of the reply: "reasoning" (the analysis channel),
    "content" (final, or a preamble) or "tool_call" (to functions.NAME)."""
    kind: str
    index: int              # among the reply's items
    seq: int                # among the items of its kind (a tool call's index)
    id: str
    name: str | None = None     # the function of a tool call
    call_id: str | None = None
    text: str = ""          # emitted so far (the whole of it once ended)
    received: str = ""      # the parser's text of the message (before the stop filter)
    cut: bool = False       # ended by the end of generation, not by its own end token
    done: bool = False


def item_kind(role: str | None, channel: str | None, recipient: str | None) -> str | None:
    """The same split as chat.reply_from_messages."""
    if recipient and recipient.startswith("functions."):
        return "tool_call"
    if channel == "analysis":
        return "reasoning"
    if role == "assistant":
        return "content"
    return None        # a message the model wrote as someone else: dropped


class Turn:
    """Generated token ids of a harmony reply in, item events out:
    ("start", item, ""), ("delta", item, text), ("end", item, ""). The items'
    texts joined as chat.reply_from_messages joins them give the reply; stop
    strings cut the content. `prefix`: tokens of the reply already in the
    prompt (a forced tool call's header)."""

    def __init__(self, tokenizer, stop: list[str] | None = None, prefix: list[int] = ()):
        self.parser = HarmonyParser(tokenizer)
        for t in prefix:
            self.parser.feed(t)
        self.items: list[Item] = []
        self._by_message: dict[int, Item | None] = {}   # parser message index -> its item
        self._counts: Counter = Counter()
        self._ended = 0            # parser messages whose items are ended
        self.stop = StopFilter(stop) if stop else None
        self.stopped = False       # a stop string ended the reply
        self.reasoning_tokens = 0

    def feed(self, token: int) -> list[tuple]:
        if self.stopped:
            return []
        if self.parser.in_message and self.parser.channel == "analysis":
            self.reasoning_tokens += 1
        d = self.parser.feed(token)
        out = self._end_finished()
        i = len(self.parser.messages)
        if self.parser.in_message and i not in self._by_message:
            p = self.parser                # the header just read
            out += self._start(i, item_kind(p.current_role, p.channel, p.recipient), p.recipient)
        if d is not None and d.text and self._by_message.get(i) is not None:
            out += self._delta(self._by_message[i], d.text)
        return out

    def close(self) -> list[tuple]:
        """The end of generation: the message left open ends here."""
        if self.stopped:
            return []
        n = len(self.parser.messages)
        self.parser.close()
        out = self._end_finished()
        for k in range(n, len(self.parser.messages)):
            item = self._by_message.get(k)
            if item is not None:
                item.cut = True
        return out

    def _start(self, i: int, kind: str | None, recipient: str | None) -> list[tuple]:
        if kind is None:
            self._by_message[i] = None
            return []
        prefix = {"reasoning": "rs_", "content": "msg_", "tool_call": "fc_"}[kind]
        item = Item(kind, len(self.items), self._counts[kind], new_id(prefix))
        if kind == "tool_call":
            item.name, item.call_id = recipient[len("functions."):], new_id("call_")
        self._counts[kind] += 1
        self.items.append(item)
        self._by_message[i] = item
        return [("start", item, "")]

    def _delta(self, item: Item, text: str) -> list[tuple]:
        item.received += text
        if item.kind == "content" and self.stop is not None:
            text = self.stop.push(text)
            if self.stop.hit:
                self.stopped = True
                out = [("delta", item, text)] if text else []
                item.text += text
                for it in self.items:        # everything open ends at the stop
                    if not it.done:
                        it.done = True
                        out.append(("end", it, ""))
                return out
        if not text:
            return []
        item.text += text
        return [("delta", item, text)]

    def _end_finished(self) -> list[tuple]:
        """End the items of messages the parser has finished, sending what the
        parser added at their end (a held-back byte sequence, a header-only
        message's text) as a last delta."""
        out = []
        while self._ended < len(self.parser.messages) and not self.stopped:
            i = self._ended
            msg = self.parser.messages[i]
            self._ended += 1
            if i not in self._by_message:
                out += self._start(i, item_kind(msg.role, msg.channel, msg.recipient), msg.recipient)
            item = self._by_message[i]
            if item is None:
                continue
            if msg.text.startswith(item.received) and len(msg.text) > len(item.received):
                out += self._delta(item, msg.text[len(item.received):])
            if self.stopped:
                break
            if item.kind == "content" and self.stop is not None:
                tail = self.stop.flush()
                if tail:
                    item.text += tail
                    out.append(("delta", item, tail))
            item.done = True
            out.append(("end", item, ""))
        return out

    @property
    def content(self) -> str:
        return "".join(i.text for i in self.items if i.kind == "content")

    @property
    def reasoning(self) -> str:
        return "\n".join(i.text for i in self.items if i.kind == "reasoning")

    @property
    def tool_calls(self) -> list[dict]:
        return [{"id": i.call_id, "type": "function", "function": {"name": i.name, "arguments": i.text}}
                for i in self.items if i.kind == "tool_call"]


class ChatDeltas:
    """Item events as chat.completion.chunk deltas (llama.cpp's and vLLM's
    form: reasoning_content beside content; tool calls by index)."""

    def __call__(self, events: list[tuple]) -> list[dict]:
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


def chat_message(turn: Turn) -> dict:
    m: dict = {"role": "assistant", "content": turn.content}
    calls = turn.tool_calls
    if calls:
        m["tool_calls"] = calls
        if not m["content"]:
            m["content"] = None        # as OpenAI: no text beside the calls
    if turn.reasoning:
        m["reasoning_content"] = turn.reasoning
    return m


# --- the Responses API's shapes -------------------------------------------------

def response_item(item: Item, status: str) -> dict:
    """An output item of the Responses API; in progress: without its text."""
    text = item.text if status != "in_progress" else ""
    if item.kind == "reasoning":
        return {"id": item.id, "type": "reasoning", "summary": [], "status": status,
                "content": [{"type": "reasoning_text", "text": text}] if status != "in_progress" else []}
    if item.kind == "content":
        return {"id": item.id, "type": "message", "role": "assistant", "status": status,
                "content": [_output_text(text)] if status != "in_progress" else []}
    return {"id": item.id, "type": "function_call", "call_id": item.call_id, "name": item.name,
            "arguments": text, "status": status}


def _output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _part(item: Item, text: str) -> dict:
    return {"type": "reasoning_text", "text": text} if item.kind == "reasoning" else _output_text(text)


class ResponseEvents:
    """Item events as the Responses API's server-sent events, numbered."""

    def __init__(self):
        self.seq = 0

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
                                        logprobs=[]))
                elif item.kind == "reasoning":
                    out.append(self.sse("response.reasoning_text.delta", **where, content_index=0, delta=text))
                else:
                    out.append(self.sse("response.function_call_arguments.delta", **where, delta=text))
            else:
                if item.kind == "content":
                    out.append(self.sse("response.output_text.done", **where, content_index=0, text=item.text,
                                        logprobs=[]))
                elif item.kind == "reasoning":
                    out.append(self.sse("response.reasoning_text.done", **where, content_index=0,
                                        text=item.text))
                else:
                    out.append(self.sse("response.function_call_arguments.done", **where, name=item.name,
                                        arguments=item.text))
                if item.kind != "tool_call":
                    out.append(self.sse("response.content_part.done", **where, content_index=0,
                                        part=_part(item, item.text)))
                out.append(self.sse("response.output_item.done", output_index=item.index,
                                    item=response_item(item, item_status(item, incomplete))))
        return out


def item_status(item: Item, incomplete: bool) -> str:
    return "incomplete" if incomplete and item.cut else "completed"


def responses_messages(body: ResponsesBody) -> list[dict]:
    """The Responses API's input items as chat messages. The items of one
    assistant turn (reasoning, a message, function calls) merge into one
    assistant message, so its reasoning stays with its calls."""
    msgs: list[dict] = []
    if body.instructions:
        msgs.append({"role": "developer", "content": body.instructions})
    if isinstance(body.input, str):
        return msgs + [{"role": "user", "content": body.input}]
    turn: dict | None = None

    def flush():
        nonlocal turn
        if turn is not None:
            msgs.append(turn)
            turn = None

    for i, it in enumerate(body.input):
        where = f"input[{i}]"
        kind = it.get("type", "message")
        if kind == "reasoning":
            parts = it.get("content") or it.get("summary") or []
            text = "".join(p.get("text", "") for p in parts if isinstance(p, dict))
            if turn is not None and (turn.get("content") or turn.get("tool_calls")):
                flush()
            turn = turn or {"role": "assistant", "content": ""}
            turn["reasoning_content"] = "\n".join(x for x in (turn.get("reasoning_content"), text) if x)
        elif kind == "function_call":
            if not isinstance(it.get("call_id"), str) or not isinstance(it.get("name"), str):
                raise bad_request(f"{where}: a function_call item needs a call_id and a name", param="input")
            turn = turn or {"role": "assistant", "content": ""}
            turn.setdefault("tool_calls", []).append(
                {"id": it["call_id"], "type": "function",
                 "function": {"name": it["name"], "arguments": it.get("arguments", "")}})
        elif kind == "function_call_output":
            flush()
            if not isinstance(it.get("call_id"), str):
                raise bad_request(f"{where}: a function_call_output item needs a call_id", param="input")
            msgs.append({"role": "tool", "tool_call_id": it["call_id"], "content": it.get("output", "")})
        elif kind == "message":
            if it.get("role") == "assistant":
                if turn is not None and (turn.get("content") or turn.get("tool_calls")):
                    flush()
                turn = turn or {"role": "assistant"}
                turn["content"] = it.get("content")
            else:
                flush()
                msgs.append({"role": it.get("role"), "content": it.get("content")})
        else:
            raise bad_request(f"{where}: input items of type {kind!r} are not supported (messages, "
                              "function_call, function_call_output and reasoning are)", param="input")
    flush()
    return msgs


# --- metrics --------------------------------------------------------------------

class Metrics:
    """Counters for /metrics. Finished generations are counted by the
    forwarding threads, requests by the HTTP middleware: hence the lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests: Counter = Counter()     # (endpoint, status) -> count
        self.stops: Counter = Counter()        # the engine's stop reason -> generations
        self.generated = 0                     # tokens, counted as they are produced
        self.cached = 0
        self.hits = 0
        self.misses = 0

    def request(self, endpoint: str, status: int) -> None:
        with self.lock:
            self.requests[(endpoint, status)] += 1

    def tokens(self, n: int) -> None:
        with self.lock:
            self.generated += n

    def finished(self, req) -> None:
        r = req.result
        with self.lock:
            self.stops["error" if r is None else r.stop_reason] += 1
            if r is not None:
                self.cached += r.cached_tokens
                # an engine that resets the store's counters per generation
                # reports them in the result: totals are kept here
                ec = r.expert_cache or {}
                self.hits += int(ec.get("hits", 0))
                self.misses += int(ec.get("misses", 0))

    def render(self, engine: Engine) -> str:
        lines: list[str] = []

        def metric(name, kind, help, samples):
            lines.extend([f"# HELP {name} {help}", f"# TYPE {name} {kind}"])
            for labels, value in samples:
                lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
                lines.append(f"{name}{{{lab}}} {value}" if lab else f"{name} {value}")

        with self.lock:
            metric("goosedump_requests_total", "counter", "HTTP requests by endpoint and status.",
                   [({"endpoint": e, "status": s}, n) for (e, s), n in sorted(self.requests.items())])
            metric("goosedump_generations_total", "counter",
                   "Finished generations by stop reason (eos, max_tokens, stop, repetition, time_budget, "
                   "disconnected, shutdown, error).",
                   [({"reason": r}, n) for r, n in sorted(self.stops.items())])
            metric("goosedump_prompt_tokens_total", "counter", "Prompt tokens of finished generations.",
                   [({}, engine.prompt_tokens)])
            metric("goosedump_prompt_tokens_cached_total", "counter",
                   "Prompt tokens whose KV cache was reused rather than recomputed.", [({}, self.cached)])
            metric("goosedump_generated_tokens_total", "counter", "Generated tokens, counted as produced.",
                   [({}, self.generated)])
            metric("goosedump_busy_seconds_total", "counter",
                   "Seconds from each request's start to its end, summed over requests.",
                   [({}, round(engine.busy_seconds, 6))])
            tps = engine.generated_tokens / engine.busy_seconds if engine.busy_seconds > 0 else 0.0
            metric("goosedump_tokens_per_second", "gauge",
                   "Generated tokens per busy second of the engine, since start (busy seconds are summed "
                   "over requests: with batched decode, the rate one request sees).", [({}, round(tps, 3))])
            hits, misses = self.hits, self.misses
            store = engine.expert_stats() if hasattr(engine, "expert_stats") else None
            if store is not None:      # the batched engine's counters run since the model was loaded
                hits, misses = max(hits, int(store["hits"])), max(misses, int(store["misses"]))
            metric("goosedump_expert_cache_hits_total", "counter", "Expert cache hits.", [({}, hits)])
            metric("goosedump_expert_cache_misses_total", "counter", "Expert cache misses.", [({}, misses)])
            metric("goosedump_queue_length", "gauge", "Requests waiting for the engine.",
                   [({}, engine.queue_length)])
            metric("goosedump_active_requests", "gauge", "Requests being generated.", [({}, engine.active)])
        return "\n".join(lines) + "\n"


class _Middleware:
    """Plain ASGI (it leaves streaming alone): the API key on /v1/, then
    counts every request by endpoint and status."""

    def __init__(self, app, metrics: Metrics, api_key: str | None):
        self.app, self.metrics, self.api_key = app, metrics, api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        endpoint = path if path in ENDPOINTS else "other"
        status = 500

        async def send_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            denied = self._check_key(scope) if path.startswith("/v1/") else None
            if denied is not None:
                await denied.response()(scope, receive, send_status)
            else:
                await self.app(scope, receive, send_status)
        finally:
            self.metrics.request(endpoint, status)

    def _check_key(self, scope) -> APIError | None:
        if not self.api_key:
            return None
        auth = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        if not auth:
            return APIError(401, "No API key given: send the header 'Authorization: Bearer YOUR_KEY'.",
                            code="invalid_api_key")
        scheme, _, key = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), self.api_key.encode()):
            return APIError(401, "Incorrect API key provided.", code="invalid_api_key")
        return None


# --- from the engine's thread to the event loop ---------------------------------

def _forward(req, loop: asyncio.AbstractEventLoop, q: asyncio.Queue, metrics: Metrics, live: dict) -> None:
    """Runs on its own thread: blocks on the request's events and hands them
    to the loop in batches (whatever has piled up since the last one)."""
    while True:
        batch = [req.get()]
        try:
            while batch[-1] is not None:
                batch.append(req.get(0))
        except queue.Empty:
            pass
        done = batch[-1] is None
        metrics.tokens(sum(1 for e in batch if e is not None and e[0] is not None))
        if done:
            metrics.finished(req)
            live.pop(req.id, None)
        try:
            loop.call_soon_threadsafe(q.put_nowait, batch)
        except RuntimeError:      # the loop is closed: the server is shutting down
            return
        if done:
            return


def start_forwarding(req, metrics: Metrics, live: dict) -> asyncio.Queue:
    """The loop-side queue that receives the request's event batches."""
    q: asyncio.Queue = asyncio.Queue()
    threading.Thread(target=_forward, args=(req, asyncio.get_running_loop(), q, metrics, live), daemon=True,
                     name=f"goosedump-forward-{req.id}").start()
    return q


def cancel_unfinished(req) -> None:
    """The client went away, the response was abandoned, or never started:
    the engine stops before its next token (a stop string's cancel stays)."""
    if not req.done and req.cancelled is None:
        req.cancel("disconnected")


async def engine_events(req, q: asyncio.Queue, request: Request) -> AsyncIterator[tuple]:
    """The request's (token, text) events as they come. Ends when the
    generation does (raising its error, if any) or when the client goes
    away; either way, or if the consumer stops early, the generation is
    cancelled if still running."""
    checked = time.monotonic()
    try:
        while True:
            try:
                batch = q.get_nowait()
            except asyncio.QueueEmpty:
                try:
                    batch = await asyncio.wait_for(q.get(), DISCONNECT_POLL)
                except asyncio.TimeoutError:
                    batch = []
            now = time.monotonic()
            if now - checked >= DISCONNECT_POLL:
                checked = now
                if await request.is_disconnected():
                    return
            for event in batch:
                if event is None:
                    if req.error is not None:
                        raise req.error
                    return
                yield event
    finally:
        cancel_unfinished(req)


class EventStream(StreamingResponse):
    """Server-sent events of a job. However the response ends (finished,
    client gone, cancelled before its first event), the job's generation
    does not outlive it."""

    def __init__(self, content, job: Job):
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.job = job

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            cancel_unfinished(self.job.req)


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


class _Chunks:
    """The SSE chunks of one streamed chat or text completion: each carries
    its piece under `field` ("delta" or "text"); with include_usage every
    chunk has usage null and a last one, with no choices, carries it."""

    def __init__(self, job: "Job", obj: str, model: str, field: str, include_usage: bool):
        self.head = {"id": job.id, "object": obj, "created": job.created, "model": model,
                     "system_fingerprint": FINGERPRINT}
        self.field, self.include_usage = field, include_usage

    def choice(self, piece, finish: str | None = None) -> str:
        d = {**self.head, "choices": [{"index": 0, self.field: piece, "logprobs": None, "finish_reason": finish}]}
        if self.include_usage:
            d["usage"] = None
        return _sse(d)

    def usage(self, usage: dict) -> str:
        return _sse({**self.head, "choices": [], "usage": usage})


def _usage(result, reasoning_tokens: int | None = None) -> dict:
    u = {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.generated_tokens,
         "total_tokens": result.prompt_tokens + result.generated_tokens,
         "prompt_tokens_details": {"cached_tokens": result.cached_tokens}}
    if reasoning_tokens is not None:
        u["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return u


def _stream_error(e: BaseException) -> dict:
    return {"error": {"message": f"generation failed: {e}", "type": "server_error", "param": None, "code": None}}


# --- the application --------------------------------------------------------------

@dataclass
class Job:
    """A submitted generation and what its answer needs."""
    req: Any
    request: Request
    id: str
    created: int
    events: asyncio.Queue               # the engine's events, in batches
    turn: Turn | None = None            # chat and responses: the reply's items
    stop: StopFilter | None = None      # completions: stop strings over the text


class Server:
    """The endpoints over one model and its engine."""

    def __init__(self, model, model_name: str, max_batch: int | None = None):
        self.model = model
        self.name = model_name
        self.tok = model.tokenizer
        self.harmony = has_harmony_tokens(self.tok)
        self.engine = Engine(model) if max_batch is None else Engine(model, max_batch=max_batch)
        self.metrics = Metrics()
        self.live: dict = {}            # id -> request submitted, not finished: cancelled at shutdown

    # -- shared steps

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.name:
            raise APIError(404, f"The model '{model}' does not exist: this server serves '{self.name}'.",
                           param="model", code="model_not_found")

    def max_tokens(self, n: int | None, n_prompt: int, param: str, prompt_param: str) -> int:
        n_ctx = self.model.n_ctx
        if n is None:
            n = n_ctx - n_prompt        # as OpenAI: as much as the context leaves
            if n < 1:
                raise bad_request(f"This model's context is {n_ctx} tokens and the prompt has {n_prompt}: "
                                  "no room is left to answer. Shorten the prompt.",
                                  param=prompt_param, code="context_length_exceeded")
            return n
        if n < 1:
            raise bad_request(f"Invalid '{param}': {n}. It must be at least 1.", param=param,
                              code="integer_below_min_value")
        if n_prompt + n > n_ctx:
            raise bad_request(f"This model's context is {n_ctx} tokens. The prompt has {n_prompt} tokens and "
                              f"{param} asks for {n} more ({n_prompt + n} in all). Shorten the prompt or lower "
                              f"{param}.", param=param if n_prompt < n_ctx else prompt_param,
                              code="context_length_exceeded")
        return n

    def submit(self, prompt: list[int], max_tokens: int, body: _Fields, request: Request, prefix: str,
               prompt_param: str) -> Job:
        try:
            req = self.engine.submit(prompt, max_tokens, sampling_params(body), time_budget=body.time_budget)
        except ContextOverflowError as e:
            raise bad_request(str(e), param=prompt_param, code="context_length_exceeded") from None
        except SamplingError as e:
            raise bad_request(str(e), param=str(e).split()[0]) from None
        except ValueError as e:
            raise bad_request(f"{prompt_param}: {e}", param=prompt_param) from None
        self.live[req.id] = req
        return Job(req, request, new_id(prefix), int(time.time()), start_forwarding(req, self.metrics, self.live))

    def render(self, messages: list[dict], tools, tool_choice, effort: str | None,
               param: str) -> tuple[list[int], list[int]]:
        """(prompt ids, the forced prefix of the reply, also in the prompt)."""
        tools, forced = resolve_tool_choice(tool_choice, tools)
        try:
            ids = self.model.render_chat(messages, reasoning_effort=effort or "medium", tools=tools)
        except ChatError as e:
            raise _chat_error(e, param) from None
        prefix = forced_call_header(self.tok, forced) if forced and self.harmony else []
        return ids + prefix, prefix

    async def run_turn(self, job: Job) -> list[tuple]:
        """Feeds the whole generation to the job's turn; the item events."""
        events = []
        async with self.events(job) as stream:
            async for token, _ in stream:
                if token is not None:
                    events += self.feed(job, token)
        return events + job.turn.close()

    def events(self, job: Job):
        """engine_events, closed (the generation cancelled if unfinished) as
        soon as the consumer leaves its `async with`."""
        return contextlib.aclosing(engine_events(job.req, job.events, job.request))

    def feed(self, job: Job, token: int) -> list[tuple]:
        events = job.turn.feed(token)
        if job.turn.stopped and job.req.cancelled is None:
            job.req.cancel("stop")
        return events

    # -- /v1/models, /health, /metrics

    def models(self) -> dict:
        return {"object": "list", "data": [self.model_card()]}

    def model_card(self) -> dict:
        return {"id": self.name, "object": "model", "created": int(os.path.getmtime(self.model.path)),
                "owned_by": "goosedump"}

    # -- /v1/chat/completions

    async def chat(self, body: ChatBody, request: Request):
        self.check_model(body.model)
        check_common(body)
        if body.logprobs or body.top_logprobs:
            raise bad_request("logprobs are not supported", param="logprobs")
        rf = (body.response_format or {}).get("type", "text")
        if rf != "text":
            raise bad_request(f"response_format {rf!r} is not supported (only 'text')", param="response_format")
        stops = stop_strings(body.stop)
        prompt, prefix = self.render(body.messages, body.tools, body.tool_choice, body.reasoning_effort,
                                     "messages")
        limit = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        job = self.submit(prompt, self.max_tokens(limit, len(prompt), param, "messages"), body, request, "chatcmpl-",
                          "messages")
        job.turn = Turn(self.tok, stops, prefix)
        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            return EventStream(self.chat_stream(job, include_usage), job)
        await self.run_turn(job)
        r = job.req.result
        if r is None:              # the client went away
            return Response(status_code=499)
        turn = job.turn
        return {"id": job.id, "object": "chat.completion", "created": job.created, "model": self.name,
                "system_fingerprint": FINGERPRINT,
                "choices": [{"index": 0, "message": chat_message(turn), "logprobs": None,
                             "finish_reason": finish_reason(r.stop_reason, turn.stopped, bool(turn.tool_calls))}],
                "usage": _usage(r, turn.reasoning_tokens)}

    async def chat_stream(self, job: Job, include_usage: bool) -> AsyncIterator[str]:
        chunk = _Chunks(job, "chat.completion.chunk", self.name, "delta", include_usage)

        deltas = ChatDeltas()
        started = False
        try:
            async with self.events(job) as stream:
                async for token, _ in stream:
                    if token is None:
                        continue
                    if not started:       # the role comes with the first generated token
                        started = True
                        yield chunk.choice({"role": "assistant", "content": ""})
                    for d in deltas(self.feed(job, token)):
                        yield chunk.choice(d)
            r = job.req.result
            if r is None:
                return
            if not started:
                yield chunk.choice({"role": "assistant", "content": ""})
            for d in deltas(job.turn.close()):
                yield chunk.choice(d)
            turn = job.turn
            yield chunk.choice({}, finish_reason(r.stop_reason, turn.stopped, bool(turn.tool_calls)))
            if include_usage:
                yield chunk.usage(_usage(r, turn.reasoning_tokens))
        except Exception as e:         # headers are sent: the error goes in the stream
            yield _sse(_stream_error(e))
        yield "data: [DONE]\n\n"

    # -- /v1/completions

    async def completions(self, body: CompletionBody, request: Request):
        self.check_model(body.model)
        check_common(body)
        for field, bad in (("echo", body.echo), ("suffix", body.suffix), ("logprobs", body.logprobs),
                           ("best_of", body.best_of not in (None, 1))):
            if bad:
                raise bad_request(f"{field} is not supported", param=field)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise bad_request("a batch of prompts is not supported: send one prompt per request",
                                  param="prompt")
            prompt = prompt[0]
        # Raw text may spell special tokens ("<|start|>"), as llama.cpp reads it.
        ids = self.tok.encode(prompt, allow_special=True) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise bad_request("The prompt is empty: nothing to continue from.", param="prompt")
        max_tokens = self.max_tokens(body.max_tokens, len(ids), "max_tokens", "prompt")
        job = self.submit(ids, max_tokens, body, request, "cmpl-", "prompt")
        job.stop = StopFilter(stop_strings(body.stop))
        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            return EventStream(self.completion_stream(job, include_usage), job)
        text = []
        async with contextlib.aclosing(self.completion_pieces(job)) as pieces:
            async for piece in pieces:
                text.append(piece)
        r = job.req.result
        if r is None:
            return Response(status_code=499)
        return {"id": job.id, "object": "text_completion", "created": job.created, "model": self.name,
                "system_fingerprint": FINGERPRINT,
                "choices": [{"index": 0, "text": "".join(text), "logprobs": None,
                             "finish_reason": finish_reason(r.stop_reason, job.stop.hit)}],
                "usage": _usage(r)}

    async def completion_pieces(self, job: Job) -> AsyncIterator[str]:
        """The generated text in pieces, cut at a stop string."""
        f = job.stop
        async with self.events(job) as stream:
            async for _, piece in stream:
                if f.hit or not piece:
                    continue
                out = f.push(piece)
                if f.hit and job.req.cancelled is None:
                    job.req.cancel("stop")
                if out:
                    yield out
        if job.req.result is not None and not f.hit:
            tail = f.flush()
            if tail:
                yield tail

    async def completion_stream(self, job: Job, include_usage: bool) -> AsyncIterator[str]:
        chunk = _Chunks(job, "text_completion", self.name, "text", include_usage)

        try:
            async with contextlib.aclosing(self.completion_pieces(job)) as pieces:
                async for piece in pieces:
                    yield chunk.choice(piece)
            r = job.req.result
            if r is None:
                return
            yield chunk.choice("", finish_reason(r.stop_reason, job.stop.hit))
            if include_usage:
                yield chunk.usage(_usage(r))
        except Exception as e:
            yield _sse(_stream_error(e))
        yield "data: [DONE]\n\n"

    # -- /v1/responses

    async def responses(self, body: ResponsesBody, request: Request):
        self.check_model(body.model)
        check_common(body)
        if body.previous_response_id:
            raise bad_request("previous_response_id is not supported: this server keeps no state; send the "
                              "whole conversation in 'input'", param="previous_response_id")
        fmt = ((body.text or {}).get("format") or {}).get("type", "text")
        if fmt != "text":
            raise bad_request(f"text.format {fmt!r} is not supported (only 'text')", param="text")
        effort = (body.reasoning or {}).get("effort") or "medium"
        prompt, prefix = self.render(responses_messages(body), body.tools, body.tool_choice, effort, "input")
        job = self.submit(prompt, self.max_tokens(body.max_output_tokens, len(prompt), "max_output_tokens", "input"),
                          body, request, "resp_", "input")
        job.turn = Turn(self.tok, stop_strings(body.stop), prefix)
        if body.stream:
            return EventStream(self.responses_stream(job, body, effort), job)
        await self.run_turn(job)
        if job.req.result is None:
            return Response(status_code=499)
        return self.response_object(job, body, effort)

    @staticmethod
    def response_status(job: Job) -> tuple[str, dict | None]:
        """(status, incomplete_details) of a finished response."""
        reason = finish_reason(job.req.result.stop_reason, job.turn.stopped)
        if reason == "stop":
            return "completed", None
        return "incomplete", {"reason": "max_output_tokens" if reason == "length" else reason}

    def response_object(self, job: Job, body: ResponsesBody, effort: str, final: bool = True) -> dict:
        r = job.req.result if final else None
        status, incomplete = self.response_status(job) if r is not None else ("in_progress", None)
        out = {"id": job.id, "object": "response", "created_at": job.created, "status": status,
               "model": self.name, "output": [], "error": None, "incomplete_details": incomplete,
               "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
               "metadata": body.metadata or {}, "parallel_tool_calls": True,
               "previous_response_id": None, "reasoning": {"effort": effort, "summary": None},
               "temperature": body.temperature if body.temperature is not None else 1.0,
               "top_p": body.top_p if body.top_p is not None else 1.0,
               "text": {"format": {"type": "text"}}, "tool_choice": body.tool_choice or "auto",
               "tools": body.tools or [], "truncation": "disabled", "store": False, "usage": None}
        if r is not None:
            if status == "completed":
                out["completed_at"] = int(time.time())
            out["output"] = [response_item(i, item_status(i, status == "incomplete")) for i in job.turn.items]
            out["usage"] = {"input_tokens": r.prompt_tokens,
                            # the prompt tokens computed now stay in the KV cache for the next request
                            "input_tokens_details": {"cached_tokens": r.cached_tokens,
                                                     "cache_write_tokens": r.prompt_tokens - r.cached_tokens},
                            "output_tokens": r.generated_tokens,
                            "output_tokens_details": {"reasoning_tokens": job.turn.reasoning_tokens},
                            "total_tokens": r.prompt_tokens + r.generated_tokens}
        return out

    async def responses_stream(self, job: Job, body: ResponsesBody, effort: str) -> AsyncIterator[str]:
        ev = ResponseEvents()
        yield ev.sse("response.created", response=self.response_object(job, body, effort, final=False))
        yield ev.sse("response.in_progress", response=self.response_object(job, body, effort, final=False))
        try:
            async with self.events(job) as stream:
                async for token, _ in stream:
                    if token is not None:
                        for s in ev.items(self.feed(job, token)):
                            yield s
            if job.req.result is None:
                return
            incomplete = self.response_status(job)[0] == "incomplete"
            for s in ev.items(job.turn.close(), incomplete=incomplete):
                yield s
            final = self.response_object(job, body, effort)
            kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
            yield ev.sse(kind, response=final)
        except Exception as e:
            failed = self.response_object(job, body, effort, final=False)
            failed.update(status="failed", error={"code": "server_error", "message": f"generation failed: {e}"})
            yield ev.sse("response.failed", response=failed)

    def cancel_all(self, reason: str = "shutdown") -> None:
        for req in list(self.live.values()):
            req.cancel(reason)

    def close(self) -> None:
        self.cancel_all()
        self.engine.close()


def create_app(model, *, model_name: str, api_key: str | None = None, max_batch: int | None = None) -> FastAPI:
    """The FastAPI application serving `model` under the id `model_name`;
    with api_key, /v1/ wants 'Authorization: Bearer <api_key>'."""
    server = Server(model, model_name, max_batch)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        server.close()

    app = FastAPI(title="goosedump", version=__version__, lifespan=lifespan)
    app.state.server = server
    app.add_middleware(_Middleware, metrics=server.metrics, api_key=api_key)

    @app.exception_handler(APIError)
    async def api_error(request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, exc: RequestValidationError):
        return _validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        msg = f"{request.method} {request.url.path}: {exc.detail}"
        return APIError(exc.status_code, msg, code=code).response()

    @app.exception_handler(Exception)
    async def server_error(request, exc: Exception):
        return APIError(500, f"internal error: {type(exc).__name__}: {exc}").response()

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": server.name}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(server.metrics.render(server.engine),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        return server.models()

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        server.check_model(model_id)
        return server.model_card()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await server.chat(await parse_body(request, ChatBody), request)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await server.completions(await parse_body(request, CompletionBody), request)

    @app.post("/v1/responses")
    async def responses(request: Request):
        return await server.responses(await parse_body(request, ResponsesBody), request)

    return app


# --- command line -------------------------------------------------------------------

def cmd_serve(args: argparse.Namespace) -> int:
    from .hub import resolve_model
    from .model import load
    if args.max_batch < 1:
        raise ValueError(f"--max-batch must be at least 1, got {args.max_batch}")
    path = resolve_model(args.model)
    model = load(path, n_ctx=args.ctx, threads=args.threads, expert_cache=args.expert_cache,
                 page_cache=args.page_cache)
    model.transformer          # map the weights now, not inside the first request
    name = args.model_name or os.path.basename(path).removesuffix(".gguf")
    app = create_app(model, model_name=name, api_key=args.api_key, max_batch=args.max_batch)
    print(f"goosedump serve: {name} on http://{args.host}:{args.port}/v1 (context {model.n_ctx} tokens"
          f"{', API key required' if args.api_key else ''})", file=sys.stderr, flush=True)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=5)
    _Uvicorn(config, app.state.server).run()
    return 0


class _Uvicorn(uvicorn.Server):
    """Stops the generations as soon as shutdown begins, so open streams end
    at once (finish_reason "shutdown") instead of running on for the
    graceful timeout."""

    def __init__(self, config: uvicorn.Config, server: Server):
        super().__init__(config)
        self.goosedump = server

    async def shutdown(self, sockets=None):
        self.goosedump.cancel_all("shutdown")
        await super().shutdown(sockets)


def main(argv: list[str] | None = None) -> int:
    """`python -m goosedump.server ...`: the same as `goosedump serve ...`."""
    from .cli import main as cli_main
    return cli_main(["serve", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
