"""llama.cpp's own completion route, POST /completion (the shapes of its
server's README, not OpenAI's): a raw prompt (text, token ids, or both
mixed) continued, whole or streamed as server-sent events of {content,
tokens, stop}, with llama.cpp's sampling names (the ones ollama's options
share: ollama_params.read_options), grammar and json_schema, n_probs,
return_tokens, stop_type and stopping_word, and its timings."""
from __future__ import annotations

import math
from typing import Any, AsyncIterator, Union

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

from ..logprobs import MAX_TOP, Unread, entry
from ..reply import StopFilter
from ..reply_plan import PlanError, raw_constraint
from ..sampling import SAMPLER_ORDER, SAMPLER_ORDER_TEMPERATURE_LAST
from .bridge import EventStream, Submitted
from .completions import text_pieces
from .errors import bad_request
from .ollama_params import OFF, SAMPLING, num_predict, read_options
from .params import check_text_fits, sampler_off, sampling_params, token_ids
from .schemas import Fields, Stream, WholeInt, openapi_extra
from .sse import sse, stream_error

OPTIONS = (*SAMPLING, *OFF, "n_predict", "stop", "repeat_last_n")
# llama.cpp's samplers and switches goosedump does not have, taken at the
# value that turns them off (any other is refused by name, as OFF's are)
# (post_sampling_probs: n_probs gives the model's log-probabilities, before the samplers, as OpenAI's routes)
LLAMA_OFF = {"dry_multiplier": 0, "xtc_probability": 0, "dynatemp_range": 0, "ignore_eos": False,
             "top_n_sigma": -1, "post_sampling_probs": False}
# llama.cpp's sampler names (and letters) for `samplers`; those not here
# are off (LLAMA_OFF, OFF) and their place in the order changes nothing
SAMPLER_NAMES = {"penalties": "penalties", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
                 "min_p": "min_p", "e": "penalties", "k": "top_k", "p": "top_p", "m": "min_p", "t": "temperature"}
OFF_SAMPLERS = {"dry", "top_n_sigma", "typ_p", "typical_p", "xtc", "d", "s", "y", "x"}


# what a sampler left out of `samplers` leaves at off
LEFT_OUT = {"penalties": {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0},
            "temperature": {"temperature": 1.0}, "top_k": {"top_k": 0}, "top_p": {"top_p": 1.0},
            "min_p": {"min_p": 0.0}}


def sampler_chain(samplers) -> tuple[bool, dict]:
    """(temperature last?, the fields that samplers' chain leaves out turns
    off) for llama.cpp's `samplers` (names, or a string of their letters).
    goosedump applies penalties, then top-k, top-p, min-p with the
    temperature before them or after (llama.cpp's default): any order of
    those that keeps the rest in that order."""
    names = list(samplers) if isinstance(samplers, str) else samplers
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise bad_request(f"samplers must be a list of sampler names, got {samplers!r}", param="samplers")
    unknown = [n for n in names if n not in SAMPLER_NAMES and n not in OFF_SAMPLERS]
    if unknown:
        raise bad_request(f"samplers: unknown sampler {unknown[0]!r}", param="samplers")
    order = tuple(dict.fromkeys(SAMPLER_NAMES[n] for n in names if n in SAMPLER_NAMES))
    off = {k: v for name, fields in LEFT_OUT.items() if name not in order for k, v in fields.items()}
    for supported, last in ((SAMPLER_ORDER_TEMPERATURE_LAST, True), (SAMPLER_ORDER, False)):
        if order == tuple(x for x in supported if x in order):
            return last, off
    raise bad_request(f"samplers={samplers!r} is not an order goosedump applies: it applies "
                      f"{', '.join(SAMPLER_ORDER_TEMPERATURE_LAST)} (llama.cpp's) or "
                      f"{', '.join(SAMPLER_ORDER)}", param="samplers")


class LlamaCompletionBody(BaseModel):
    """POST /completion. llama.cpp's fields that change nothing here
    (cache_prompt: the prefix cache is always on; id_slot, n_keep, ...) and
    unknown ones are ignored, as llama.cpp ignores unknown ones. Typed
    strictly (schemas.py), a null stream the default."""
    model_config = ConfigDict(extra="allow", strict=True)
    prompt: Union[str, list[Union[int, str]]]
    stream: Stream = False
    n_predict: Union[WholeInt, None] = None
    stop: Union[list[str], None] = None
    grammar: Union[str, None] = None
    json_schema: Union[dict[str, Any], None] = None
    n_probs: WholeInt = 0
    return_tokens: bool = False
    logit_bias: Union[dict[str, Any], list[Any], None] = None     # (bias() reads them)


