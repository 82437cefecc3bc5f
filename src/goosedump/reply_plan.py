"""What a chat reply may hold, from OpenAI's request fields: the tools to
render, the reply's forced start (a named tool call's header, written into
the prompt) and the constraint of goosedump.structured (`response_format`,
strict tools, `tool_choice` "required", a reasoning budget). Model.chat and
the server both plan their replies here, so that they agree."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from .harmony import ResponseFormat
from .structured import ConstraintError, Free, Gate, ReplySpec, any_json_object, as_grammar, schema_grammar


class PlanError(ConstraintError):
    """A request field that cannot be honoured; `param` names it."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass
class ReplyPlan:
    tools: list[dict] | None          # rendered into the prompt
    prefix: list[int] = field(default_factory=list)   # the reply's start, appended to the prompt
    spec: ReplySpec | None = None     # None: the reply is free
    checked: Gate | None = None       # the gate plan_reply built to check a prefill, handed out once
    response_format: ResponseFormat | None = None   # the answer's schema, rendered in the developer message

    def gate(self, tok) -> Gate | None:
        if self.checked is not None:
            gate, self.checked = self.checked, None
            return gate
        return Gate(tok, self.spec, self.prefix) if self.spec is not None else None


def _function(t) -> dict | None:
    fn = t.get("function", t) if isinstance(t, dict) else None
    return fn if isinstance(fn, dict) and isinstance(fn.get("name"), str) else None


def tool_names(tools: list[dict] | None) -> list[str]:
    return [fn["name"] for fn in map(_function, tools or []) if fn is not None]


def forced_call_header(tokenizer, name: str) -> list[int]:
    """The header the model writes before a call's arguments; put in the
    prompt, the model can only go on with that function's arguments."""
    return tokenizer.encode(f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>",
                            allow_special=True)


def resolve_tool_choice(choice, tools: list[dict] | None) -> tuple[list[dict] | None, str | None, bool]:
    """(the tools to render, the function to force or None, whether some
    call is required). "none" renders no tools; a named function (or
    "required" with a single tool) is forced; "required" with several tools
    lets the model choose among them but not answer instead."""
    if choice is None or choice == "auto":
        return tools, None, False
    if choice == "none":
        return None, None, False
    names = tool_names(tools)
    if choice == "required":
        if not names:
            raise PlanError("tool_choice 'required' needs tools", "tool_choice")
        return tools, names[0] if len(names) == 1 else None, True
    if isinstance(choice, dict) and choice.get("type") == "function":
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else choice.get("name")
        if not isinstance(name, str):
            raise PlanError("tool_choice of type 'function' needs the function's name: {'type': 'function', "
                            "'function': {'name': NAME}}", "tool_choice")
        if name not in names:
            raise PlanError(f"tool_choice names the function {name!r}, which is not among the tools "
                            f"({', '.join(names) or 'none'})", "tool_choice")
        return tools, name, True
    raise PlanError("tool_choice must be 'auto', 'none', 'required' or a function "
                    f"({{'type': 'function', ...}}), got {choice!r}", "tool_choice")


