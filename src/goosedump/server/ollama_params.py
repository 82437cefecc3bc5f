"""Ollama's request fields mapped onto goosedump's: the bodies of /api/chat
and /api/generate, `options` in ollama's names, `think`, `format`, and
ollama's messages (tool calls with argument objects, tool results named by
tool_name) as the OpenAI-style messages the chat renderer reads."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from pydantic import BaseModel, ConfigDict, ValidationError

from ..harmony import REASONING_EFFORTS
from .errors import APIError, bad_request
from .params import sampling_params, top_count
from .schemas import Fields, StreamOn, WholeInt, as_whole


class OllamaFields(BaseModel):
    """What /api/chat and /api/generate share. Unknown fields are ignored, as
    ollama ignores them. Typed strictly (schemas.py), a null stream the default."""
    model_config = ConfigDict(extra="allow", strict=True)
    model: Union[str, None] = None
    stream: StreamOn = True             # ollama streams unless told not to
    options: Union[dict[str, Any], None] = None
    format: Union[str, dict[str, Any], None] = None
    think: Union[bool, str, None] = None
    keep_alive: Union[float, str, None] = None      # the model stays loaded while the server runs
    logprobs: Union[bool, None] = None
    top_logprobs: Union[WholeInt, None] = None


class OllamaChatBody(OllamaFields):
    messages: list[Any] = []
    tools: Union[list[dict[str, Any]], None] = None


class OllamaGenerateBody(OllamaFields):
    prompt: Union[str, None] = None
    system: Union[str, None] = None
    raw: Union[bool, None] = None
    context: Union[list[int], None] = None
    suffix: Union[str, None] = None
    template: Union[str, None] = None
    images: Union[list[Any], None] = None


# ollama's sampling options and the SamplingParams field each sets
SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed",
            "repeat_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
            "frequency_penalty": "frequency_penalty"}
# options about loading and hardware: goosedump sets those when it starts (serve's flags)
LOADING = {"numa", "num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all", "vocab_only",
           "use_mmap", "use_mlock", "embedding_only", "num_thread", "num_keep", "penalize_newline"}
# samplers goosedump does not have, accepted at the value that turns them off
OFF = {"mirostat": 0, "tfs_z": 1, "typical_p": 1}
# their settings, which change nothing while they are off (clients send ollama's defaults)
OFF_SETTINGS = {"mirostat_tau", "mirostat_eta"}


@dataclass
class Request:
    """A request's fields in goosedump's terms."""
    fields: Fields                  # sampling, for Server.submit
    limit: int | None               # tokens to generate at most (None: until the context is full)
    stops: list[str]
    effort: str | None              # the harmony reasoning effort (None: the server's default)
    show_thinking: bool
    response_format: dict | None    # as the OpenAI API writes it
    n_top: int | None               # alternatives per token's log-probability (None: no logprobs)


def read_request(body: OllamaFields) -> Request:
    kw, limit, stops = read_options(body.options if body.options is not None else {})
    effort, show = thinking(body.think)
    fields = Fields(**kw, reasoning_budget=None if show else 0)
    n_top = None
    if body.logprobs:
        n_top = top_count(body.top_logprobs, "top_logprobs") or 0
    elif body.top_logprobs:
        raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs")
    return Request(fields, limit, stops, effort, show, response_format(body.format), n_top)


def read_options(o: dict, prefix: str = "options.", limit_key: str = "num_predict") -> tuple[dict, int | None, list]:
    """(SamplingParams' fields, the token limit, the stop strings) of
    ollama's options, each value checked and named as the request names it
    (prefix: where they sit; limit_key: the token limit's name, llama.cpp's
    n_predict where its /completion reads the same options)."""
    kw: dict = {}
    limit, stops = None, []
    for key, value in o.items():
        where = f"{prefix}{key}"
        if key in SAMPLING:
            if value is not None:
                kw[SAMPLING[key]] = as_whole(value) if SAMPLING[key] in ("top_k", "seed") else value
        elif key in OFF:
            if value is not None and value != OFF[key]:
                raise bad_request(f"{where}={value!r} is not supported: goosedump has no {key} sampler "
                                  f"(leave it out, or at {OFF[key]})", param=where)
        elif key == limit_key:
            limit = num_predict(value, where)
        elif key == "stop":
            stops = stop_list(value, where)
        elif key == "repeat_last_n":      # llama.cpp's window for the three penalties (-1: all, 0: none)
            if value is not None:
                kw["repeat_last_n"] = as_whole(value)
        elif key not in LOADING and key not in OFF_SETTINGS:
            raise bad_request(f"unknown option {key!r}: the options are ollama's (temperature, top_p, top_k, min_p, "
                              "seed, num_predict, stop, repeat_penalty, presence_penalty, frequency_penalty, ...)",
                              param="options")
    try:
        sampling_params(Fields(**kw))      # each value checked here, named as the request names it
    except ValidationError as e:           # a value of the wrong type
        err = e.errors()[0]
        field = str(err["loc"][0]) if err.get("loc") else ""
        name = next((k for k, v in SAMPLING.items() if v == field), field)
        raise bad_request(f"{prefix}{name}: {err['msg']} (got {err.get('input')!r})", param=f"{prefix}{name}") from None
    except APIError as e:
        name = next((k for k, v in SAMPLING.items() if v == e.param), e.param)
        raise bad_request(f"{prefix}{name}{e.message[len(e.param or ''):]}", param=f"{prefix}{name}") from None
    return kw, limit, stops


def num_predict(value, where: str = "options.num_predict") -> int | None:
    value = as_whole(value)
    if value is None or value in (-1, -2):      # ollama: -1 no limit, -2 until the context is full
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise bad_request(f"{where} must be a number of tokens >= 1, or -1 (until the context is full), "
                          f"got {value!r}", param=where)
    return value


def stop_list(value, where: str = "options.stop") -> list[str]:
    if value is None:       # (as unset, as every option's null: ollama and llama.cpp skip it)
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad_request(f"{where} must be a list of non-empty strings, got {value!r}", param=where)
    return stops


def thinking(think) -> tuple[str | None, bool]:
    """(reasoning effort, None for the default; whether the reply reasons):
    gpt-oss always reasons unless forbidden, so think false forbids it (a
    reasoning budget of 0); its levels are the efforts."""
    if think is None or think is True:
        return None, True
    if think is False:
        return "low", False
    if think in REASONING_EFFORTS:
        return think, True
    raise bad_request(f"think must be true, false or one of {', '.join(map(repr, REASONING_EFFORTS))}, "
                      f"got {think!r}", param="think")


def response_format(fmt) -> dict | None:
    """ollama's format ("json" or a JSON schema) as an OpenAI response_format."""
    if fmt in (None, ""):
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "schema": fmt}
    raise bad_request(f"format must be \"json\" or a JSON schema object, got {fmt!r}", param="format")


