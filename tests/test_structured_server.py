"""Structured output through the server, spoken to by the official openai
client: response_format, strict tools, tool_choice "required", llama.cpp's
grammar / json_schema fields, and errors before any token."""
import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from test_server import KEY, MODEL, USER, client, post, server  # noqa: F401 (fixtures)

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 10},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}
STRICT_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Gets the weather in a city.", "strict": True, "parameters": {
        "type": "object", "additionalProperties": False, "required": ["city", "unit"],
        "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}}}}}
STRICT_TIME = {"type": "function", "function": {
    "name": "get_time", "strict": True, "parameters": {
        "type": "object", "additionalProperties": False, "required": ["zone"],
        "properties": {"zone": {"enum": ["UTC", "CET"]}}}}}
BUDGET = {"reasoning_budget": 8}


def test_response_format_json_schema(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for temperature in (0, 1):
        r = client.chat.completions.create(model=MODEL, messages=USER, response_format=fmt, max_tokens=150,
                                           temperature=temperature, seed=5, extra_body=BUDGET)
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    # streamed alike
    stream = client.chat.completions.create(model=MODEL, messages=USER, response_format=fmt, max_tokens=150,
                                            temperature=0, stream=True, extra_body=BUDGET)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == client.chat.completions.create(model=MODEL, messages=USER, response_format=fmt, max_tokens=150,
                                                  temperature=0, extra_body=BUDGET).choices[0].message.content


def test_json_object_mode_and_the_parse_helper(client):
    r = client.chat.completions.create(model=MODEL, messages=USER, response_format={"type": "json_object"},
                                       max_tokens=150, temperature=0, extra_body=BUDGET)
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    import pydantic

    class Person(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        name: str = pydantic.Field(max_length=10)      # bounded: the random model's strings never end
        age: int = pydantic.Field(ge=0, le=120)
    parsed = client.beta.chat.completions.parse(model=MODEL, messages=USER, response_format=Person,
                                                max_tokens=300, temperature=0, extra_body=BUDGET)
    assert isinstance(parsed.choices[0].message.parsed, Person)


def test_strict_tools_round_trip(client):
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        for temperature in (0, 1):
            r = client.chat.completions.create(model=MODEL, messages=USER, tools=[STRICT_WEATHER, STRICT_TIME],
                                               tool_choice=choice, max_tokens=120, temperature=temperature,
                                               seed=3, extra_body=BUDGET)
            assert r.choices[0].finish_reason == "tool_calls"
            (call,) = r.choices[0].message.tool_calls
            tool = {"get_weather": STRICT_WEATHER, "get_time": STRICT_TIME}[call.function.name]
            jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
            if isinstance(choice, dict):
                assert call.function.name == "get_time"


def test_responses_text_format_and_strict_tools(client):
    r = client.responses.create(model=MODEL, input="Who?", max_output_tokens=150, temperature=0,
                                text={"format": {"type": "json_schema", "name": "person", "schema": PERSON,
                                                 "strict": True}}, extra_body=BUDGET)
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), PERSON)
    fn = dict(STRICT_WEATHER["function"], type="function")
    r = client.responses.create(model=MODEL, input="Weather?", tools=[fn], tool_choice="required",
                                max_output_tokens=120, temperature=0, extra_body=BUDGET)
    (call,) = [o for o in r.output if o.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), fn["parameters"])


def test_llamacpp_grammar_and_json_schema_fields(client):
    r = client.completions.create(model=MODEL, prompt="Answer:", max_tokens=40, temperature=1, seed=2,
                                  extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert r.choices[0].text in ("yes", "no") and r.choices[0].finish_reason == "stop"
    r = client.completions.create(model=MODEL, prompt="Person:", max_tokens=150, temperature=0,
                                  extra_body={"json_schema": PERSON})
    jsonschema.validate(json.loads(r.choices[0].text), PERSON)
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=150, temperature=0,
                                       extra_body={"json_schema": PERSON, **BUDGET})
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)


def test_length_inside_the_answer(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "many", "schema": {
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 80}}}
    r = client.chat.completions.create(model=MODEL, messages=USER, response_format=fmt, max_tokens=20,
                                       temperature=0, extra_body={"reasoning_budget": 0})
    assert r.choices[0].finish_reason == "length"


