"""Which web pages may call the server from a browser (CORS): serve's
--cors-origins, by Starlette's CORSMiddleware. A page served from another
origin (a chat UI on http://localhost:3000, a tool's webview) may read the
server's answers only if the server names its origin; its POSTs with JSON
or an Authorization header first send an OPTIONS preflight, which the
middleware answers before the API key is asked for.

By default the local origins (http and https on localhost, 127.0.0.1 and
[::1], any port): ollama's default, which keeps a page from the wider web
from driving the model on a user's machine. llama-server allows every
origin: `--cors-origins '*'` does so too."""
from __future__ import annotations

import re
import sys

from starlette.middleware.cors import CORSMiddleware

# http(s) on a loopback name or address, any port
LOCAL = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d{1,5})?"
ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s,*]+", re.I)


class CorsError(ValueError):
    pass


def parse_origins(text: str) -> tuple[list[str], str | None] | None:
    """--cors-origins as (exact origins, an origin pattern), or None for off
    (no CORS headers at all: same-origin pages only)."""
    words = [w.strip() for w in text.split(",") if w.strip()]
    if not words:
        raise CorsError(f"--cors-origins {text!r}: no origin (give local, *, off or scheme://host[:port])")
    if words == ["off"]:
        return None
    if "*" in words:
        return ["*"], None
    exact, local = [], False
    for w in words:
        if w == "local":
            local = True
        elif ORIGIN.fullmatch(w.rstrip("/")):
            exact.append(w.rstrip("/"))    # (a browser's Origin has no path, not even "/")
        else:
            raise CorsError(f"--cors-origins: {w!r} is not an origin (scheme://host[:port], e.g. "
                            f"http://localhost:3000), nor local, * or off")
    return exact, LOCAL if local else None


class Cors(CORSMiddleware):
    """CORSMiddleware that says once per origin, on stderr, that it refused
    a page's preflight: a browser reports only a generic network error to
    the page. (Only preflights: a same-origin POST carries its Origin too,
    and needs no CORS headers.)"""

    def __init__(self, app, origins: tuple[list[str], str | None], expose: list[str]):
        exact, pattern = origins
        super().__init__(app, allow_origins=exact, allow_origin_regex=pattern, allow_methods=["GET", "POST", "DELETE"],
                         allow_headers=["*"], allow_private_network=True, expose_headers=expose)
        self._refused: set[str] = set()

    def preflight_response(self, request_headers):
        origin = request_headers["origin"]
        if not self.is_allowed_origin(origin) and origin not in self._refused and len(self._refused) < 64:
            self._refused.add(origin)
            shown = repr(origin[:200])
            print(f"goosedump serve: a web page from {shown} was refused (CORS); allow it with "
                  f"--cors-origins {shown} (or local, or '*')", file=sys.stderr, flush=True)
        return super().preflight_response(request_headers)
