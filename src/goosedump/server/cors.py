"""Which web pages may call the server from a browser (CORS): serve's
--cors-origins, by Starlette's CORSMiddleware. A page served from another
origin (a chat UI on http://localhost:3000, a desktop app's page) may read
the server's answers only if the server names its origin; its POSTs with
JSON or an Authorization header first send an OPTIONS preflight, which is
answered before the API key is asked for.

CORS alone only keeps a page from reading answers: a page may still send a
plain POST that needs no preflight (the server reads JSON whatever the
Content-Type), and the model would run for it. So a request that carries
the Origin of a page neither allowed nor the server's own is refused with
a 403, as ollama refuses it. Clients that are not browsers send no Origin.

By default the local origins: http and https on localhost, 127.0.0.1,
0.0.0.0 and [::1] at any port, and desktop apps' own schemes (app, file,
tauri, vscode-webview, vscode-file), ollama's default. llama-server allows
every origin: `--cors-origins '*'` does so too."""
from __future__ import annotations

import re
import sys

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware

from .errors import APIError

LOCAL = (r"https?://(localhost|127\.0\.0\.1|0\.0\.0\.0|\[::1\])(:[0-9]{1,5})?"
         r"|(app|file|tauri|vscode-webview|vscode-file)://[^\s]*")
# an origin as browsers write it: scheme://host[:port], no path, user or query
ORIGIN = re.compile(r"([a-z][a-z0-9+.-]*)://([a-z0-9.-]+|\[[0-9a-f:.]+\])(?::([0-9]{1,5}))?")
DEFAULT_PORTS = {"http": "80", "https": "443"}


class CorsError(ValueError):
    pass


def parse_origins(text: str) -> tuple[list[str], str | None]:
    """--cors-origins as (exact origins, an origin pattern): ([], None) for
    off (no page of another origin), (["*"], None) for any."""
    words = [w.strip() for w in text.split(",") if w.strip()]
    if not words:
        raise CorsError(f"--cors-origins {text!r}: no origin (give local, '*', off or scheme://host[:port])")
    for alone in ("*", "off"):
        if alone in words and len(words) > 1:
            raise CorsError(f"--cors-origins {text!r}: {alone} stands alone ('*': every origin, off: none)")
    if words == ["off"]:
        return [], None
    if words == ["*"]:
        return ["*"], None
    exact, local = [], False
    for w in words:
        m = ORIGIN.fullmatch(w.lower().removesuffix("/"))
        if w == "local":
            local = True
        elif m is None or int(m.group(3) or 0) > 65535:
            raise CorsError(f"--cors-origins: {w!r} is not an origin (scheme://host[:port], e.g. "
                            f"http://localhost:3000), nor local, '*' or off")
        else:       # as a browser writes it: lower case, no default port
            scheme, host, port = m.groups()
            exact.append(f"{scheme}://{host}" + (f":{port}" if port and DEFAULT_PORTS.get(scheme) != port else ""))
    return exact, LOCAL if local else None


class Cors(CORSMiddleware):
    """CORSMiddleware that refuses a page's request from an origin neither
    allowed nor the server's own (403), and says once per origin, on
    stderr, that it refused one: a browser tells the page only of a
    network error."""

    def __init__(self, app, origins: tuple[list[str], str | None], expose: list[str]):
        exact, pattern = origins
        super().__init__(app, allow_origins=exact, allow_origin_regex=pattern, allow_methods=["GET", "POST", "DELETE"],
                         allow_headers=["*"], allow_private_network=True, expose_headers=expose)
        self._refused: set[str] = set()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            origin = headers.get("origin")
            preflight = scope["method"] == "OPTIONS" and "access-control-request-method" in headers
            if origin is not None and not preflight and not self.is_allowed_origin(origin) and \
                    origin.lower() != f"{scope.get('scheme', 'http')}://{headers.get('host', '')}".lower():
                self._say_refused(origin)
                error = APIError(403, f"a web page from {origin[:200]!r} may not call this server: start it "
                                      f"with --cors-origins to allow one", code="origin_not_allowed")
                return await error.response(scope["path"])(scope, receive, send)
        await super().__call__(scope, receive, send)

    def preflight_response(self, request_headers):
        if not self.is_allowed_origin(request_headers["origin"]):
            self._say_refused(request_headers["origin"])
        return super().preflight_response(request_headers)

    def _say_refused(self, origin: str) -> None:
        if origin in self._refused or len(self._refused) >= 64:
            return
        self._refused.add(origin)
        shown = repr(origin[:200])[1:-1]          # (control characters escaped)
        how = ("only '*' allows it (a page opened from a file or in a sandboxed frame)" if origin == "null" else
               f"allow it with --cors-origins 'local,{shown}' (or '*': every origin)")
        print(f"goosedump serve: a web page from '{shown}' was refused (CORS); {how}", file=sys.stderr, flush=True)
