"""Ollama's API beside OpenAI's, for the clients and tools written for
ollama (its Python and JavaScript libraries, and the apps built on them):
/api/chat and /api/generate over the same engine and reply layer as /v1,
streamed as newline-delimited JSON unless `stream` is false (ollama's
default is to stream), and /api/tags, /api/show, /api/ps and /api/version
describing the one model served. Errors are ollama's {"error": "..."}
(app.py writes them for every /api/ path)."""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import time
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import Response

from .. import __version__
from ..logprobs import ContentLogprobs, Unread, chat_entry
from ..reply import ReplyStream, StopFilter, call_arguments
from ..reply_plan import PlanError, raw_constraint, tool_names
from .bridge import EventStream, Submitted
from .completions import text_pieces
from .errors import APIError, bad_request
from .ollama_params import OllamaChatBody, OllamaFields, OllamaGenerateBody, chat_messages, read_request
from .params import check_text_fits, finish_reason, token_ids, utc_time

NDJSON = "application/x-ndjson"
NOT_HERE = ("pull", "push", "create", "copy", "delete", "embed", "embeddings")


def line(d: dict) -> str:
    return json.dumps(d, ensure_ascii=False) + "\n"


class ModelInfo:
    """The served model as ollama describes a model."""

    def __init__(self, server):
        m = server.model
        self.server, self.path = server, m.path
        self.size = sum(part.size for part in m.file.parts)
        self.modified = dt.datetime.fromtimestamp(os.path.getmtime(m.path), dt.timezone.utc).isoformat()
        # ollama's digest hashes its manifest; here the file's path, size and time, not its gigabytes (ollama's
        # CLI shows its first 12 characters, and fails on an empty one)
        ident = f"{os.path.realpath(m.path)}\0{self.size}\0{m.file.mtime_ns}"
        self.digest = hashlib.sha256(ident.encode()).hexdigest()
        params = sum(math.prod(t.dims) for t in m.file.tensors.values())
        by_type = m.layout.by_type
        arch = m.file.get("general.architecture", "gpt-oss")
        self.details = {"parent_model": "", "format": "gguf", "family": arch, "families": [arch],
                        "parameter_size": parameter_size(params),
                        "quantization_level": max(by_type, key=lambda k: by_type[k][1]).upper()}
        # (a float that is no number, NaN or infinite, as JSON has none: null, not a 500 for the whole answer)
        self.model_info = {k: None if isinstance(f.value, float) and not math.isfinite(f.value) else f.value
                           for k, f in m.file.fields.items()
                           if isinstance(f.value, (str, int, float, bool)) and not k.startswith("tokenizer.")}
        self.model_info["general.parameter_count"] = params

    def named(self, model: str | None) -> None:
        """Refuse another model's name (the served one's, with or without ollama's :latest, is fine)."""
        name = self.server.name
        if model not in (None, "", name, name + ":latest"):
            raise APIError(404, f"model '{model}' not found: this server serves '{name}'")

    def listing(self) -> dict:
        n = self.server.name
        return {"name": n, "model": n, "modified_at": self.modified, "size": self.size, "digest": self.digest,
                "details": self.details}


def parameter_size(n: int) -> str:
    """A count as ollama writes it: 20.9B, 137M, 40K."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}B" if unit == "B" else f"{n / size:.0f}{unit}"
    return str(n)


def register(app: FastAPI, server, read) -> None:
    """The /api routes on app; read(request, Body) parses a body (parse_body
    with the server's limits)."""
    info = ModelInfo(server)

    @app.get("/", include_in_schema=False)
    async def root():
        return Response("goosedump is running (OpenAI's API under /v1, ollama's under /api)", media_type="text/plain")

    @app.get("/api/version", openapi_extra=described("the server's version"))
    async def version():
        return {"version": __version__}

    @app.get("/api/tags", openapi_extra=described("the models served (one)"))
    async def tags():
        return {"models": [info.listing()]}

    @app.get("/api/ps", openapi_extra=described("the models loaded (one)"))
    async def ps():
        # (loaded until the server stops: ollama's CLI says Forever past 20 years ahead, Stopping at a past time)
        until = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) + dt.timedelta(days=100 * 365)
        return {"models": [{**info.listing(), "expires_at": until.isoformat(), "size_vram": 0,
                            "context_length": server.model.n_ctx}]}

    @app.post("/api/show", openapi_extra=described("a model's details", SHOW_BODY))
    async def show(request: Request):
        body = await read(request, OllamaFields)
        info.named(body.model or (body.model_extra or {}).get("name"))
        return {"modelfile": f"FROM {info.path}\n", "parameters": "", "template": server.model.chat_template or "",
                "details": info.details, "model_info": info.model_info, "modified_at": info.modified,
                "capabilities": ["completion", "tools", "thinking"] if server.harmony else ["completion"]}

    @app.post("/api/chat", openapi_extra=described("a chat turn, or its stream", OllamaChatBody))
    async def chat(request: Request):
        body = await read(request, OllamaChatBody)
        info.named(body.model)
        return await reply(server, body, request, chat_messages(body.messages), body.tools, True)

    @app.post("/api/generate", openapi_extra=described("a completion, or its stream", OllamaGenerateBody))
    async def generate(request: Request):
        body = await read(request, OllamaGenerateBody)
        info.named(body.model)
        for field in ("suffix", "template", "images"):
            if getattr(body, field):
                raise bad_request(f"{field} is not supported: "
                                  + {"suffix": "the model does not fill in the middle",
                                     "template": "the model's chat format (harmony) is fixed",
                                     "images": "this model reads text only"}[field], param=field)
        if body.raw:
            return await raw_reply(server, body, request)
        messages = ([{"role": "system", "content": body.system}] if body.system else []) + \
            ([{"role": "user", "content": body.prompt}] if body.prompt else [])
        return await reply(server, body, request, messages, None, False)

    for name in NOT_HERE:
        # (ollama's delete is DELETE /api/delete, the others POSTs; a POST to
        # delete is answered the same way rather than with a 405)
        @app.api_route(f"/api/{name}", methods=["POST", "DELETE"] if name == "delete" else ["POST"],
                       include_in_schema=False)
        async def not_here(request: Request):
            what = request.url.path
            raise APIError(501, f"{what} is not supported: this server serves the one model it was started with "
                                f"({server.name}); `goosedump pull` downloads models")


