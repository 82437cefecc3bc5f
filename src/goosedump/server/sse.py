"""Server-sent events: the chunks of a streamed chat or text completion, and
the ending every such stream shares."""
from __future__ import annotations

import json
from typing import AsyncIterator

from .. import __version__
from .errors import APIError

FINGERPRINT = f"goosedump-{__version__}"
DONE = "data: [DONE]\n\n"


def sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def stream_error(e: BaseException) -> dict:
    """An error as a stream's last event: the request's own (an APIError,
    e.g. no token left to choose) as its 400 would say it."""
    if isinstance(e, APIError):
        return e.body()
    return {"error": {"message": f"generation failed: {e}", "type": "server_error", "param": None, "code": None}}


class Chunks:
    """The SSE chunks of one streamed chat or text completion: each carries
    its piece under `field` ("delta" or "text"); with include_usage every
    chunk has usage null and a last one, with no choices, carries it."""

    def __init__(self, id: str, created: int, obj: str, model: str, field: str, include_usage: bool,
                 index: int = 0):
        self.head = {"id": id, "object": obj, "created": created, "model": model, "system_fingerprint": FINGERPRINT}
        self.field, self.include_usage, self.index = field, include_usage, index

    def at(self, index: int) -> "Chunks":
        """The chunks of choice `index` of the same response."""
        other = Chunks.__new__(Chunks)
        other.head, other.field, other.include_usage, other.index = self.head, self.field, self.include_usage, index
        return other

    def choice(self, piece, finish: str | None = None, logprobs: dict | None = None) -> str:
        d = {**self.head, "choices": [{"index": self.index, self.field: piece, "logprobs": logprobs,
                                       "finish_reason": finish}]}
        if self.include_usage:
            d["usage"] = None
        return sse(d)

    def ending(self, empty_piece, finish: str, usage: dict | None, logprobs: dict | None = None) -> list[str]:
        """The last chunks: the finish reason (with the log-probabilities of
        tokens whose text never came: held back, then cut), then usage if
        asked for (None: a choice of several, whose response says it)."""
        return [self.choice(empty_piece, finish, logprobs)] + ([self.usage(usage)]
                                                               if self.include_usage and usage is not None else [])

    def usage(self, usage: dict) -> str:
        return sse({**self.head, "choices": [], "usage": usage})


async def completion_stream(body: AsyncIterator[str]) -> AsyncIterator[str]:
    """A chat or text completion's stream: body's chunks; if it fails, the
    error as a chunk (the headers are sent: no status can tell); then [DONE]."""
    try:
        async for s in body:
            yield s
    except Exception as e:
        yield sse(stream_error(e))
    yield DONE
