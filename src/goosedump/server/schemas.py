"""Request bodies of the generating endpoints. Unknown fields (user, metadata,
store, parallel_tool_calls, ...) are accepted and ignored, as clients send
them freely. Known ones are typed strictly, as OpenAI's API checks them: no
true for 1, no "0.5" for 0.5, no "yes" for true (pydantic's lax mode had
read them so); an integer stands for a float. A null stream is the default."""
from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict


def _null_is(default):
    return BeforeValidator(lambda v: default if v is None else v)


def as_whole(v):
    """A float that is a whole number as that integer (llama.cpp and ollama
    read 128.0 as 128; OpenAI's routes do not: they keep int)."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


Stream = Annotated[bool, _null_is(False)]          # stream: null is the API's default
StreamOn = Annotated[bool, _null_is(True)]         # (ollama's, which streams unless told not to)
WholeInt = Annotated[int, BeforeValidator(as_whole)]


class Fields(BaseModel):
    """Fields every generating endpoint takes."""
    model_config = ConfigDict(extra="allow", strict=True)
    model: Union[str, None] = None
    stream: Stream = False
    stream_options: Union[dict[str, Any], None] = None
    temperature: Union[float, None] = None
    top_p: Union[float, None] = None
    top_k: Union[int, None] = None
    min_p: Union[float, None] = None
    repetition_penalty: Union[float, None] = None
    presence_penalty: Union[float, None] = None
    frequency_penalty: Union[float, None] = None
    logit_bias: Union[dict[str, float], None] = None
    seed: Union[int, None] = None
    stop: Union[str, list[str], None] = None
    n: Union[int, None] = None
    time_budget: Union[float, None] = None     # goosedump: seconds of generation at most
    temperature_last: Union[bool, None] = None  # llama.cpp's order: top-k/p, min-p, then temperature
    repeat_last_n: Union[int, None] = None      # llama.cpp's penalty window (-1: all, 0: no penalties)
    # llama.cpp's: the answer follows a grammar (GBNF or Lark) or a JSON schema
    grammar: Union[str, None] = None
    json_schema: Union[dict[str, Any], None] = None


class ChatBody(Fields):
    messages: list[dict[str, Any]]
    tools: Union[list[dict[str, Any]], None] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    reasoning_effort: Union[str, None] = None
    max_tokens: Union[int, None] = None
    max_completion_tokens: Union[int, None] = None
    response_format: Union[dict[str, Any], None] = None
    reasoning_budget: Union[int, None] = None  # goosedump: analysis tokens at most (0: none)
    logprobs: Union[bool, None] = None
    top_logprobs: Union[int, None] = None
    # llama.cpp's: reasoning_effort, model_identity, enable_thinking (server/params.py template_options)
    chat_template_kwargs: Union[dict[str, Any], None] = None
    # vLLM's: the reply continues the last message, an assistant's (a prefill)
    continue_final_message: Union[bool, None] = None
    add_generation_prompt: Union[bool, None] = None


class CompletionBody(Fields):
    prompt: Union[str, list[int], list[str], list[list[int]]]
    # OpenAI's default for this endpoint, null too (it had read as "the whole context")
    max_tokens: Annotated[Union[int, None], _null_is(16)] = 16
    echo: Union[bool, None] = None
    suffix: Union[str, None] = None
    best_of: Union[int, None] = None
    logprobs: Union[int, None] = None
    response_format: Union[dict[str, Any], None] = None     # as vLLM reads it here: the text's format


class ResponsesBody(Fields):
    input: Union[str, list[dict[str, Any]]]
    instructions: Union[str, None] = None
    tools: Union[list[dict[str, Any]], None] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    reasoning: Union[dict[str, Any], None] = None
    max_output_tokens: Union[int, None] = None
    previous_response_id: Union[str, None] = None
    text: Union[dict[str, Any], None] = None
    reasoning_budget: Union[int, None] = None
    metadata: Union[dict[str, Any], None] = None
    include: Union[list[str], None] = None
    top_logprobs: Union[int, None] = None
    parallel_tool_calls: Union[bool, None] = None
    conversation: Union[str, dict[str, Any], None] = None


# --- the OpenAPI description (/openapi.json): the bodies above, the replies'
# outline and OpenAI's error object; schemathesis fuzzes the server from it.

MESSAGE = {"type": "object", "required": ["role"], "additionalProperties": True,
           "properties": {"role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
                          "content": {"anyOf": [{"type": "string"}, {"type": "null"},
                                                {"type": "array", "items": {"type": "object"}}]},
                          "name": {"type": "string"}, "tool_call_id": {"type": "string"},
                          "tool_calls": {"type": "array", "items": {"type": "object"}}}}
ERROR = {"type": "object", "required": ["error"],
         "properties": {"error": {"type": "object", "required": ["message", "type", "param", "code"],
                                  "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                                                 "param": {"type": ["string", "null"]},
                                                 "code": {"type": ["string", "null"]}}}}}
ERROR_STATUSES = ("400", "401", "404", "408", "413", "422")
# the errors every route may answer (a route's own come from openapi_extra)
ERROR_RESPONSES = {int(code): {"description": "an error, as OpenAI answers it",
                               "content": {"application/json": {"schema": ERROR}}}
                   for code in ("401", "404")}


# One server-sent event of a stream, as a reader parses it (the HTML
# standard's fields): OpenAPI 3.0 and 3.1 tools (schemathesis among them)
# read a text/event-stream schema as each event's. data holds a chunk's JSON,
# or the closing [DONE].
SSE_EVENT = {"type": "object", "required": ["data"],
             "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"},
                            "retry": {"type": "integer", "minimum": 0}}}


def openapi_extra(body: type[BaseModel], reply: dict, message: dict = MESSAGE, error: dict = ERROR) -> dict:
    """openapi_extra of a route that reads `body` itself (parse_body): its
    request body (message: the schema of each of its messages) and its
    answers (error: the API's error object), for /openapi.json."""
    schema = body.model_json_schema()
    if "messages" in schema["properties"]:
        schema["properties"]["messages"] = {"type": "array", "items": message, "minItems": 1}
    json_or_sse = {"application/json": {"schema": reply}, "text/event-stream": {"schema": SSE_EVENT}}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
            "responses": {"200": {"description": "the reply (a stream of server-sent events when stream is true)",
                                  "content": json_or_sse},
                          **{code: {"description": "an error",
                                    "content": {"application/json": {"schema": error}}} for code in ERROR_STATUSES}}}


CHAT_REPLY = {"type": "object", "required": ["id", "object", "choices", "usage"],
              "properties": {"object": {"const": "chat.completion"}, "choices": {"type": "array", "minItems": 1}}}
COMPLETION_REPLY = {"type": "object", "required": ["id", "object", "choices", "usage"],
                    "properties": {"object": {"const": "text_completion"}, "choices": {"type": "array", "minItems": 1}}}
RESPONSE_REPLY = {"type": "object", "required": ["id", "object", "output", "status"],
                  "properties": {"object": {"const": "response"}, "output": {"type": "array"}}}