def format_grammar(fmt, param: str = "response_format") -> str | None:
    """The final answer's grammar for an OpenAI response format: None for
    text. Takes Chat Completions' {"type": "json_schema", "json_schema":
    {"name", "schema", "strict"}} and the Responses API's flat {"type":
    "json_schema", "name", "schema", "strict"}."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise PlanError(f"{param} must be an object such as {{\"type\": \"json_schema\", ...}}, got {fmt!r}", param)
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return any_json_object()
    if kind == "json_schema":
        spec = fmt.get("json_schema", fmt)
        where = f"{param}.json_schema" if "json_schema" in fmt else param
        if not isinstance(spec, dict) or "schema" not in spec:
            raise PlanError(f"{where}.schema is required: the JSON schema the answer must follow", param)
        try:
            return schema_grammar(spec["schema"], f"{where}.schema")
        except ConstraintError as e:
            raise PlanError(str(e), param) from None
    raise PlanError(f"{param} type {kind!r} is not supported: expected 'text', 'json_object' or 'json_schema'",
                    param)


def rendered_format(fmt, json_schema=None) -> ResponseFormat | None:
    """The schema the developer message names (harmony's "# Response
    Formats"), from a json_schema response format (its name and description
    where given) or llama.cpp's json_schema field; None for text, JSON mode
    and grammars, which have no schema. Called once format_grammar has
    checked the format."""
    def parsed(schema):
        return json.loads(schema) if isinstance(schema, str) else schema    # (JSON text: schema_grammar read it)

    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema", fmt)
        name, description = spec.get("name"), spec.get("description")
        name = " ".join(name.split()) if isinstance(name, str) else ""     # a heading: one line
        return ResponseFormat(name or "response", parsed(spec["schema"]),
                              description if isinstance(description, str) else "")
    return ResponseFormat("response", parsed(json_schema)) if json_schema is not None else None


def plan_reply(tok, tools: list[dict] | None = None, tool_choice=None, response_format=None,
               reasoning_budget: int | None = None, grammar: str | None = None, json_schema=None,
               harmony: bool = True, format_param: str = "response_format",
               object_arguments: bool = False, prefill: list[int] | None = None) -> ReplyPlan:
    """The plan of a chat reply. grammar / json_schema (llama.cpp's fields)
    constrain the final answer as response_format does; object_arguments:
    every tool call's arguments must parse (arguments_grammar); prefill: the
    reply's start from a last assistant message (chat.prefill_tokens), held
    to the constraint like generated tokens."""
    rendered, forced, required = resolve_tool_choice(tool_choice, tools)
    if prefill and forced:
        raise PlanError(f"tool_choice forces a call to {forced!r}, which cannot continue the last assistant "
                        "message", "tool_choice")
    if not harmony:               # another chat format: no channels to constrain
        if response_format not in (None, {"type": "text"}) or grammar or json_schema is not None or reasoning_budget:
            raise PlanError("structured output needs the harmony chat format (a gpt-oss model)", format_param)
        if prefill:
            raise PlanError("continuing the last assistant message needs the harmony chat format", "messages")
        return ReplyPlan(rendered)
    if reasoning_budget is not None and (not isinstance(reasoning_budget, int) or reasoning_budget < 0):
        raise PlanError(f"reasoning_budget must be a whole number of tokens >= 0, got {reasoning_budget!r}",
                        "reasoning_budget")
    final = format_grammar(response_format, format_param)
    # (an empty grammar is none; an empty schema {} is any JSON value, as llama.cpp and ollama read it)
    given = [k for k, v in ((format_param, final), ("grammar", grammar or None), ("json_schema", json_schema))
             if v is not None]
    if len(given) > 1:
        raise PlanError(f"give one of {', '.join(given)}: each constrains the same answer", given[1])
    if grammar:
        try:
            final = as_grammar(grammar)
        except ConstraintError as e:
            raise PlanError(str(e), "grammar") from None
    if json_schema is not None:
        try:
            final = schema_grammar(json_schema, "json_schema")
        except ConstraintError as e:
            raise PlanError(str(e), "json_schema") from None
    strict = {fn["name"]: arguments_grammar(fn, object_arguments)
              for fn in map(_function, rendered or []) if fn is not None}
    prefix = forced_call_header(tok, forced) if forced else list(prefill or [])
    # tool_choice "none" with tools: no call, not even to a tool the history's calls name
    no_calls = tool_choice == "none" and bool(tool_names(tools))
    constrained = final is not None or required or reasoning_budget is not None or no_calls or \
        any(g is not None for g in strict.values())
    shown = rendered_format(response_format, json_schema)
    if not constrained:
        return ReplyPlan(rendered, prefix, response_format=shown)
    tools_allowed = {forced: strict.get(forced)} if forced else strict
    spec = ReplySpec(final=final, tools=tools_allowed, reasoning_budget=reasoning_budget, allow_final=not required)
    plan = ReplyPlan(rendered, prefix, spec, response_format=shown)
    if prefill:
        try:
            plan.checked = Gate(tok, spec, prefix)
        except ConstraintError as e:
            raise PlanError(f"the last assistant message, which the reply continues, breaks the reply's "
                            f"constraint ({', '.join(_constraints(format_param, final, required, reasoning_budget))}): "
                            f"{e}", "messages") from None
    return plan


def _constraints(format_param: str, final, required: bool, budget) -> list[str]:
    return [name for name, on in ((format_param, final is not None), ("tool_choice", required),
                                  ("reasoning_budget", budget is not None)) if on] or ["strict tools"]


def arguments_grammar(fn: dict, objects: bool) -> str | None:
    """A tool's arguments' grammar (None: free): a strict tool's schema (one
    that does not compile is refused); with objects (ollama's and Anthropic's
    APIs return the arguments as an object, so they must parse), every
    tool's schema where it compiles, else any JSON object."""
    if not (fn.get("strict") or objects):
        return None
    try:
        return schema_grammar(fn.get("parameters") or {"type": "object"}, f"the parameters of tool {fn['name']!r}")
    except ConstraintError as e:
        if fn.get("strict"):
            raise PlanError(str(e), "tools") from None
        return any_json_object()


