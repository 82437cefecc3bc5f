"""The application: one model and its engine behind the OpenAI routes, and
the command that serves it. Ollama's API (/api/chat, /api/generate, ...)
is served beside OpenAI's (goosedump.server.ollama), and llama.cpp's
/completion (goosedump.server.llamacpp), /tokenize, /detokenize,
/apply-template and /props (goosedump.server.tokens),
and Anthropic's Messages API (goosedump.server.anthropic)."""
from __future__ import annotations

import argparse
import contextlib
import os
import sys

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..chat import ChatError, has_harmony_tokens, prefill_tokens, split_prefill
from ..engine import Engine
from ..reply import ReplyStream
from ..reply_plan import PlanError, ReplyPlan, plan_reply
from ..result import ContextOverflowError
from ..sampling import SamplingError
from . import anthropic, chat_completions, completions, llamacpp, ollama, responses, tokens
from .bridge import Submitted, stop_at_string
from .cors import Cors, parse_origins
from .hosts import HostCheck, checked_hosts
from .errors import BODY_IDLE_SECONDS, DEFAULT_MAX_BODY, APIError, bad_request, chat_error, parse_body, validation_error
from .metrics import Metrics, Middleware
from .params import (RequestDefaults, TemplateOptions, check_text_fits, context_error, max_tokens, sampling_params,
                     template_options, text_chars, utc_time)
from .schemas import (CHAT_REPLY, COMPLETION_REPLY, ERROR_RESPONSES, RESPONSE_REPLY, ChatBody, CompletionBody, Fields,
                      ResponsesBody, openapi_extra)


