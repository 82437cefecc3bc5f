"""Conversations as OpenAI's API writes them, turned into prompt tokens (the
model's harmony output turns back into an OpenAI-style reply in
goosedump.reply).

How the prompt is rendered: a model whose vocabulary holds the harmony
formatting tokens (every gpt-oss model does) is rendered by our harmony
renderer, which equals openai-harmony token for token. A model without them
falls back to the chat template embedded in its GGUF
(`tokenizer.chat_template`), rendered with Jinja as transformers does.
`chat_format="template"` forces the embedded template.

The mapping from OpenAI messages to harmony, as openai-harmony and the
gpt-oss reference server do it:
- a system message with the model identity, knowledge cutoff, the date, the
  reasoning effort and the valid channels always comes first;
- OpenAI "system" and "developer" messages become the developer message's
  instructions (joined by a blank line, in order), with the function tools;
- an assistant message's `reasoning_content` (or `reasoning`) goes to the
  analysis channel, its `content` to final (to commentary, as a preamble,
  when it also makes tool calls), and each tool call is a commentary
  message to `functions.NAME` with JSON arguments;
- a "tool" message is the reply of `functions.NAME`, NAME found from its
  `tool_call_id` (or its own "name").
Reasoning of turns that ended in a final answer is dropped.
"""
from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from . import harmony
from .harmony import FUNCTIONS, Message, SystemContent, Tool

DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


class ChatError(ValueError):
    """A conversation or option that cannot be rendered; the message names
    the message index and field."""


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):   # content parts
        out = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in ("text", "input_text", "output_text"):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ChatError(f"{where}: content part {j} has type {kind!r}; only text parts are supported")
            if not isinstance(part.get("text"), str):
                raise ChatError(f"{where}: content part {j} has no 'text' string")
            out.append(part["text"])
        return "".join(out)
    raise ChatError(f"{where}: content must be a string or a list of text parts, got {type(content).__name__}")


def parse_tools(tools: Sequence[dict] | None) -> list[Tool]:
    """OpenAI tool definitions ({"type": "function", "function": {...}}, or the
    Responses API's flat {"type": "function", "name": ...}) as harmony tools."""
    out = []
    for i, t in enumerate(tools or []):
        if not isinstance(t, dict) or t.get("type", "function") != "function":
            raise ChatError(f"tools[{i}]: only function tools are supported, got "
                            f"{t.get('type') if isinstance(t, dict) else type(t).__name__!r}")
        fn = t.get("function", t)
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_\-]{1,64}", name):
            raise ChatError(f"tools[{i}]: a function needs a name of letters, digits, _ or - (got {name!r})")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise ChatError(f"tools[{i}] ({name}): parameters must be a JSON schema object")
        problem = schema_problem(params, "parameters") if params is not None else None
        if not problem and params is not None and params.get("type", "object") != "object":
            # (OpenAI's and Anthropic's APIs refuse them: the arguments are an object of named values)
            problem = f"parameters.type must be \"object\", got {params.get('type')!r}"
        if problem:
            raise ChatError(f"tools[{i}] ({name}): invalid schema: {problem}")
        desc = fn.get("description") or ""
        if not isinstance(desc, str):
            raise ChatError(f"tools[{i}] ({name}): description must be a string")
        out.append(Tool(name, desc, params))
    return out


JSON_TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")


def schema_problem(schema, path: str, depth: int = 0) -> str | None:
    """What makes a tool's parameters not a JSON schema, in the keywords the
    harmony rendering reads (type, properties, items, required, enum), or
    None. (Strict tools' schemas are checked whole when they are compiled.)"""
    if isinstance(schema, bool):
        return None
    if not isinstance(schema, dict):
        return f"{path} must be a schema object, got {type(schema).__name__}"
    if depth > 64:
        return f"{path} nests schemas too deeply"
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    if not all(isinstance(k, str) and k in JSON_TYPES for k in kinds):
        return f"{path}.type must be one of {', '.join(JSON_TYPES)} (or a list of them), got {kind!r}"
    props = schema.get("properties")
    if props is not None:
        if not isinstance(props, dict):
            return f"{path}.properties must be an object of schemas, got {type(props).__name__}"
        for k, v in props.items():
            if (problem := schema_problem(v, f"{path}.properties.{k}", depth + 1)):
                return problem
    items = schema.get("items")
    for k, item in enumerate(items if isinstance(items, list) else [] if items is None else [items]):
        # (a list: tuple validation, drafts 4-7)
        at = f"{path}.items[{k}]" if isinstance(items, list) else f"{path}.items"
        if (problem := schema_problem(item, at, depth + 1)):
            return problem
    required = schema.get("required")
    if required is not None and not (isinstance(required, list) and all(isinstance(r, str) for r in required)):
        return f"{path}.required must be a list of property names, got {required!r}"
    enum = schema.get("enum")
    if enum is not None and not isinstance(enum, list):
        return f"{path}.enum must be a list, got {type(enum).__name__}"
    return None