@pytest.mark.parametrize("path,body,param,needle", [
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format", "schema is required"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}}}, "response_format", "schema"),
    ("/v1/chat/completions", {"response_format": {"type": "yaml"}}, "response_format", "yaml"),
    ("/v1/chat/completions", {"grammar": "root ::= ("}, "grammar", "GBNF"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {
        "name": "f", "strict": True, "parameters": {"type": "object", "properties": {"a": {"type": "nope"}}}}}]},
     "tools", "'f'"),
    ("/v1/chat/completions", {"reasoning_budget": -1}, "reasoning_budget", "reasoning_budget"),
    ("/v1/responses", {"text": {"format": {"type": "json_schema", "name": "x", "schema": [1]}}}, "text.format",
     "JSON object"),
    ("/v1/completions", {"json_schema": {"type": "nope"}}, "json_schema", "json_schema"),
    ("/v1/completions", {"grammar": 'root ::= "\\ud800"'}, "grammar", "not a character"),
    ("/v1/completions", {"response_format": {"type": "json_object"}, "grammar": 'root ::= "a"'}, "response_format",
     "give one of"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "array", "items": {"type": "string"}}}}]}, "tools", "must be \"object\""),
    ("/v1/chat/completions", {"tools": [STRICT_TIME], "tool_choice": {"type": "function"}}, "tool_choice",
     "needs the function's name"),
    ("/v1/messages", {"tools": [{"name": "f", "strict": True, "input_schema": {
        "type": "object", "properties": {"x": {"not": {"type": "string"}}}}}]}, "tools", "'f'"),
])
def test_bad_schemas_are_400_before_any_token(server, path, body, param, needle):
    base = {"/v1/completions": {"prompt": "x"}, "/v1/responses": {"input": "x"}}.get(path, {"messages": USER})
    if path == "/v1/messages":
        r = post(server, path, {**base, **body, "max_tokens": 4, "model": MODEL})
        assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text
        return
    r = post(server, path, {**base, **body, "max_tokens": 4})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and needle in err["message"], err


def test_unconstrained_requests_are_unchanged_beside_a_constrained_one(client):
    def plain(i):
        return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"Q{i}"}],
                                              max_tokens=12, temperature=0).choices[0].message.content

    def constrained():
        fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
        return client.chat.completions.create(model=MODEL, messages=USER, response_format=fmt, max_tokens=150,
                                              temperature=0, extra_body=BUDGET).choices[0].message.content
    alone = [plain(i) for i in range(3)]
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(constrained)] + [pool.submit(plain, i) for i in range(3)]
        results = [f.result() for f in futures]
    jsonschema.validate(json.loads(results[0]), PERSON)
    assert results[1:] == alone


def test_gbnf_unicode_escapes_and_an_empty_schema(server, client):
    """GBNF's \\uXXXX as llama.cpp reads it (llguidance's converter had read
    \\u0041BC as U+41BC); json_schema {} is any JSON value (it had been no
    constraint at all), as in llama.cpp and ollama."""
    for grammar, want in (('root ::= "\\u0041BC"', "ABC"), ('root ::= "a\\u000Ab"', "a\nb"),
                          ('root ::= "\\U0001F600" [\\u00e0-\\u00e0]', "\U0001F600\u00e0")):
        r = post(server, "/completion", {"prompt": "Answer:", "grammar": grammar, "n_predict": 10, "temperature": 0})
        assert r.status_code == 200 and r.json()["content"] == want, (grammar, r.text)
    for seed in (1, 2, 3):
        r = client.completions.create(model=MODEL, prompt="Value:", max_tokens=200, temperature=1, seed=seed,
                                      extra_body={"json_schema": {}})
        text = r.choices[0].text
        if r.choices[0].finish_reason == "stop":
            json.loads(text)
        assert text.lstrip()[:1] in set('{["-0123456789tfn'), text


def test_response_format_on_completions_anthropic_output_format_and_responses_echo(server, client):
    """/v1/completions takes response_format, as vLLM does (it had been
    ignored); Anthropic's output_format (the beta's place) constrains as
    output_config.format does; the Responses API echoes the format it used."""
    r = client.completions.create(model=MODEL, prompt="Person:", max_tokens=150, temperature=0,
                                  extra_body={"response_format": {"type": "json_schema", "json_schema": {
                                      "name": "p", "schema": PERSON}}})
    jsonschema.validate(json.loads(r.choices[0].text), PERSON)
    body = {"model": MODEL, "max_tokens": 200, "messages": USER, "temperature": 0, "reasoning_budget": 8,
            "output_format": {"type": "json_schema", "schema": PERSON}}
    out = post(server, "/v1/messages", body).json()
    text = "".join(b["text"] for b in out["content"] if b["type"] == "text")
    jsonschema.validate(json.loads(text), PERSON)
    fmt = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    r = client.responses.create(model=MODEL, input="Who?", max_output_tokens=150, temperature=0,
                                text={"format": fmt}, extra_body=BUDGET)
    assert r.text.format.type == "json_schema" and r.text.format.name == "person"