def described(what: str, body=None) -> dict:
    """openapi_extra of an /api route: its body and answers, for /openapi.json."""
    out: dict = {"responses": {"200": {"description": what,
                                       "content": {"application/json": {"schema": {"type": "object"}},
                                                   NDJSON: {"schema": {"type": "object"}}}},
                               **{code: {"description": "an error, as ollama answers it",
                                         "content": {"application/json": {"schema": ERROR}}}
                                  for code in ("400", "401", "404", "408", "413")}}}
    if body is not None:
        schema = body if isinstance(body, dict) else body.model_json_schema()
        if "options" in schema.get("properties", {}):      # the options read, so that fuzzers try them
            schema["properties"]["options"] = {"anyOf": [OPTIONS, {"type": "null"}]}
        out["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
    return out


OPTIONS = {"type": "object", "additionalProperties": True, "properties": {
    **{k: {"type": "number"} for k in ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty",
                                       "frequency_penalty", "tfs_z", "typical_p")},
    **{k: {"type": "integer"} for k in ("top_k", "seed", "num_predict", "repeat_last_n", "mirostat", "num_ctx")},
    "stop": {"type": "array", "items": {"type": "string"}}}}


ERROR = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
SHOW_BODY = {"type": "object", "properties": {"model": {"type": "string"}, "name": {"type": "string"}}}


def stats(r, t0: float) -> dict:
    """ollama's counts and durations (nanoseconds) of a finished generation."""
    return {"total_duration": int((time.perf_counter() - t0) * 1e9), "load_duration": 0,
            "prompt_eval_count": r.prompt_tokens, "prompt_eval_duration": int(r.prefill_seconds * 1e9),
            "eval_count": r.generated_tokens, "eval_duration": int(r.decode_seconds * 1e9)}


class Shape:
    """Where a reply's text goes: a chat's message, or generate's response
    (which also returns the context: the prompt's and the reply's tokens)."""

    def __init__(self, server, chat: bool, show_thinking: bool):
        self.name, self.chat, self.show_thinking = server.name, chat, show_thinking

    def chunk(self, content: str = "", thinking: str = "", calls=None, done: bool = False) -> dict:
        if self.chat:
            m: dict = {"role": "assistant", "content": content}
            if thinking and self.show_thinking:
                m["thinking"] = thinking
            if calls:
                m["tool_calls"] = calls
            body = {"message": m}
        else:
            body = {"response": content}
            if thinking and self.show_thinking:
                body["thinking"] = thinking
        return {"model": self.name, "created_at": utc_time(), **body, "done": done}

    def last(self, sub: Submitted, stopped: bool, t0: float, **reply) -> dict:
        r = sub.gen.result
        out = {**self.chunk(**reply, done=True), "done_reason": finish_reason(r.stop_reason, stopped), **stats(r, t0)}
        if not self.chat:
            out["context"] = r.prompt_token_ids + r.token_ids
        return out


def tool_call(item) -> dict | None:
    """An ended tool call item as ollama writes it (its arguments an object);
    None for one the token limit cut before its arguments parsed."""
    args = call_arguments(item)
    # (the id as ollama gives one: a tool message's tool_call_id names the call it answers)
    return None if args is None else {"id": item.call_id, "function": {"name": item.name, "arguments": args}}


def pieces(events) -> list[dict]:
    """Reply events as chunk fields: text as it comes, a tool call whole once it ends."""
    out = []
    for what, item, text in events:
        if what == "start" and item.kind == "reasoning" and item.seq > 0:
            out.append({"thinking": "\n"})      # reasoning items join with a newline, as the whole reply's
        elif what == "delta" and item.kind in ("content", "reasoning") and text:
            out.append({"content": text} if item.kind == "content" else {"thinking": text})
        elif what == "end" and item.kind == "tool_call":
            call = tool_call(item)
            if call is not None:
                out.append({"calls": [call]})
    return out


