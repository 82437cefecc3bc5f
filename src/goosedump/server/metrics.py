"""/metrics (Prometheus text) and the ASGI middleware that checks the API key
and counts every request by endpoint and status."""
from __future__ import annotations

import hmac
import threading
from collections import Counter

from .errors import APIError

ENDPOINTS = ("/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/responses", "/health", "/metrics",
             "/api/chat", "/api/generate", "/v1/messages", "/completion")
# llama.cpp's routes outside /v1/ (server/tokens.py, llamacpp.py), which want the API key as /v1/ does
GUARDED = ("/completion", "/tokenize", "/detokenize", "/apply-template", "/props")
# llama-server's other names for the same routes (clients given a base URL without /v1 use them):
# each is served as the route it names, with that route's key check, error shape and counter.
# (/completions is llama.cpp's own completion, as /completion, not OpenAI's.)
ALIASES = {"/chat/completions": "/v1/chat/completions", "/responses": "/v1/responses", "/models": "/v1/models",
           "/v1/health": "/health", "/completions": "/completion",
           "/chat/completions/input_tokens": "/v1/chat/completions/input_tokens",
           "/responses/input_tokens": "/v1/responses/input_tokens"}


def api_keys(text: str | None) -> list[str]:
    """The keys in --api-key's value: several comma-separated, as llama-server takes them."""
    return [k.strip() for k in (text or "").split(",") if k.strip()]


class Metrics:
    """Counters for /metrics. Generations are counted on the engine's thread
    as they produce tokens and end, requests by the middleware: hence the
    lock. The expert cache's counters are the store's own."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests: Counter = Counter()     # (endpoint, status) -> count
        self.stops: Counter = Counter()        # the engine's stop reason -> generations
        self.generated = 0                     # tokens, counted as they are produced
        self.cached = 0

    def request(self, endpoint: str, status: int) -> None:
        with self.lock:
            self.requests[(endpoint, status)] += 1

    def token(self) -> None:
        with self.lock:
            self.generated += 1

    def finished(self, gen) -> None:
        r = gen.result
        with self.lock:
            self.stops["error" if r is None else r.stop_reason] += 1
            if r is not None:
                self.cached += r.cached_tokens

    def render(self, engine) -> str:
        lines: list[str] = []

        def metric(name, kind, help, samples):
            lines.extend([f"# HELP {name} {help}", f"# TYPE {name} {kind}"])
            for labels, value in samples:
                lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
                lines.append(f"{name}{{{lab}}} {value}" if lab else f"{name} {value}")

        store = engine.model.store.counters()
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
            metric("goosedump_expert_cache_hits_total", "counter", "Expert cache hits.", [({}, store.hits)])
            metric("goosedump_expert_cache_misses_total", "counter", "Expert cache misses.", [({}, store.misses)])
            metric("goosedump_queue_length", "gauge", "Requests waiting for the engine.",
                   [({}, engine.queue_length)])
            metric("goosedump_active_requests", "gauge", "Requests being generated.", [({}, engine.active)])
        return "\n".join(lines) + "\n"


class Middleware:
    """Plain ASGI (it leaves streaming alone): llama-server's aliases as the
    routes they name, HEAD as a GET without its body, the API key on /v1/,
    /api/ (but /api/version) and llama.cpp's routes (GUARDED), then counts
    every request by endpoint and status, names the replica, and answers
    an internal error with a 500 in the API's shape."""

    def __init__(self, app, metrics: Metrics, api_key: str | None, replica: str | None = None):
        self.app, self.metrics = app, metrics
        self.api_keys = [k.encode() for k in api_keys(api_key)]
        # every response names the replica that made it (X-Goosedump-Replica)
        self.replica_header = (b"x-goosedump-replica", replica.encode("latin-1", "replace")) if replica else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        if path in ALIASES:
            path = ALIASES[path]
            scope = {**scope, "path": path, "raw_path": path.encode()}
        endpoint = path if path in ENDPOINTS else "other"
        status = 500
        # HEAD: the GET's status and headers (ollama's CLI checks a server by
        # HEAD / before every command; it had met a 405), no body
        head = scope["method"] == "HEAD"
        if head:
            scope = {**scope, "method": "GET"}

        started = False

        async def send_status(message):
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = message["status"], True
                if self.replica_header is not None:
                    message = {**message, "headers": [*message.get("headers", []), self.replica_header]}
            elif head and message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        try:
            guarded = (path.startswith(("/v1/", "/api/")) and path != "/api/version") or path in GUARDED
            # (/api/version is probed by apps, as /health)
            denied = self._check_key(scope) if guarded else None
            if denied is not None:
                await denied.response(path)(scope, receive, send_status)
            else:
                await self.app(scope, receive, send_status)
        except Exception as e:
            # The 500 answered here rather than by Starlette's outermost error
            # middleware, so that it passes back through this one (the replica
            # header) and CORS's (a page may read it); re-raised, uvicorn logs it.
            if not started:
                error = APIError(500, f"internal error: {type(e).__name__}: {e}")
                await error.response(path)(scope, receive, send_status)
            raise
        finally:
            self.metrics.request(endpoint, status)

    def _check_key(self, scope) -> APIError | None:
        if not self.api_keys:
            return None
        headers = dict(scope["headers"])
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if not auth and b"x-api-key" in headers:       # Anthropic's header
            auth = "Bearer " + headers[b"x-api-key"].decode("latin-1")
        if not auth:
            return APIError(401, "No API key given: send the header 'Authorization: Bearer YOUR_KEY'.",
                            code="invalid_api_key")
        scheme, _, key = auth.partition(" ")
        given = key.strip().encode()
        matches = [hmac.compare_digest(given, k) for k in self.api_keys]     # (each compared: no early exit)
        if scheme.lower() != "bearer" or not any(matches):
            return APIError(401, "Incorrect API key provided.", code="invalid_api_key")
        return None