def test_tool_choice_none_forbids_calls_and_anthropic_strict_tools_hold(tiny_model):
    """tool_choice "none" with tools: no call header is allowed, even to a
    tool the history names (it had only left the tools out of the prompt);
    Anthropic's strict tools keep their schema (strict had been dropped)."""
    from goosedump.reply_plan import forced_call_header, plan_reply
    from goosedump.server.anthropic_params import function_tools
    from goosedump.structured import ConstraintError, Gate
    tok = tiny_model.tokenizer
    plan = plan_reply(tok, [STRICT_TIME], "none")
    assert plan.tools is None and plan.spec is not None and plan.spec.tools == {}
    gate = Gate(tok, plan.spec)
    with pytest.raises(ConstraintError):
        for t in forced_call_header(tok, "get_time"):
            gate.advance(t)
    assert plan_reply(tok, [STRICT_TIME], "auto").spec.tools["get_time"] is not None
    tools = function_tools([{"name": "f", "strict": True, "input_schema": STRICT_TIME["function"]["parameters"]}])
    assert plan_reply(tok, tools, "auto").spec.tools["f"] is not None


def test_every_route_names_the_answers_schema_in_the_prompt(server):
    """The schema of every API's structured-output field is written into the
    developer message as harmony's guide has it (test_chat checks the text
    against the guide): Chat Completions' response_format (name and
    description), llama.cpp's json_schema field, the Responses API's
    text.format, Anthropic's output_format and output_config, ollama's
    format. Each route's prompt equals /apply-template's for the same schema."""
    system = "Answer as a person record."
    chat = {"model": MODEL, "messages": [{"role": "system", "content": system}] + USER}

    def chat_prompt(**fields) -> str:
        return post(server, "/apply-template", dict(chat, **fields)).json()["prompt"]

    def count(path, body) -> int:
        r = post(server, path, body)
        assert r.status_code == 200, r.text
        return r.json()["input_tokens"]

    named = chat_prompt(response_format={"type": "json_schema", "json_schema": {
        "name": "person", "description": "One person.", "schema": PERSON}})
    schema_text = json.dumps(PERSON, separators=(",", ":"))
    assert (f"# Instructions\n\n{system}\n\n# Response Formats\n\n## person\n\n// One person.\n{schema_text}<|end|>"
            in named)
    unnamed = chat_prompt(json_schema=PERSON)
    assert f"# Response Formats\n\n## response\n\n{schema_text}<|end|>" in unnamed
    assert "# Response Formats" not in chat_prompt(response_format={"type": "json_object"})
    n_named = count("/v1/chat/completions/input_tokens", dict(chat, response_format={
        "type": "json_schema", "json_schema": {"name": "person", "description": "One person.", "schema": PERSON}}))
    n_unnamed = count("/v1/chat/completions/input_tokens", dict(chat, json_schema=PERSON))
    assert n_named > n_unnamed > count("/v1/chat/completions/input_tokens", chat)
    assert count("/v1/responses/input_tokens", {"model": MODEL, "instructions": system, "input": USER[0]["content"],
                                                "text": {"format": {"type": "json_schema", "name": "person",
                                                                    "description": "One person.",
                                                                    "schema": PERSON}}}) == n_named
    anthropic = {"model": MODEL, "system": system, "messages": USER}
    for field in ({"output_format": {"type": "json_schema", "schema": PERSON}},
                  {"output_config": {"format": {"type": "json_schema", "schema": PERSON}}}):
        assert count("/v1/messages/count_tokens", dict(anthropic, **field)) == n_unnamed
    r = post(server, "/api/chat", {"model": MODEL, "messages": chat["messages"], "format": PERSON, "stream": False,
                                   "options": {"num_predict": 1}})
    assert r.status_code == 200, r.text
    assert r.json()["prompt_eval_count"] == n_unnamed