class Server:
    """What every endpoint shares: the model, its engine, the metrics and the
    generations in flight."""

    def __init__(self, model, model_name: str, max_batch: int | None = None, template_kwargs: dict | None = None,
                 defaults: RequestDefaults | None = None):
        self.model = model
        self.template_kwargs = template_kwargs     # serve's --chat-template-kwargs
        self.defaults = defaults or RequestDefaults()   # serve's --temp, -n, ...
        self.name = model_name
        self.tok = model.tokenizer
        self.harmony = has_harmony_tokens(self.tok)
        self.engine = Engine(model) if max_batch is None else Engine(model, max_batch=max_batch)
        self.metrics = Metrics()
        self.live: dict = {}            # id -> generation submitted, not finished: cancelled at shutdown

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.name:
            raise APIError(404, f"The model '{model}' does not exist: this server serves '{self.name}'.",
                           param="model", code="model_not_found")

    def submit(self, prompt: list[int], max_tokens: int, body: Fields, param: str, prompt_param: str,
               constraint=None, logprobs: int | None = None, prompt_logprobs: int | None = None) -> Submitted:
        try:
            return Submitted(self.engine, prompt, max_tokens, sampling_params(body, self.defaults.sampling),
                             body.time_budget, self.metrics, self.live, constraint, logprobs, prompt_logprobs)
        except ContextOverflowError as e:
            raise context_error(e, param, prompt_param) from None
        except SamplingError as e:
            raise bad_request(str(e), param=str(e).split()[0]) from None
        except ValueError as e:
            raise bad_request(f"{prompt_param}: {e}", param=prompt_param) from None

    def limit(self, n: int | None, n_prompt: int, param: str, prompt_param: str, cap: bool = False) -> int:
        """A request's token limit (params.max_tokens, serve's -n by default)."""
        return max_tokens(n, n_prompt, self.model.n_ctx, param, prompt_param, self.defaults.n_predict, cap)

    def render(self, messages: list[dict], tools, tool_choice, effort: str | None, param: str,
               body: Fields, response_format=None, format_param: str = "response_format",
               object_arguments: bool = False, prefill: bool = False) -> tuple[list[int], ReplyPlan]:
        """(prompt ids, the reply's plan: its forced prefix, also in the
        prompt, and its constraint; object_arguments: every tool call's
        arguments must parse, for the APIs that return them as objects;
        prefill: a last assistant message is the reply's start, which the
        reply continues). effort: the request's (None:
        chat_template_kwargs', else medium)."""
        opts = self.template(body)
        budget = getattr(body, "reasoning_budget", None)
        if budget is None:
            budget = opts.budget if opts.budget is not None else self.defaults.reasoning_budget
        history, last = split_prefill(messages) if prefill else (messages, None)
        try:
            start = prefill_tokens(self.tok, last, f"the last of {param}") if last is not None else None
            plan = plan_reply(self.tok, tools, tool_choice, response_format, budget,
                              body.grammar, body.json_schema, self.harmony, format_param, object_arguments, start)
        except ChatError as e:
            raise chat_error(e, param) from None
        except PlanError as e:
            raise bad_request(str(e), param=e.param) from None
        shown = plan.response_format.schema if plan.response_format is not None else None     # (in the prompt too)
        check_text_fits(text_chars(messages) + text_chars(tools) + text_chars(shown), self.tok, self.model.n_ctx,
                        param)
        try:
            ids = self.model.render_chat(history, reasoning_effort=effort or opts.effort or "medium",
                                         tools=plan.tools, model_identity=opts.identity,
                                         response_format=plan.response_format)
        except ChatError as e:
            raise chat_error(e, param) from None
        return ids + plan.prefix, plan

    def template(self, body) -> TemplateOptions:
        """The request's chat_template_kwargs over serve's."""
        return template_options(self.template_kwargs, getattr(body, "chat_template_kwargs", None))

    @staticmethod
    def feed(sub: Submitted, reply: ReplyStream, token: int, lps=None) -> list:
        """A token into the reply; a stop string it completes stops the
        generation; lps (ContentLogprobs) takes the token's log-probability."""
        events = reply.feed(token)
        if reply.stopped:
            stop_at_string(sub)
        if lps is not None:
            lps.add(reply)
        return events

    async def run_reply(self, sub: Submitted, reply: ReplyStream, request: Request, lps=None) -> None:
        """The whole generation fed to its reply (a response that is not
        streamed); lps (ContentLogprobs) takes each token's log-probability."""
        async with sub.events(request) as stream:
            async for token, _ in stream:
                if token is not None:
                    self.feed(sub, reply, token, lps)
        reply.close()

    def model_card(self) -> dict:
        """The model as OpenAI's API lists it, with Anthropic's fields beside
        (type, display_name, created_at), so both SDKs read the one route."""
        mtime = os.path.getmtime(self.model.path)
        return {"id": self.name, "object": "model", "created": int(mtime), "owned_by": "goosedump",
                "type": "model", "display_name": self.name,
                "created_at": utc_time(int(mtime))}

    def cancel_all(self, reason: str = "shutdown") -> None:
        for gen in list(self.live.values()):
            gen.cancel(reason)

    def close(self) -> None:
        self.cancel_all()
        self.engine.close()


