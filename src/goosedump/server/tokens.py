"""The prompt without a generation: llama.cpp's server routes /tokenize,
/detokenize, /apply-template and /props (the shapes its README gives), and
OpenAI's input token counts (POST /v1/responses/input_tokens, and llama.cpp's
/v1/chat/completions/input_tokens for a chat body). Errors are OpenAI's, as
on /v1."""
from __future__ import annotations

import asyncio
from typing import Union

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict

from .. import __version__
from ..sampling import SAMPLER_ORDER_TEMPERATURE_LAST, SamplingParams
from . import chat_completions, responses
from .params import token_ids
from .schemas import ERROR_RESPONSES, ChatBody, ResponsesBody, openapi_extra


class TokenizeBody(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    content: str
    add_special: bool = False       # the BOS token first, where the model's vocabulary adds one
    parse_special: bool = True      # "<|start|>" as its token, not as text
    with_pieces: bool = False


class DetokenizeBody(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    tokens: list[int]


class CountBody(ResponsesBody):
    input: Union[str, list[dict], None] = None       # the instructions alone count too


COUNT_REPLY = {"type": "object", "required": ["object", "input_tokens"],
               "properties": {"object": {"const": "response.input_tokens"}, "input_tokens": {"type": "integer"}}}


def reply_schema(*required: str) -> dict:
    return {"type": "object", "required": list(required)}


def piece(tok, token: int) -> Union[str, list[int]]:
    """A token's text, or its bytes where they are not UTF-8 by themselves (llama.cpp's rule)."""
    b = tok.token_bytes(token)
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return list(b)


def register(app: FastAPI, server, read) -> None:
    """The routes on app; read(request, Body) parses a body (parse_body with
    the server's limits)."""
    tok, model = server.tok, server.model
    # (a BOOL true alone: llama.cpp reads the key as a bool; a string "false" is no true)
    add_bos = model.file.get("tokenizer.ggml.add_bos_token", False) is True and tok.bos_id is not None

    @app.post("/tokenize", openapi_extra=openapi_extra(TokenizeBody, reply_schema("tokens")))
    async def tokenize(request: Request):
        body = await read(request, TokenizeBody)
        # in a thread (the tokenizer lets go of the GIL): a long text does not hold up other requests
        ids = ([tok.bos_id] if body.add_special and add_bos else []) + \
            await asyncio.to_thread(tok.encode, body.content, body.parse_special)
        if body.with_pieces:
            return {"tokens": [{"id": t, "piece": piece(tok, t)} for t in ids]}
        return {"tokens": ids}

    @app.post("/detokenize", openapi_extra=openapi_extra(DetokenizeBody, reply_schema("content")))
    async def detokenize(request: Request):
        body = await read(request, DetokenizeBody)
        return {"content": tok.decode(token_ids(tok, body.tokens, "tokens"))}

    @app.post("/apply-template", openapi_extra=openapi_extra(ChatBody, reply_schema("prompt")))
    async def apply_template(request: Request):
        prompt, _ = chat_completions.render(server, await read(request, ChatBody))
        return {"prompt": tok.decode(prompt)}

    @app.get("/props", responses=ERROR_RESPONSES)
    async def props():
        defaults = server.defaults          # serve's request defaults (--temp, -n, ...)
        d = SamplingParams(**defaults.sampling)
        n = -1 if defaults.n_predict is None else defaults.n_predict
        params = {"n_predict": n, "seed": defaults.sampling.get("seed", -1), "temperature": d.temperature,
                  "top_k": d.top_k, "top_p": d.top_p,
                  "min_p": d.min_p, "repeat_last_n": -1 if d.repeat_last_n is None else d.repeat_last_n, "repeat_penalty": d.repetition_penalty,
                  "presence_penalty": d.presence_penalty, "frequency_penalty": d.frequency_penalty, "stop": [],
                  "max_tokens": n, "stream": False, "n_probs": 0, "grammar": "",
                  "samplers": list(SAMPLER_ORDER_TEMPERATURE_LAST)}     # /completion's, llama.cpp's
        return {"default_generation_settings": {"n_ctx": model.n_ctx, "params": params},
                "total_slots": server.engine.max_batch, "model_path": model.path,
                "chat_template": model.chat_template or "", "modalities": {"vision": False, "audio": False},
                "build_info": f"goosedump {__version__}", "is_sleeping": False}

    @app.post("/v1/chat/completions/input_tokens", openapi_extra=openapi_extra(ChatBody, COUNT_REPLY))
    async def chat_input_tokens(request: Request):
        body = await read(request, ChatBody)
        server.check_model(body.model)
        prompt, _ = chat_completions.render(server, body)
        return {"object": "response.input_tokens", "input_tokens": len(prompt)}

    @app.post("/v1/responses/input_tokens", openapi_extra=openapi_extra(CountBody, COUNT_REPLY))
    async def responses_input_tokens(request: Request):
        body = await read(request, CountBody)
        server.check_model(body.model)
        if body.input is None:
            body.input = []
        prompt, _, _ = responses.render(server, body)
        return {"object": "response.input_tokens", "input_tokens": len(prompt)}