def test_responses_function_tools_are_strict_unless_they_say_not(server, client):
    """The Responses API makes a function tool that does not say `strict`
    strict, its schema normalised (every property required, no others), as
    OpenAI's documentation says ("If you omit strict, ... Responses requests
    will normalize your schema into strict mode"); `strict: false` keeps it
    free; Chat Completions keeps such tools free. The arguments validate
    against the normalised schema (jsonschema), and the echo says what was
    applied."""
    from goosedump.reply_plan import strict_by_default, strict_schema
    LAT = {"type": "integer", "minimum": -90, "maximum": 90}     # (bounded: the random model's numbers never end)
    params = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                               "unit": {"enum": ["c", "f"]},
                                               "where": {"type": "object", "properties": {"lat": LAT}}},
              "required": ["city"]}
    normalised = {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]},
        "where": {"type": "object", "properties": {"lat": LAT}, "required": ["lat"],
                  "additionalProperties": False}},
        "required": ["city", "unit", "where"], "additionalProperties": False}
    assert strict_schema(params) == normalised
    # inside a negation nothing changes (it would change what is excluded); pattern properties are made strict
    odd_shapes = {"type": "object", "properties": {}, "not": {"type": "object", "properties": {"a": {}}},
                  "patternProperties": {"^x": {"type": "object", "properties": {"b": LAT}}}}
    assert strict_schema(odd_shapes) == {**odd_shapes, "required": [], "additionalProperties": False,
                                         "patternProperties": {"^x": {"type": "object", "properties": {"b": LAT},
                                                                      "required": ["b"],
                                                                      "additionalProperties": False}}}
    tool = {"type": "function", "name": "weather", "description": "Weather.", "parameters": params}
    for seed in (1, 2):
        r = client.responses.create(model=MODEL, input="Weather?", tools=[tool], tool_choice="required",
                                    max_output_tokens=150, temperature=1, extra_body={**BUDGET, "seed": seed})
        (call,) = [o for o in r.output if o.type == "function_call"]
        jsonschema.validate(json.loads(call.arguments), normalised)
        assert r.tools[0].strict is True and r.tools[0].parameters == normalised
    r = client.responses.create(model=MODEL, input="Weather?", tools=[dict(tool, strict=False)], max_output_tokens=2,
                                temperature=0, extra_body=BUDGET)
    assert r.tools[0].strict is False and r.tools[0].parameters == params
    # a schema that cannot be made strict (an unresolved reference) stays free rather than refused
    odd = dict(tool, parameters={"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}})
    assert strict_by_default([odd]) == [odd]
    assert strict_by_default([dict(tool, strict=False)])[0]["parameters"] == params
    bare = {"type": "function", "name": "now"}       # no parameters: rendered `() => any` as before, left free
    assert strict_by_default([bare, dict(bare, parameters={})]) == [bare, dict(bare, parameters={})]
    # Chat Completions: the same tool unsaid stays free (its schema as given, optional fields optional)
    chat_tool = {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
    prompt = post(server, "/apply-template", {"messages": USER, "tools": [chat_tool]}).json()["prompt"]
    assert "unit?:" in prompt
    responses_prompt = client.responses.input_tokens.count(model=MODEL, input="Weather?", tools=[tool])
    assert responses_prompt.input_tokens > 0


def test_what_a_grammar_forces_is_not_cut_as_a_loop(client):
    """A grammar or schema that forces a repeating text (thirty zeros) gets
    it whole: the engine's loop stop (a cycle repeated four times) does not
    cut text a constraint holds."""
    r = client.completions.create(model=MODEL, prompt="x", max_tokens=100, temperature=0,
                                  extra_body={"grammar": 'root ::= "[" "0" ("," "0"){29} "]"'})
    assert (r.choices[0].text, r.choices[0].finish_reason) == ("[" + ",".join(["0"] * 30) + "]", "stop")
    zeros = {"type": "object", "additionalProperties": False, "required": ["a"],
             "properties": {"a": {"type": "array", "items": {"const": 0}, "minItems": 30, "maxItems": 30}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "zeros", "schema": zeros, "strict": True}}
    r = client.chat.completions.create(model=MODEL, messages=USER, response_format=fmt, max_tokens=200,
                                       temperature=0, extra_body={"reasoning_budget": 0})
    assert r.choices[0].finish_reason == "stop", r.choices[0]
    jsonschema.validate(json.loads(r.choices[0].message.content), zeros)


def test_a_loop_the_model_chooses_inside_a_grammar_still_stops(client, tiny_model):
    """The loop stop spares what the grammar forces, not what it allows: a
    model that writes "ab" over and over inside [a-z]+ is stopped, as
    without the grammar (it had run to max_tokens, a chat to the context's
    end)."""
    (ab,) = tiny_model.tokenizer.encode("ab")
    kw = dict(model=MODEL, prompt="x", max_tokens=300, temperature=0, logit_bias={str(ab): 100})
    free = client.completions.create(**kw)
    held = client.completions.create(**kw, extra_body={"grammar": "root ::= [a-z]+"})
    assert free.choices[0].finish_reason == held.choices[0].finish_reason == "repetition", (free, held)
    assert held.usage.completion_tokens < 40


def test_a_grammar_no_text_can_complete_is_a_400_not_a_short_answer(server, client):
    """llguidance's error state (a grammar that needs a character none is)
    had read as acceptance: the text ended short, a 200 with finish_reason
    stop. It is the request's fault: a 400, streamed an error event."""
    for grammar in ('root ::= "ab" [^\\x00-\\U0010FFFF]', 'start: "ab" /[^\\s\\S]/'):
        r = post(server, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 8, "temperature": 0,
                                             "grammar": grammar})
        assert r.status_code == 400 and "no text can complete it" in r.json()["error"]["message"], (grammar, r.text)
    with pytest.raises(openai.APIError, match="no text can complete it"):
        for _ in client.completions.create(model=MODEL, prompt="x", max_tokens=8, temperature=0, stream=True,
                                           extra_body={"grammar": 'root ::= "ab" [^\\x00-\\U0010FFFF]'}):
            pass
