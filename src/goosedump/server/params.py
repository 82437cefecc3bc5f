"""Request fields shared by the endpoints, mapped onto the engine: sampling,
stop strings, tool choice, token limits, usage and finish reasons."""
from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass, field

from ..harmony import REASONING_EFFORTS
from ..reply import new_id
from ..reply_plan import forced_call_header, resolve_tool_choice, tool_names  # noqa: F401 (re-exported)
from ..result import ContextOverflowError
from ..logprobs import MAX_TOP
from ..sampling import SamplingError, SamplingParams
from .errors import APIError, bad_request
from .schemas import Fields

MAX_STOPS = 4                  # as OpenAI: up to 4 stop strings


SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
            "seed", "temperature_last", "repeat_last_n")


@dataclass
class RequestDefaults:
    """serve's defaults for what a request leaves unsaid (llama-server's
    flags): sampling fields, the token limit, the reasoning budget."""
    sampling: dict = field(default_factory=dict)
    n_predict: int | None = None
    reasoning_budget: int | None = None


def request_defaults(args) -> RequestDefaults:
    """serve's request defaults from its flags, checked before anything loads
    (-1 means none, as llama-server reads it). A sampling value out of range
    raises SamplingError, which the command says of its flag
    (arguments.flag_error); -n and --reasoning-budget a ValueError naming
    theirs."""
    kw = {f: getattr(args, f) for f in SAMPLING if getattr(args, f, None) is not None}
    if kw.get("seed") == -1:
        del kw["seed"]
    SamplingParams(**kw)
    n, budget = getattr(args, "n_predict", None), getattr(args, "reasoning_budget", None)
    if n is not None and (n == 0 or n < -1):
        raise ValueError(f"-n/--n-predict must be at least 1 (or -1: no limit), got {n}")
    if budget is not None and budget < -1:
        raise ValueError(f"--reasoning-budget must be 0 or more (or -1: no limit), got {budget}")
    return RequestDefaults(kw, None if n == -1 else n, None if budget == -1 else budget)


def sampling_params(b: Fields, defaults: dict | None = None) -> SamplingParams:
    """A request's sampling; defaults (serve's) for the fields it does not
    set (its seed -1: a random one, whatever serve's)."""
    bias = {}
    for k, v in (b.logit_bias or {}).items():
        try:
            bias[int(k)] = v
        except ValueError:
            raise bad_request(f"logit_bias keys must be token ids, got {k!r}", param="logit_bias") from None
    kw = {**(defaults or {}), **{f: getattr(b, f) for f in SAMPLING if getattr(b, f) is not None}}
    if kw.get("seed") == -1:           # llama.cpp's server: -1 asks for a random seed
        del kw["seed"]
    try:
        return SamplingParams(logit_bias=bias, **kw)
    except SamplingError as e:          # its message starts with the field's name
        raise bad_request(str(e), param=str(e).split()[0]) from None


def stop_strings(stop: str | list[str] | None) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOPS:
        raise bad_request(f"stop takes at most {MAX_STOPS} strings, got {len(stops)}", param="stop")
    if any(s == "" for s in stops):
        raise bad_request("stop strings must not be empty", param="stop")
    return stops


def top_count(n: int | None, param: str) -> int | None:
    """A request's number of alternatives per token (None: not given), 0..MAX_TOP."""
    if n is not None and not 0 <= n <= MAX_TOP:
        raise bad_request(f"{param} must be from 0 to {MAX_TOP}, got {n}", param=param)
    return n


# samplers and switches of llama-server's and vLLM's that goosedump has not, at their off values: a
# request that turns one on is refused by name (unknown fields are otherwise ignored), as on /completion
UNSUPPORTED_SAMPLERS = {"mirostat": 0, "tfs_z": 1, "typical_p": 1, "dry_multiplier": 0, "xtc_probability": 0,
                        "dynatemp_range": 0, "top_n_sigma": -1, "ignore_eos": False}


def sampler_off(key: str, value, off) -> bool:
    """Whether a sampler's value is the one that turns it off (top_n_sigma:
    any at or below 0, as llama.cpp applies it; SillyTavern sends 0)."""
    if key == "top_n_sigma":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0
    return value == off and isinstance(value, bool) == isinstance(off, bool)


def check_common(b: Fields, choices: bool = False) -> None:
    """Fields every generating route checks alike; choices: the route gives
    several (n, server/choices.py), else n must be 1."""
    if not choices and b.n not in (None, 1):
        raise bad_request(f"n={b.n} is not supported here: this route returns one choice (n=1)", param="n")
    usage = (b.stream_options or {}).get("include_usage")
    if usage is not None and not isinstance(usage, bool):
        raise bad_request(f"stream_options.include_usage must be true or false, got {usage!r}",
                          param="stream_options")
    if b.time_budget is not None and not b.time_budget > 0:
        raise bad_request(f"time_budget must be a number of seconds > 0, got {b.time_budget}", param="time_budget")
    for key, off in UNSUPPORTED_SAMPLERS.items():
        value = (b.model_extra or {}).get(key)
        if value is not None and not sampler_off(key, value, off):
            raise bad_request(f"{key}={value!r} is not supported: goosedump has no such sampler or switch (leave "
                              f"it out, or at {str(off).lower() if isinstance(off, bool) else off})", param=key)


def finish_reason(stop_reason: str, stopped: bool, tool_calls: bool = False) -> str:
    """The engine's stop as OpenAI's finish_reason; its own stops
    (repetition, time_budget) keep their names."""
    if stopped or stop_reason == "stop":
        return "stop"
    if stop_reason == "eos":
        return "tool_calls" if tool_calls else "stop"
    if stop_reason == "max_tokens":
        return "length"
    return stop_reason