REPLY = {"type": "object", "required": ["content", "stop"]}


def register(app: FastAPI, server, read) -> None:
    @app.post("/completion", openapi_extra=openapi_extra(LlamaCompletionBody, REPLY))
    async def completion(request: Request):
        return await handle(server, await read(request, LlamaCompletionBody), request)


def prompt_ids(server, prompt) -> list[int]:
    """The prompt's tokens: text read with its special tokens, ids as they are, mixed in order."""
    tok = server.tok
    parts = [prompt] if isinstance(prompt, str) else prompt
    if len(parts) > 1 and all(isinstance(p, str) for p in parts):
        # (llama-server reads a list of texts alone as that many prompts, each answered; joined, they would
        # be one prompt answered as if it were the request's)
        raise bad_request(f"prompt: a list of {len(parts)} texts is {len(parts)} prompts, and /completion answers "
                          "one here: send a request for each, or them to /v1/completions, which takes a batch "
                          "(one prompt: a text, token ids, or ids and texts mixed)", param="prompt")
    check_text_fits(sum(len(p) for p in parts if isinstance(p, str)), tok, server.model.n_ctx, "prompt")
    ids: list[int] = []
    for p in parts:
        ids += tok.encode(p, allow_special=True) if isinstance(p, str) else [p]
    token_ids(tok, ids, "prompt")
    if not ids:
        raise bad_request("The prompt is empty: nothing to continue from.", param="prompt")
    return ids


def bias(value, tok) -> dict[str, float]:
    """llama.cpp's logit_bias, [[id or text, bias], ...] or {id or text: bias}, as
    OpenAI's {id: bias}: a text biases each of its tokens, and a bias of
    false bans the token (-inf), as in llama.cpp."""
    if value is None:
        return {}
    if isinstance(value, dict):       # {"15043": bias} or {"Hello": bias}
        value = [[int(k) if k.isascii() and k.isdigit() else k, b] for k, b in value.items()]
    out: dict[str, float] = {}
    for i, pair in enumerate(value):
        if not (isinstance(pair, list) and len(pair) == 2):
            raise bad_request(f"logit_bias[{i}] must be a pair [token id or text, bias], got {pair!r}",
                              param="logit_bias")
        what, b = pair
        if b is False:
            b = -math.inf
        elif isinstance(b, bool) or not isinstance(b, (int, float)):
            raise bad_request(f"logit_bias[{i}]'s bias must be a number, or false (never the token), got {b!r}",
                              param="logit_bias")
        if isinstance(what, str):
            ids = tok.encode(what)
        elif isinstance(what, (int, float)) and not isinstance(what, bool) and float(what).is_integer():
            ids = [int(what)]
        else:
            raise bad_request(f"logit_bias[{i}]'s token must be a token id or a text, got {what!r}",
                              param="logit_bias")
        out.update((str(t), b) for t in ids)
    return out


async def handle(server, body: LlamaCompletionBody, request: Request):
    given = body.model_dump(exclude_unset=True)
    for key, off in LLAMA_OFF.items():
        value = given.get(key)
        if value is not None and not sampler_off(key, value, off):
            raise bad_request(f"{key}={value!r} is not supported: goosedump has no such sampler or switch (leave "
                              f"it out, or at {str(off).lower() if isinstance(off, bool) else off})", param=key)
    for key in ("top_k", "temperature"):     # llama.cpp: top_k <= 0 is off, temperature <= 0 greedy
        if isinstance(given.get(key), (int, float)) and not isinstance(given[key], bool) and given[key] < 0:
            given[key] = 0
    # llama.cpp: max_tokens where n_predict is not given; 0 evaluates the prompt into the cache, no token
    limit_key = "n_predict" if given.get("n_predict") is not None else "max_tokens"
    limit_value = given.get(limit_key)
    warm_only = type(limit_value) is int and limit_value == 0
    options = {k: given[k] for k in OPTIONS if k in given and k != "n_predict"}
    kw, _, stops = read_options(options, prefix="", limit_key="n_predict")
    limit = None if warm_only else num_predict(limit_value, limit_key)
    last, off = sampler_chain(given["samplers"]) if given.get("samplers") is not None else (True, {})
    fields = Fields(**{**kw, **off}, logit_bias=bias(body.logit_bias, server.tok), temperature_last=last)
    sampling = sampling_params(fields, server.defaults.sampling)
    if not 0 <= body.n_probs <= MAX_TOP:
        raise bad_request(f"n_probs must be from 0 to {MAX_TOP}, got {body.n_probs}", param="n_probs")
    ids = prompt_ids(server, body.prompt)
    try:
        constraint = raw_constraint(server.tok, body.grammar, body.json_schema)
    except PlanError as e:
        raise bad_request(str(e), param=e.param) from None
    # (warm_only: the prefill's one token is dropped)
    n = 1 if warm_only else server.limit(limit, len(ids), limit_key, "prompt", cap=True)
    sub = server.submit(ids, n, fields, limit_key, "prompt", constraint, body.n_probs or None)
    out = Reply(server, body, sub, StopFilter(stops), ids, sampling, 0 if warm_only else limit)
    if body.stream:
        return EventStream(out.stream(), sub.gen)
    text = []
    async with text_pieces(sub, out.stop, None, request) as pieces:
        async for piece in pieces:
            text.append(piece)
    if sub.gen.result is None:          # the client went away
        return Response(status_code=499)
    return out.last("".join(text), sub.gen.result.token_ids)