@dataclass
class ChatOptions:
    reasoning_effort: str = "medium"
    date: str | None = None            # YYYY-MM-DD; None: today
    tools: list[Tool] = field(default_factory=list)
    model_identity: str | None = None  # the system message's first line; None: harmony's own
    response_format: harmony.ResponseFormat | None = None   # the answer's schema, in the developer message

    def __post_init__(self):
        if self.reasoning_effort not in harmony.REASONING_EFFORTS:
            raise ChatError(f"reasoning_effort must be one of {', '.join(harmony.REASONING_EFFORTS)}, "
                            f"got {self.reasoning_effort!r}")
        if self.model_identity is not None and not isinstance(self.model_identity, str):
            raise ChatError(f"model_identity must be a string, got {type(self.model_identity).__name__}")
        if self.date is None:
            self.date = dt.date.today().isoformat()
        elif isinstance(self.date, dt.date):
            self.date = self.date.isoformat()[:10]
        elif not isinstance(self.date, str) or not DATE_RE.match(self.date):
            raise ChatError(f"date must be YYYY-MM-DD, got {self.date!r}")
        else:
            try:
                dt.date.fromisoformat(self.date)
            except ValueError:
                raise ChatError(f"date must be a date, YYYY-MM-DD, got {self.date!r}") from None


def to_harmony(messages: Sequence[dict], opts: ChatOptions) -> list[Message]:
    """OpenAI-style messages as harmony messages (see the module's docstring)."""
    if not isinstance(messages, (list, tuple)):
        raise ChatError(f"messages must be a list, got {type(messages).__name__}")
    instructions: list[str] = []
    body: list[Message] = []
    call_names: dict[str, str] = {}
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ChatError(f"{where} must be an object with a 'role', got {type(m).__name__}")
        role = m.get("role")
        if role in ("system", "developer"):
            instructions.append(_text(m.get("content"), where))
        elif role == "user":
            body.append(Message("user", _text(m.get("content"), where)))
        elif role == "assistant":
            body += _assistant(m, where, call_names)
        elif role == "tool":
            for key in ("name", "tool_call_id"):
                if m.get(key) is not None and not isinstance(m[key], str):
                    raise ChatError(f"{where}.{key} must be a string, got {type(m[key]).__name__}")
            name = m.get("name") or call_names.get(m.get("tool_call_id"))
            if not name:
                raise ChatError(f"{where}: a tool message needs a 'tool_call_id' of an earlier tool call "
                                f"(got {m.get('tool_call_id')!r}) or a 'name'")
            body.append(Message("tool", _text(m.get("content"), where), channel="commentary",
                                recipient="assistant", name=FUNCTIONS + name))
        else:
            raise ChatError(f"{where}: role must be system, developer, user, assistant or tool, got {role!r}")
    system = Message("system", harmony.system_text(
        SystemContent(reasoning_effort=opts.reasoning_effort, date=opts.date,
                      model_identity=opts.model_identity or harmony.MODEL_IDENTITY), bool(opts.tools)))
    head = [system]
    if instructions or opts.tools or opts.response_format:
        head.append(Message("developer", harmony.developer_text(
            "\n\n".join(instructions) if instructions else None, opts.tools, opts.response_format)))
    return head + harmony.drop_finished_reasoning(body)


# An assistant message may carry the token ids the model wrote (the chat REPL
# keeps an interrupted answer so): they are rendered as they were.
TOKENS_KEY = "goosedump_token_ids"


def _assistant(m: dict, where: str, call_names: dict[str, str]) -> list[Message]:
    raw = m.get(TOKENS_KEY)
    if raw is not None:
        if not isinstance(raw, list) or not all(isinstance(t, int) for t in raw):
            raise ChatError(f"{where}.{TOKENS_KEY} must be a list of token ids")
        return [Message("assistant", "", tokens=tuple(raw))]
    out = []
    reasoning = m.get("reasoning_content", m.get("reasoning"))
    if reasoning:
        out.append(Message("assistant", _text(reasoning, where + ".reasoning_content"), channel="analysis"))
    calls = m.get("tool_calls") or []
    if not isinstance(calls, list):
        raise ChatError(f"{where}.tool_calls must be a list, got {type(calls).__name__}")
    content = _text(m.get("content"), where)
    if content:
        out.append(Message("assistant", content, channel="commentary" if calls else "final"))
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ChatError(f"{where}.tool_calls[{j}] needs a function with a name")
        args = fn.get("arguments", "{}")
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        if call.get("id") is not None and not isinstance(call["id"], str):
            raise ChatError(f"{where}.tool_calls[{j}].id must be a string, got {type(call['id']).__name__}")
        if call.get("id"):
            call_names[call["id"]] = fn["name"]
        out.append(Message("assistant", args, channel="commentary", recipient=FUNCTIONS + fn["name"],
                           content_type="<|constrain|>json"))
    return out


