"""Anthropic's Messages API requests in goosedump's terms: the body of
/v1/messages, its content blocks as the OpenAI-style messages the chat
renderer reads (thinking as reasoning, tool_use as tool calls, tool_result
as tool messages), its tools, tool_choice, thinking and output_config."""
from __future__ import annotations

from typing import Any, Union

from ..harmony import REASONING_EFFORTS
from .errors import bad_request
from .schemas import Fields


class MessagesBody(Fields):
    """POST /v1/messages. Fields' sampling extensions (seed, min_p,
    repetition_penalty, ...) are accepted beside Anthropic's own."""
    max_tokens: int
    messages: list[Any]
    system: Union[str, list[Any], None] = None
    stop_sequences: Union[list[str], None] = None
    tools: Union[list[dict[str, Any]], None] = None
    tool_choice: Union[dict[str, Any], None] = None
    thinking: Union[dict[str, Any], None] = None
    output_config: Union[dict[str, Any], None] = None
    output_format: Union[dict[str, Any], None] = None   # the structured-outputs beta's place for the format
    metadata: Union[dict[str, Any], None] = None
    reasoning_budget: Union[int, None] = None      # goosedump's, as on /v1/chat/completions


class CountBody(MessagesBody):
    """POST /v1/messages/count_tokens: the same, without max_tokens."""
    max_tokens: Union[int, None] = None


def text_of(content, where: str) -> str:
    """A string, or text blocks' texts joined (as a system prompt or a tool result)."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of text blocks", param=where.split("[")[0])
    out = []
    for j, b in enumerate(content):
        if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
            kind = b.get("type") if isinstance(b, dict) else type(b).__name__
            raise bad_request(f"{where}[{j}]: a {kind!r} block where text was expected (this model reads text only)",
                              param=where.split("[")[0].split(".")[0])
        out.append(b["text"])
    return "".join(out)


def block_text(b: dict, at: str) -> str:
    if not isinstance(b.get("text"), str):
        raise bad_request(f"{at}: a text block needs its 'text' (a string)", param="messages")
    return b["text"]


def chat_messages(body: MessagesBody) -> list[dict]:
    """The conversation as OpenAI-style messages. A user turn's tool_result
    blocks become tool messages (before its text, as the API orders them;
    one whose is_error is true reads "Error: " before its content);
    an assistant turn's thinking, text and tool_use blocks one assistant
    message with reasoning, content and tool calls."""
    out: list[dict] = []
    if body.system:
        out.append({"role": "system", "content": text_of(body.system, "system")})
    names: dict[str, str] = {}       # tool_use id -> its tool's name
    for i, m in enumerate(body.messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise bad_request(f"{where} must be an object whose role is user or assistant", param="messages")
        content = m.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
            raise bad_request(f"{where}.content must be a string or a list of content blocks", param="messages")
        if m["role"] == "assistant":     # the last one is a prefill: the reply continues it
            if i == len(body.messages) - 1 and (body.thinking or {}).get("type") in ("enabled", "adaptive"):
                raise bad_request(f"{where}: a last assistant message (a prefill of the reply) cannot go with "
                                  "thinking on: the reply would start in its answer", param="messages")
            out.append(assistant(blocks, where, names))
            continue
        texts = []
        for j, b in enumerate(blocks):
            kind, at = b.get("type"), f"{where}.content[{j}]"
            if kind == "text":
                texts.append(block_text(b, at))
            elif kind == "tool_result":
                call = b.get("tool_use_id")
                if not isinstance(call, str) or call not in names:
                    raise bad_request(f"{at}: tool_use_id {call!r} is not the id of an earlier tool_use block",
                                      param="messages")
                failed = b.get("is_error") or False        # (null: unset, as clients write it)
                if not isinstance(failed, bool):
                    raise bad_request(f"{at}.is_error must be true or false, got {failed!r}", param="messages")
                # (harmony has no flag for a failed call: the model reads it in the result's words)
                result = text_of(b.get("content"), at + ".content")
                out.append({"role": "tool", "tool_call_id": call, "content": f"Error: {result}" if failed else result})
            else:
                raise bad_request(f"{at}: a {kind!r} block is not supported in a user turn (text and tool_result "
                                  "are; this model reads text only)", param="messages")
        if texts:
            out.append({"role": "user", "content": "\n\n".join(texts)})
    return out


def assistant(blocks: list[dict], where: str, names: dict[str, str]) -> dict:
    thinking, text, calls = [], [], []
    for j, b in enumerate(blocks):
        kind, at = b.get("type"), f"{where}.content[{j}]"
        if kind == "thinking":
            if not isinstance(b.get("thinking") or "", str):
                raise bad_request(f"{at}.thinking must be a string, got {type(b['thinking']).__name__}",
                                  param="messages")
            thinking.append(b.get("thinking") or "")
        elif kind == "redacted_thinking":
            continue                  # nothing to read
        elif kind == "text":
            text.append(block_text(b, at))
        elif kind == "tool_use":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                raise bad_request(f"{at}: a tool_use block needs an id and a name", param="messages")
            names[b["id"]] = b["name"]
            calls.append({"id": b["id"], "type": "function",
                          "function": {"name": b["name"], "arguments": b.get("input", {})}})
        else:
            raise bad_request(f"{at}: a {kind!r} block is not supported in an assistant turn", param="messages")
    m: dict = {"role": "assistant", "content": "".join(text)}
    if any(thinking):
        m["reasoning_content"] = "\n".join(t for t in thinking if t)
    if calls:
        m["tool_calls"] = calls
    return m


def function_tools(tools: list[dict] | None) -> list[dict] | None:
    """Anthropic's client tools ({name, description, input_schema}) as function tools."""
    out = []
    for k, t in enumerate(tools or []):
        if not isinstance(t, dict) or t.get("type") not in (None, "custom") or not isinstance(t.get("name"), str):
            kind = t.get("type") if isinstance(t, dict) else type(t).__name__
            raise bad_request(f"tools[{k}]: only client tools ({{name, description, input_schema}}) are supported, "
                              f"got {kind!r}", param="tools")
        fn = {"name": t["name"], "description": t.get("description", ""),
              "parameters": t.get("input_schema") or {"type": "object"}}
        if "strict" in t:              # (a strict tool's arguments follow its schema, as on OpenAI's routes)
            fn["strict"] = t["strict"]
        out.append({"type": "function", "function": fn})
    return out or None