class Reply:
    """One completion's answer in llama.cpp's shapes."""

    def __init__(self, server, body, sub: Submitted, stop: StopFilter, ids: list[int], sampling, limit):
        self.server, self.body, self.sub, self.stop, self.ids = server, body, sub, stop, ids
        self.sampling, self.limit, self.unread = sampling, limit, Unread(sub)

    def probs(self) -> list[dict]:
        """The tokens' log-probabilities since the last call (n_probs)."""
        tok, lps = self.server.tok, self.unread.take()
        return [{"id": lp.token, **entry(tok, lp.token, lp.logprob),
                 "top_logprobs": [{"id": i, **entry(tok, i, v)} for i, v in lp.top]} for lp in lps]

    def last(self, text: str, tokens: list[int]) -> dict:
        r, s = self.sub.gen.result, self.sampling
        kind = ("word" if self.stop.hit else {"eos": "eos", "max_tokens": "limit"}.get(r.stop_reason, r.stop_reason))
        computed = r.prompt_tokens - r.cached_tokens
        predicted, predicted_s = r.generated_tokens, r.decode_seconds
        if self.limit == 0:         # n_predict 0: the prompt evaluated alone
            text, tokens, predicted, predicted_s, kind = "", [], 0, 0.0, "limit"
        out = {"index": 0, "content": text, "tokens": tokens if self.body.return_tokens else [], "id_slot": 0,
               "stop": True, "model": self.server.name, "tokens_predicted": predicted,
               "tokens_evaluated": r.prompt_tokens, "tokens_cached": r.cached_tokens,
               "prompt": self.server.tok.decode(self.ids), "truncated": False, "stop_type": kind,
               "stopping_word": self.stop.matched or "",
               "generation_settings": {"n_ctx": self.server.model.n_ctx, "model": self.server.name,
                                       "n_predict": -1 if self.limit is None else self.limit, "seed": -1 if s.seed is None else s.seed,
                                       "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p,
                                       "min_p": s.min_p, "repeat_penalty": s.repetition_penalty,
                                       "presence_penalty": s.presence_penalty,
                                       "frequency_penalty": s.frequency_penalty, "stop": self.stop.stops,
                                       "n_probs": self.body.n_probs, "stream": self.body.stream},
               "timings": {"prompt_n": computed, "prompt_ms": r.prefill_seconds * 1e3,
                           "prompt_per_token_ms": r.prefill_seconds * 1e3 / max(computed, 1),
                           "prompt_per_second": r.prefill_tokens_per_s,
                           # (as llama-server's: per second is predicted_n over predicted_ms)
                           "predicted_n": predicted, "predicted_ms": predicted_s * 1e3,
                           "predicted_per_token_ms": predicted_s * 1e3 / max(predicted, 1),
                           "predicted_per_second": predicted / predicted_s if predicted_s > 0 else 0.0}}
        if self.body.n_probs:
            out["completion_probabilities"] = [] if self.limit == 0 else self.probs()
        return out

    async def stream(self) -> AsyncIterator[str]:
        """Each piece as {content, tokens, stop: false}, then the whole
        answer's fields with stop true (llama.cpp sends no [DONE] here); an
        error after the start as {"error": ...}."""
        try:
            tokens: list[int] = []
            async with text_pieces(self.sub, self.stop, None, tokens=tokens) as pieces:
                async for piece in pieces:
                    if self.limit == 0:
                        continue
                    d = {"index": 0, "content": piece, "tokens": tokens[:], "stop": False, "id_slot": 0}
                    if self.body.n_probs:
                        d["completion_probabilities"] = self.probs()
                    tokens.clear()
                    yield sse(d)
            if self.sub.gen.result is not None:
                yield sse(self.last("", []))
        except Exception as e:
            yield sse(stream_error(e))