def split_prefill(messages: Sequence[dict]) -> tuple[list[dict], dict | None]:
    """(the conversation before its last message, that message) where the
    last is an assistant message with text to continue; else (the
    conversation, None). An empty last assistant message is dropped: there
    is nothing to continue, the reply starts afresh."""
    messages = list(messages)
    last = messages[-1] if messages else None
    if not (isinstance(last, dict) and last.get("role") == "assistant"):
        return messages, None
    if not (last.get("content") or last.get("reasoning_content") or last.get("reasoning")
            or last.get("tool_calls") or last.get(TOKENS_KEY)):
        return messages[:-1], None
    return messages[:-1], last


def prefill_tokens(tokenizer, m: dict, where: str) -> list[int]:
    """The reply's start for a last assistant message the reply continues
    (a prefill, as Anthropic's API and ollama's gpt-oss template have it):
    its reasoning as a whole analysis message and its content as the final
    message left open, or with reasoning only the analysis message left
    open. The prompt already ends with <|start|>assistant."""
    if m.get("tool_calls"):
        raise ChatError(f"{where}: a last assistant message the reply continues cannot hold tool calls "
                        "(send the tools' results as tool messages)")
    if not has_harmony_tokens(tokenizer):
        raise ChatError(f"{where}: continuing the last assistant message needs the harmony chat format "
                        "(a gpt-oss model)")
    r = harmony.Renderer(tokenizer)
    ids = r.conversation(_assistant(m, where, {}), next_role=None)[:-1]    # the last message left open
    return ids[len([r.special[harmony.START]] + r.text("assistant")):]


def has_harmony_tokens(tokenizer) -> bool:
    try:
        for t in harmony.FORMAT_TOKENS:
            tokenizer.special_token(t)
    except (KeyError, ValueError):
        return False
    return True


def render_template(template: str, messages: Sequence[dict], opts: ChatOptions, tokenizer) -> list[int]:
    """The GGUF's Jinja chat template, rendered as transformers renders it
    (sandboxed, trim_blocks and lstrip_blocks)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise ChatError(f"the model's chat template refused the conversation: {msg}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda v, indent=None, **kw: json.dumps(v, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda f: dt.datetime.now().strftime(f)
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                               "parameters": t.parameters}} for t in opts.tools] or None
    try:
        text = env.from_string(template).render(
            messages=list(messages), tools=tools, add_generation_prompt=True,
            reasoning_effort=opts.reasoning_effort, bos_token="", eos_token="",
            **({"model_identity": opts.model_identity} if opts.model_identity is not None else {}))
    except jinja2.TemplateError as e:
        raise ChatError(f"the model's chat template failed: {e}") from None
    return tokenizer.encode(text, allow_special=True)


def render_chat(tokenizer, template: str | None, messages: Sequence[dict], *, reasoning_effort: str = "medium",
                tools: Sequence[dict] | None = None, date: str | None = None,
                chat_format: str = "auto", model_identity: str | None = None,
                response_format: harmony.ResponseFormat | None = None) -> list[int]:
    """Prompt tokens for a conversation, ending where the assistant speaks;
    model_identity replaces the system message's "You are ChatGPT, ...";
    response_format: the answer's schema, written where harmony says
    (reply_plan.plan_reply gives it)."""
    opts = ChatOptions(reasoning_effort, date, parse_tools(tools), model_identity, response_format)
    if chat_format not in ("auto", "harmony", "template"):
        raise ChatError(f"chat_format must be auto, harmony or template, got {chat_format!r}")
    if not messages:
        raise ChatError("messages is empty: a conversation needs at least one message")
    use_template = chat_format == "template" or (chat_format == "auto" and not has_harmony_tokens(tokenizer))
    if use_template:
        if not template:
            raise ChatError("the model has neither the harmony tokens nor an embedded chat template "
                            "(tokenizer.chat_template): use raw completion")
        return render_template(template, messages, opts, tokenizer)
    return harmony.Renderer(tokenizer).conversation(to_harmony(messages, opts))
