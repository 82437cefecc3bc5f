"""Errors as OpenAI answers them: {"error": {message, type, param, code}},
and request bodies read as JSON whatever their Content-Type."""
from __future__ import annotations

import asyncio
import json
import re
import sys

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from ..chat import ChatError


class APIError(Exception):
    """An error answered as OpenAI does: {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, path: str = "") -> JSONResponse:
        """The answer, in the shape of the API the path belongs to: under
        /api/ (ollama's routes) {"error": message}; under /v1/messages
        (Anthropic's) {"type": "error", "error": {"type", "message"}}."""
        if path.startswith("/api/"):
            body = {"error": self.message}
        elif path.startswith("/v1/messages"):
            body = self.anthropic()
        else:
            body = self.body()
        return JSONResponse(body, status_code=self.status)

    def anthropic(self) -> dict:
        """The error as Anthropic's API writes it, in a body or a stream's error event."""
        kind = ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}


# Anthropic's error types by status
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
                   500: "api_error", 529: "overloaded_error"}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param, code)


def validation_error(exc: RequestValidationError | ValidationError) -> APIError:
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


DEFAULT_MAX_BODY = 16 << 20
BODY_IDLE_SECONDS = 20.0


def too_large(limit: int) -> APIError:
    return APIError(413, f"The request body is larger than this server's limit of {limit} bytes "
                         f"(goosedump serve --max-body-size).", code="request_too_large")


async def read_body(request: Request, limit: int, idle_seconds: float = BODY_IDLE_SECONDS) -> bytes:
    """The body, refused with a 413 as soon as it passes `limit` bytes (by
    its Content-Length, else while it arrives): a huge body is never held."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    parts, size = [], 0
    chunks = request.stream().__aiter__()
    while True:
        try:
            # a client that stops sending mid-body is let go, not waited for
            chunk = await asyncio.wait_for(chunks.__anext__(), idle_seconds)
        except StopAsyncIteration:
            break
        except ClientDisconnect:
            # (no one reads the answer: this only keeps the log free of a traceback)
            raise APIError(400, "The client closed the connection before its request body arrived whole.",
                           code="client_disconnected") from None
        except asyncio.TimeoutError:
            raise APIError(408, f"The request body stopped arriving: nothing came for {idle_seconds:g} s "
                                f"(goosedump serve --body-timeout).",
                           code="request_timeout") from None
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        parts.append(chunk)
    return b"".join(parts)


async def parse_body(request: Request, model: type[BaseModel], limit: int = DEFAULT_MAX_BODY,
                     idle_seconds: float = BODY_IDLE_SECONDS):
    """The JSON body as `model`, whatever the Content-Type says (curl -d
    sends form encoding; the body is JSON all the same)."""
    raw = await read_body(request, limit, idle_seconds)
    if not raw.strip():
        raise bad_request("The request body is missing: send a JSON object.")
    try:
        data = json.loads(raw)
    except RecursionError:
        raise bad_request("The request body nests its JSON too deeply to be read.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"The request body is not valid JSON: {e}.") from None
    except ValueError:   # an integer past Python's limit of digits (sys.get_int_max_str_digits)
        raise bad_request(f"The request body holds an integer of more than {sys.get_int_max_str_digits()} digits, "
                          f"which this server does not read.") from None
    if _ESCAPED_SURROGATE.search(raw):
        where = unpaired_surrogate(data)
        if where is not None:
            raise bad_request(f"The request body's string at {where} holds an unpaired UTF-16 surrogate "
                              f"(a \\ud800-\\udfff escape without its pair): it is not text.",
                              param=re.split(r"[.\[ ]", where)[0])
    if not isinstance(data, dict):
        raise bad_request(f"The request body must be a JSON object, got {type(data).__name__}.")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e) from None
    except RecursionError:
        raise bad_request("The request body nests its JSON too deeply to be read.") from None


# a \uD800..\uDFFF escape somewhere in the raw body (raw UTF-8 cannot hold one):
# only then is the parsed body walked for a lone one
_ESCAPED_SURROGATE = re.compile(rb"\\[uU][dD][89a-fA-F]")


def unpaired_surrogate(data) -> str | None:
    """The path ("messages[0].content") of the first string or key in data
    that holds an unpaired surrogate, which json.loads lets through and no
    encoder can write back (the answer that echoes it would fail), or None."""
    stack = [(data, "body")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return path
        elif isinstance(value, dict):
            for k, v in value.items():
                try:
                    k.encode("utf-8")
                except UnicodeEncodeError:
                    return f"{path} (a key)"
                stack.append((v, k if path == "body" else f"{path}.{k}"))
        elif isinstance(value, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(value))
    return None


def chat_error(e: ChatError, default_param: str = "messages") -> APIError:
    msg = str(e)
    for param in ("tools", "reasoning_effort", "date", "chat_format"):
        if msg.startswith(param):
            return bad_request(msg, param=param)
    return bad_request(msg, param=default_param)