def chat_messages(messages: list) -> list[dict]:
    """ollama's messages as the chat renderer reads OpenAI's: `thinking` as
    reasoning, tool calls given ids, a tool result named by its tool_name,
    else by the call whose id its tool_call_id is, else by the earlier call
    it answers (results come in the calls' order)."""
    out: list[dict] = []
    pending: list[str] = []        # the last assistant turn's calls not yet answered
    named: dict[str, str] = {}     # every call's id: its tool
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"{where} must be an object with a 'role', got {type(m).__name__}", param="messages")
        if m.get("images"):
            raise bad_request(f"{where}.images: this model reads text only", param="messages")
        m = {k: v for k, v in m.items() if k not in ("images", "thinking", "tool_name")}
        original = messages[i]
        if m.get("role") == "assistant":
            if original.get("thinking"):
                m["reasoning_content"] = original["thinking"]
            calls = m.get("tool_calls") or []
            if not isinstance(calls, list):
                raise bad_request(f"{where}.tool_calls must be a list", param="messages")
            m["tool_calls"] = [call_with_id(c, f"{where}.tool_calls[{j}]", f"call_{i}_{j}")
                               for j, c in enumerate(calls)]
            pending = [c["function"]["name"] for c in m["tool_calls"]]
            named.update((c["id"], c["function"]["name"]) for c in m["tool_calls"] if isinstance(c["id"], str))
        elif m.get("role") == "tool":
            name = original.get("tool_name") or m.get("name")
            if name is None and isinstance(m.get("tool_call_id"), str):
                name = named.get(m["tool_call_id"])
            if name is None and pending:
                name = pending[0]
            if not isinstance(name, str) or not name:
                raise bad_request(f"{where}: a tool message needs the tool_name of the call it answers",
                                  param="messages")
            if name in pending:
                pending.remove(name)
            m["name"] = name
        out.append(m)
    return out


def call_with_id(call, where: str, id: str) -> dict:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise bad_request(f"{where} needs a function with a name", param="messages")
    return {"id": call.get("id") or id, "type": "function",
            "function": {"name": fn["name"], "arguments": fn.get("arguments", {})}}