def tool_choice(choice: dict | None):
    """Anthropic's tool_choice as OpenAI's."""
    if choice is None:
        return None
    kind = choice.get("type")
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise bad_request(f"tool_choice.name must be a tool's name, got {choice.get('name')!r}",
                              param="tool_choice")
        return {"type": "function", "function": {"name": choice["name"]}}
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind) if isinstance(kind, str) else None
    if mapped is None:
        raise bad_request(f"tool_choice.type must be auto, any, tool or none, got {kind!r}", param="tool_choice")
    return mapped


def reasoning(body: MessagesBody) -> tuple[str | None, int | None, str]:
    """(effort or None for the default, reasoning budget or None, how the
    thinking is shown: "shown", "omitted" (empty blocks) or "none" (no
    blocks)): thinking enabled sets the budget, disabled forbids reasoning,
    adaptive or none leaves it to the model (gpt-oss always reasons);
    output_config's effort sets harmony's (xhigh and max as high). As
    Anthropic's API, a reply has thinking blocks only with thinking on
    (enabled or adaptive): a client that asked for none reads
    content[0].text."""
    effort = (body.output_config or {}).get("effort")
    if isinstance(effort, str):
        effort = {"xhigh": "high", "max": "high"}.get(effort, effort)
    if effort is not None and effort not in REASONING_EFFORTS:
        raise bad_request(f"output_config.effort must be low, medium, high, xhigh or max, got {effort!r}",
                          param="output_config")
    t = body.thinking or {}
    kind = t.get("type")
    show = "omitted" if t.get("display") == "omitted" else "shown"
    if kind == "enabled":
        budget = t.get("budget_tokens")
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
            raise bad_request(f"thinking.budget_tokens must be a number of tokens >= 0, got {budget!r}",
                              param="thinking")
        return effort, budget, show
    if kind == "disabled":
        return effort, 0, "none"
    if kind == "adaptive":
        return effort, None, show
    if kind in (None, "between_tools"):
        return effort, None, "none"
    raise bad_request(f"thinking.type must be enabled, disabled or adaptive, got {kind!r}", param="thinking")