def strict_by_default(tools):
    """The Responses API's function tools as it applies them: a tool that
    does not say `strict` is strict, its schema made strict (every object's
    properties required, no others: strict_schema), as OpenAI's Responses
    API does (Chat Completions keeps such tools free); where the schema so
    made does not compile, the tool stays free, as it was asked. A tool
    without parameters is left as it is (its rendering, `() => any`, says
    there are none)."""
    if not isinstance(tools, list):
        return tools
    out = []
    for t in tools:
        if isinstance(t, dict) and t.get("type") == "function" and t.get("strict") is None \
                and isinstance(t.get("parameters"), dict) and t["parameters"]:
            made = strict_schema(t["parameters"])
            try:
                schema_grammar(made)
                t = {**t, "strict": True, "parameters": made}
            except ConstraintError:
                pass
        out.append(t)
    return out


def strict_schema(schema):
    """A JSON schema as strict mode reads it: each object's properties all
    required and no others allowed (additionalProperties false where it is
    unsaid), through properties, items, the combinators and definitions."""
    if isinstance(schema, list):
        return [strict_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    # (not `not`: a strict schema inside a negation would change what it excludes)
    out = {k: strict_schema(v) if k in ("items", "prefixItems", "anyOf", "oneOf", "allOf", "if", "then", "else",
                                        "additionalProperties", "contains") and isinstance(v, (dict, list)) else v
           for k, v in schema.items()}
    for key in ("properties", "patternProperties", "$defs", "definitions"):
        if isinstance(schema.get(key), dict):
            out[key] = {name: strict_schema(v) for name, v in schema[key].items()}
    if schema.get("type") == "object" or isinstance(schema.get("properties"), dict):
        props = list(schema.get("properties") or {})
        required = schema.get("required") if isinstance(schema.get("required"), list) else []
        out["required"] = required + [p for p in props if p not in required]
        out.setdefault("additionalProperties", False)
    return out


def raw_constraint(tok, grammar: str | None = None, json_schema=None, schema_param: str = "json_schema",
                   response_format=None) -> Free | None:
    """A raw completion's constraint, from its first token: a grammar (GBNF
    or Lark text, or one goosedump.structured built), a JSON schema (the
    request's field schema_param: errors name it) or an OpenAI
    response_format (as vLLM reads it on /v1/completions)."""
    if grammar and json_schema is not None:
        raise PlanError(f"give grammar or {schema_param}, not both", schema_param)
    final = format_grammar(response_format) if response_format is not None else None
    if final is not None:
        if grammar or json_schema is not None:
            raise PlanError("give one of response_format, grammar, json_schema: each constrains the same text",
                            "response_format")
        return Free(tok, final)
    try:
        if grammar:
            return Free(tok, as_grammar(grammar))
        if json_schema is not None:         # ({} too: any JSON value)
            return Free(tok, schema_grammar(json_schema, schema_param))
    except PlanError:
        raise
    except ConstraintError as e:
        raise PlanError(str(e), schema_param if json_schema is not None else "grammar") from None
    return None