def create_app(model, *, model_name: str, api_key: str | None = None, max_batch: int | None = None,
               replica: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY,
               body_timeout: float = BODY_IDLE_SECONDS, chat_template_kwargs: dict | None = None,
               defaults: RequestDefaults | None = None, cors_origins: str = "local",
               allowed_hosts: list[str] | None = None) -> FastAPI:
    """The FastAPI application serving `model` under the id `model_name`;
    with api_key, /v1/ wants 'Authorization: Bearer <api_key>'. Every
    response carries X-Goosedump-Replica: `replica` (default: this host and
    process), the same app whether alone or one of Ray Serve's replicas.
    A request body over max_body_bytes is refused with a 413, one that
    stops arriving for body_timeout seconds with a 408. chat_template_kwargs:
    defaults for every request's (llama.cpp's --chat-template-kwargs);
    defaults: what a request leaves unsaid (serve's --temp, -n, ...).
    cors_origins: the web pages' origins that may call it (cors.py);
    allowed_hosts: None, or the Host names it answers besides the local
    ones (hosts.py, for a server on a loopback address)."""
    server = Server(model, model_name, max_batch, chat_template_kwargs, defaults)
    replica = replica or f"{os.uname().nodename}:{os.getpid()}"

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        server.close()

    app = FastAPI(title="goosedump", version=__version__, lifespan=lifespan)
    app.state.server = server
    app.add_middleware(Middleware, metrics=server.metrics, api_key=api_key, replica=replica)
    # (added last, so outermost: a preflight is answered, and a page of a foreign origin refused, before
    # the API key is asked for)
    app.add_middleware(Cors, origins=parse_origins(cors_origins), expose=["X-Goosedump-Replica"])
    if allowed_hosts is not None:       # (outermost: a rebinding page is refused before anything else answers it)
        app.add_middleware(HostCheck, extra=allowed_hosts)

    @app.exception_handler(APIError)
    async def api_error(request, exc: APIError):
        return exc.response(request.url.path)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request, exc: RequestValidationError):
        return validation_error(exc).response(request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        msg = f"{request.method} {request.url.path}: {exc.detail}"
        return APIError(exc.status_code, msg, code=code).response(request.url.path)

    @app.get("/health", responses=ERROR_RESPONSES)
    async def health():
        return {"status": "ok", "model": server.name}

    @app.get("/metrics", response_class=PlainTextResponse, responses=ERROR_RESPONSES)
    async def metrics():
        return PlainTextResponse(server.metrics.render(server.engine),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models", responses=ERROR_RESPONSES)
    async def models():
        # (has_more, first_id, last_id: Anthropic's page of models)
        return {"object": "list", "data": [server.model_card()], "has_more": False, "first_id": server.name,
                "last_id": server.name}

    @app.get("/v1/models/{model_id:path}", responses=ERROR_RESPONSES)
    async def model_card(model_id: str):
        server.check_model(model_id)
        return server.model_card()

    @app.post("/v1/chat/completions", openapi_extra=openapi_extra(ChatBody, CHAT_REPLY))
    async def chat(request: Request):
        return await chat_completions.handle(server, await parse_body(request, ChatBody, max_body_bytes, body_timeout), request)

    @app.post("/v1/completions", openapi_extra=openapi_extra(CompletionBody, COMPLETION_REPLY))
    async def text_completions(request: Request):
        return await completions.handle(server, await parse_body(request, CompletionBody, max_body_bytes, body_timeout), request)

    @app.post("/v1/responses", openapi_extra=openapi_extra(ResponsesBody, RESPONSE_REPLY))
    async def responses_api(request: Request):
        return await responses.handle(server, await parse_body(request, ResponsesBody, max_body_bytes, body_timeout), request)

    async def read(request: Request, body):
        return await parse_body(request, body, max_body_bytes, body_timeout)

    ollama.register(app, server, read)
    tokens.register(app, server, read)
    anthropic.register(app, server, read)
    llamacpp.register(app, server, read)

    return app


# --- the command ----------------------------------------------------------------------

def serve(args: argparse.Namespace, model) -> int:
    model.stepper              # map the weights now, not inside the first request
    name = args.model_name or os.path.basename(model.path).removesuffix(".gguf")
    app = create_app(model, model_name=name, api_key=args.api_key, max_batch=args.max_batch,
                     max_body_bytes=args.max_body_size, body_timeout=args.body_timeout,
                     chat_template_kwargs=args.chat_template_kwargs, defaults=args.request_defaults,
                     cors_origins=args.cors_origins, allowed_hosts=checked_hosts(args.host, args.allowed_hosts))
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=5)
    sockets, port = None, args.port
    if port == 0:       # the port the system gives, bound here so that the line below can say it
        sockets = [config.bind_socket()]
        port = sockets[0].getsockname()[1]
    base = f"http://{f'[{args.host}]' if ':' in args.host else args.host}:{port}"
    print(f"goosedump serve: {name} on {base}/v1 (context {model.n_ctx} tokens"
          f"{', API key required' if args.api_key else ''}; ollama's API and Anthropic's /v1/messages at "
          f"{base})", file=sys.stderr, flush=True)
    _Uvicorn(config, app.state.server).run(sockets=sockets)
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