async def reply(server, body: OllamaFields, request: Request, messages: list[dict], tools, chat: bool):
    t0 = time.perf_counter()
    req = read_request(body)
    shape = Shape(server, chat, req.show_thinking)
    if not messages:                 # ollama: an empty request loads the model and says so
        return {**shape.chunk(done=True), "done_reason": "load"}
    prompt_param = "messages" if chat else "prompt"
    prompt, plan = server.render(messages, tools, None, req.effort, prompt_param, req.fields, req.response_format,
                                 "format", object_arguments=True, prefill=chat)
    if not chat and getattr(body, "context", None):
        prompt = token_ids(server.tok, body.context, "context") + prompt
    n = server.limit(req.limit, len(prompt), "options.num_predict", prompt_param, cap=True)
    sub = server.submit(prompt, n, req.fields, "options.num_predict", prompt_param, plan.gate(server.tok), req.n_top)
    reply = ReplyStream(server.tok, req.stops, plan.prefix, tools=tool_names(plan.tools))
    lps = None if req.n_top is None else ContentLogprobs(server.tok, sub.gen)
    if body.stream:
        return EventStream(ndjson(_stream(server, sub, reply, shape, lps, t0)), sub.gen, NDJSON)
    await server.run_reply(sub, reply, request, lps)
    if sub.gen.result is None:        # the client went away
        return Response(status_code=499)
    calls = [c for c in map(tool_call, (i for i in reply.items if i.kind == "tool_call")) if c is not None]
    out = shape.last(sub, reply.stopped, t0, content=reply.reply.content, thinking=reply.reply.reasoning_content,
                     calls=calls)
    if lps is not None:
        out["logprobs"] = lps.entries
    return out


async def _stream(server, sub: Submitted, reply: ReplyStream, shape: Shape, lps, t0: float) -> AsyncIterator[str]:
    def chunks(events):
        for p in pieces(events):
            d = shape.chunk(**p)
            new = lps.take() if lps is not None and "content" in p else None
            if new:
                d["logprobs"] = new
            yield line(d)

    async with sub.events() as stream:
        async for token, _ in stream:
            if token is not None:
                for s in chunks(server.feed(sub, reply, token, lps)):
                    yield s
    if sub.gen.result is None:
        return
    for s in chunks(reply.close()):
        yield s
    yield line(shape.last(sub, reply.stopped, t0))


async def raw_reply(server, body: OllamaGenerateBody, request: Request):
    """generate with raw: the prompt continued as it is, no chat format."""
    t0 = time.perf_counter()
    req = read_request(body)
    if body.system:
        raise bad_request("system has no place in a raw prompt: write it into the prompt", param="system")
    check_text_fits(len(body.prompt or ""), server.tok, server.model.n_ctx, "prompt")
    ids = token_ids(server.tok, body.context or [], "context") + \
        server.tok.encode(body.prompt or "", allow_special=True)
    shape = Shape(server, False, True)
    if not ids:
        return {**shape.chunk(done=True), "done_reason": "load"}
    fmt = req.response_format
    try:
        constraint = raw_constraint(server.tok, None, None if fmt is None else fmt.get("schema", {"type": "object"}),
                                    "format")
    except PlanError as e:
        raise bad_request(str(e), param="format") from None
    n = server.limit(req.limit, len(ids), "options.num_predict", "prompt", cap=True)
    sub = server.submit(ids, n, req.fields, "options.num_predict", "prompt", constraint, req.n_top)
    stop = StopFilter(req.stops)
    unread = Unread(sub)

    def new_logprobs() -> list[dict]:
        return [chat_entry(server.tok, lp) for lp in unread.take()]

    async def stream():
        async with text_pieces(sub, stop, None) as texts:
            async for piece in texts:
                d = shape.chunk(piece)
                if req.n_top is not None:
                    d["logprobs"] = new_logprobs()
                yield line(d)
        if sub.gen.result is not None:
            yield line(shape.last(sub, stop.hit, t0))

    if body.stream:
        return EventStream(ndjson(stream()), sub.gen, NDJSON)
    text = []
    async with text_pieces(sub, stop, None, request) as texts:
        async for piece in texts:
            text.append(piece)
    if sub.gen.result is None:
        return Response(status_code=499)
    out = shape.last(sub, stop.hit, t0, content="".join(text))
    if req.n_top is not None:
        out["logprobs"] = new_logprobs()
    return out


async def ndjson(body: AsyncIterator[str]) -> AsyncIterator[str]:
    """A stream's lines; if it fails, the error as ollama writes it (the
    headers are sent: no status can tell)."""
    try:
        async for s in body:
            yield s
    except Exception as e:
        yield line({"error": f"generation failed: {e}"})