def max_tokens(n: int | None, n_prompt: int, n_ctx: int, param: str, prompt_param: str,
               default: int | None = None, cap: bool = False) -> int:
    """The token limit a request asks for (none: serve's default, at most as
    much as the context leaves; without one all it leaves, as OpenAI does).
    cap: a limit past the context is a most, the answer stopping where the
    context is full (ollama's num_predict, llama-server's n_predict); else
    the engine refuses it, as OpenAI's API does (Server.submit maps its
    error)."""
    if n is not None and n < 1:
        raise bad_request(f"Invalid '{param}': {n}. It must be at least 1.", param=param,
                          code="integer_below_min_value")
    if n is None or cap:
        n = min(x for x in ((default if n is None else n), n_ctx - n_prompt) if x is not None)
        if n_prompt >= n_ctx:
            raise bad_request(f"This model's context is {n_ctx} tokens and the prompt has {n_prompt}: "
                              "no room is left to answer. Shorten the prompt.",
                              param=prompt_param, code="context_length_exceeded")
    return n


def context_error(e: ContextOverflowError, param: str, prompt_param: str):
    return bad_request(f"This model's context is {e.n_ctx} tokens. The prompt has {e.n_prompt} tokens and "
                       f"{param} asks for {e.max_tokens} more ({e.n_prompt + e.max_tokens} in all). Shorten the "
                       f"prompt or lower {param}.", param=param if e.n_prompt < e.n_ctx else prompt_param,
                       code="context_length_exceeded")


def usage(result, reasoning_tokens: int | None = None) -> dict:
    u = {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.generated_tokens,
         "total_tokens": result.prompt_tokens + result.generated_tokens,
         "prompt_tokens_details": {"cached_tokens": result.cached_tokens}}
    if reasoning_tokens is not None:
        u["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return u


def response_id(prefix: str) -> tuple[str, int]:
    """A new response's id and its creation time."""
    return new_id(prefix), int(time.time())


def utc_time(seconds: float | None = None) -> str:
    """A time (now, or seconds since the epoch) in RFC 3339, UTC, as "...Z"."""
    t = dt.datetime.now(dt.timezone.utc) if seconds is None else dt.datetime.fromtimestamp(seconds, dt.timezone.utc)
    return t.isoformat().replace("+00:00", "Z")


def token_ids(tok, ids: list[int], param: str) -> list[int]:
    """Token ids a request gives (a prompt, a context, ids to decode), each
    one of the model's vocabulary; the error names the field."""
    bad = next((t for t in ids if not 0 <= t < tok.n_vocab), None)
    if bad is not None:
        raise bad_request(f"{param} holds {bad}, which is not a token id of this model (0..{tok.n_vocab - 1})",
                          param=param)
    return list(ids)


def check_text_fits(n_chars: int, tok, n_ctx: int, prompt_param: str) -> None:
    """Refuse, before encoding it, text that has more tokens than the
    context for certain (at least n_chars / the longest token's bytes)."""
    at_least = n_chars // tok.max_token_bytes
    if at_least > n_ctx:
        raise bad_request(f"This model's context is {n_ctx} tokens and the prompt has at least {at_least} "
                          f"({n_chars} characters). Shorten the prompt.", param=prompt_param,
                          code="context_length_exceeded")


def text_chars(value) -> int:
    """The characters of every string in value (message contents, parts,
    tool call arguments: whatever the chat renders), walked without
    recursion."""
    total, stack = 0, [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return total


@dataclass
class TemplateOptions:
    """What a request's chat_template_kwargs ask of the prompt."""
    effort: str | None = None          # the reasoning effort (None: not asked)
    identity: str | None = None        # the system message's model identity
    budget: int | None = None          # 0 where enable_thinking is false


def template_options(defaults: dict | None, given, param: str = "chat_template_kwargs") -> TemplateOptions:
    """llama.cpp's chat_template_kwargs (serve's --chat-template-kwargs, the
    request's over them) as gpt-oss's template reads them: reasoning_effort
    and model_identity; enable_thinking false forbids reasoning;
    builtin_tools are refused (no browser or python tool is served). Other
    keys are ignored, as a template ignores names it does not use."""
    if given is not None and not isinstance(given, dict):
        raise bad_request(f"{param} must be an object, got {type(given).__name__}", param=param)
    kw = {**(defaults or {}), **(given or {})}
    effort, identity, thinking = kw.get("reasoning_effort"), kw.get("model_identity"), kw.get("enable_thinking")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise bad_request(f"{param}.reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r}",
                          param=param)
    if identity is not None and not isinstance(identity, str):
        raise bad_request(f"{param}.model_identity must be a string, got {identity!r}", param=param)
    if thinking is not None and not isinstance(thinking, bool):
        raise bad_request(f"{param}.enable_thinking must be true or false, got {thinking!r}", param=param)
    if kw.get("builtin_tools"):
        raise bad_request(f"{param}.builtin_tools is not supported: this server runs no browser or python tool "
                          "(declare the tools you run as function tools)", param=param)
    return TemplateOptions(effort, identity, 0 if thinking is False else None)


def template_kwargs_flag(text: str | None) -> dict | None:
    """serve's --chat-template-kwargs, read and checked before anything loads
    (a ValueError names the flag)."""
    if text is None:
        return None
    try:
        kw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--chat-template-kwargs is not JSON: {e} (got {text!r})") from None
    if not isinstance(kw, dict):
        raise ValueError(f"--chat-template-kwargs must be a JSON object, got {text!r}")
    try:
        template_options(kw, None, "--chat-template-kwargs")
    except APIError as e:
        raise ValueError(e.message) from None
    return kw
