"""Structured output (goosedump.structured, llguidance): on the random-weight
tiny model, which on its own writes noise, every constrained output parses
and validates against its schema (jsonschema, an independent validator);
the reasoning stays free; a masked token is never picked."""
import json
import re

import jsonschema
import numpy as np
import pytest

from goosedump.sampling import SamplingParams, sample
from goosedump.structured import ConstraintError, Free, Gate, ReplySpec, schema_grammar, text_grammar

# Schemas whose every value is bounded (strings by length, pattern or enum,
# arrays by maxItems, numbers by range), so that a constrained answer always
# ends inside the token limit whatever the model prefers.
S = {"type": "string", "maxLength": 8}
SCHEMAS = {
    "integer": {"type": "integer", "minimum": -5, "maximum": 500},
    "boolean": {"type": "boolean"},
    "enum": {"enum": ["red", "green", "blue"]},
    "const": {"const": "fixed"},
    "short string": S,
    "pattern": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
    "date-like": {"type": "string", "pattern": "^20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]$"},
    "flat object": {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0,
                                                                         "maximum": 120}},
                    "required": ["name", "age"], "additionalProperties": False},
    "optional fields": {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"enum": [1, 2, 3]}},
                        "required": ["a"], "additionalProperties": False},
    "nested": {"type": "object", "additionalProperties": False, "required": ["user"], "properties": {
        "user": {"type": "object", "additionalProperties": False, "required": ["id", "tags"], "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 99},
            "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 3}}}}},
    "array bounds": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                     "minItems": 2, "maxItems": 4},
    "array of objects": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "additionalProperties": False, "required": ["k"], "properties": {"k": S}}},
    "tuple": {"type": "array", "prefixItems": [{"type": "integer", "minimum": 0, "maximum": 3}, {"enum": ["a"]}],
              "items": False},
    "number range": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.25},
    "anyOf": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"enum": ["none"]}]},
    "nullable": {"anyOf": [{"type": "null"}, S]},
    "type list": {"type": ["boolean", "null"]},
    "$defs and $ref": {"$defs": {"point": {"type": "object", "additionalProperties": False,
                                           "required": ["x", "y"],
                                           "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                                          "y": {"type": "integer", "minimum": 0, "maximum": 9}}}},
                       "type": "object", "additionalProperties": False, "required": ["a", "b"],
                       "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}}},
    "recursive $ref": {"$defs": {"node": {"type": "object", "additionalProperties": False, "required": ["v"],
                                          "properties": {"v": {"enum": [0, 1]},
                                                         "next": {"$ref": "#/$defs/node"}}}},
                       "$ref": "#/$defs/node"},
    "oneOf": {"oneOf": [{"type": "object", "additionalProperties": False, "required": ["cat"],
                         "properties": {"cat": {"const": True}}},
                        {"type": "object", "additionalProperties": False, "required": ["dog"],
                         "properties": {"dog": {"const": True}}}]},
    "enum of mixed": {"enum": [1, "one", None, True]},
    "uuid-ish": {"type": "string", "pattern": "^[0-9a-f]{8}$"},
    "email-ish": {"type": "string", "pattern": "^[a-z]{1,6}@[a-z]{1,6}\\.(com|org)$"},
}
SAMPLING = {"greedy": SamplingParams(temperature=0), "temperature 1": SamplingParams(temperature=1.0, seed=7)}


def response_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


@pytest.mark.parametrize("sampling", list(SAMPLING))
@pytest.mark.parametrize("name", list(SCHEMAS))
def test_chat_answer_validates(tiny_model, name, sampling):
    schema = SCHEMAS[name]
    r = tiny_model.chat([{"role": "user", "content": "Answer in JSON."}], 160, sampling=SAMPLING[sampling],
                        response_format=response_format(schema), reasoning_budget=12)
    assert r.result.stop_reason == "eos", (r.result.stop_reason, r.reply.content)
    jsonschema.validate(json.loads(r.reply.content), schema)


@pytest.mark.parametrize("name", ["flat object", "nested", "$defs and $ref", "array bounds"])
def test_raw_completion_validates(tiny_model, name):
    for sampling in SAMPLING.values():
        r = tiny_model.generate("Data:", 160, sampling=sampling, json_schema=SCHEMAS[name])
        assert r.stop_reason == "eos"
        jsonschema.validate(json.loads(r.text), SCHEMAS[name])


def test_json_object_and_unconstrained_differ(tiny_model):
    free = tiny_model.chat([{"role": "user", "content": "Hi"}], 40, reasoning_budget=4,
                           sampling=SamplingParams(temperature=0))
    obj = tiny_model.chat([{"role": "user", "content": "Hi"}], 160, reasoning_budget=4,
                          sampling=SamplingParams(temperature=0), response_format={"type": "json_object"})
    assert isinstance(json.loads(obj.reply.content), dict)
    with pytest.raises(ValueError):          # the random model on its own writes no JSON object
        assert isinstance(json.loads(free.reply.content), dict)


def test_reasoning_stays_free(tiny_model):
    # the answer may only be digits; the reasoning before it is the model's own text
    schema = {"type": "integer", "minimum": 0, "maximum": 99}
    for seed in range(40):          # the random model picks its first channel: find runs that reason first
        r = tiny_model.chat([{"role": "user", "content": "Pick a number."}], 120, reasoning_budget=30,
                            sampling=SamplingParams(temperature=1.0, seed=seed),
                            response_format=response_format(schema))
        if r.reply.reasoning_content:
            break
    assert r.reply.reasoning_content, "no seed in 40 led the model to reason first"
    assert re.search(r"[^0-9]", r.reply.reasoning_content), r.reply.reasoning_content
    assert r.result.token_ids.count(tiny_model.tokenizer.special_token("<|end|>")) == 1
    jsonschema.validate(json.loads(r.reply.content), schema)


def test_no_reasoning_path(tiny_model):
    # reasoning_budget 0: the reply starts at the final channel (the path a low effort can take)
    r = tiny_model.chat([{"role": "user", "content": "x"}], 80, reasoning_budget=0,
                        sampling=SamplingParams(temperature=0), response_format=response_format(SCHEMAS["enum"]))
    text = tiny_model.tokenizer.decode(r.result.token_ids)
    assert text.startswith("<|channel|>final<|message|>") and not r.reply.reasoning_content
    assert json.loads(r.reply.content) in ("red", "green", "blue")


def test_strict_tool_arguments_and_required_choice(tiny_model):
    tool = {"type": "function", "function": {
        "name": "get_weather", "strict": True, "parameters": {
            "type": "object", "additionalProperties": False, "required": ["city", "unit"],
            "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}}}}}
    for sampling in SAMPLING.values():
        r = tiny_model.chat([{"role": "user", "content": "Weather in Oslo?"}], 160, tools=[tool],
                            tool_choice="required", reasoning_budget=8, sampling=sampling)
        assert r.result.stop_reason == "eos"
        assert r.result.eos_token_id == tiny_model.tokenizer.special_token("<|call|>")
        (call,) = r.reply.tool_calls
        assert call["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(call["function"]["arguments"]), tool["function"]["parameters"])


def test_max_tokens_inside_the_answer_says_length(tiny_model):
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 50}
    r = tiny_model.chat([{"role": "user", "content": "x"}], 20, reasoning_budget=0,
                        sampling=SamplingParams(temperature=0), response_format=response_format(schema))
    assert r.result.stop_reason == "max_tokens"
    with pytest.raises(ValueError):
        json.loads(r.reply.content)


@pytest.mark.parametrize("bad,message", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}, "nonsense"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}, "JSON object"),
    ({"type": "xml"}, "xml"),
])
def test_bad_response_formats_are_refused_before_generating(tiny_model, bad, message):
    with pytest.raises(ConstraintError, match=re.escape(message)):
        tiny_model.chat([{"role": "user", "content": "x"}], 8, response_format=bad)


def test_grammars_gbnf_lark_regex(tiny_model):
    gbnf = 'root ::= "yes" | "no" | "maybe " [0-9]'
    for kind, text, check in [("gbnf", gbnf, r"(yes|no|maybe [0-9])"), ("lark", 'start: /[a-c]{3}/', "[a-c]{3}"),
                              ("regex", "[0-9]{2}x", "[0-9]{2}x")]:
        r = tiny_model.generate("Say:", 30, grammar=text_grammar(text, kind),
                                sampling=SamplingParams(temperature=1.0, seed=1))
        assert r.stop_reason == "eos" and re.fullmatch(check, r.text), (kind, r.text)
    with pytest.raises(ConstraintError, match="GBNF"):
        text_grammar("root ::= (", "gbnf")


# --- the mask, as a property -----------------------------------------------------------

def test_a_masked_token_is_never_sampled():
    rng = np.random.default_rng(0)
    n = 512
    for trial in range(300):
        logits = rng.normal(0, 3, n).astype(np.float32)
        mask = rng.random(n) < rng.uniform(0.002, 0.5)
        mask[rng.integers(n)] = True
        bias = {int(t): 100.0 for t in rng.choice(np.flatnonzero(~mask), min(3, int((~mask).sum())), replace=False)}
        p = SamplingParams(temperature=float(rng.choice([0.0, 0.5, 1.0, 2.0])), top_k=int(rng.choice([0, 1, 5])),
                           top_p=float(rng.choice([1.0, 0.9, 0.3])), min_p=float(rng.choice([0.0, 0.1])),
                           repetition_penalty=float(rng.choice([1.0, 1.3])),
                           presence_penalty=float(rng.choice([0.0, 1.0])), logit_bias=bias, seed=trial)
        masked = logits.copy()
        masked[~mask] = -np.inf
        seen = rng.integers(0, n, 20)
        draws = np.random.default_rng(trial)
        for _ in range(5):
            t = sample(masked, p, draws, seen[:10], seen[10:])
            assert mask[t], (trial, p)


def test_the_stepper_applies_the_mask_to_greedy_and_sampled_rows(tiny_model):
    tok = tiny_model.tokenizer
    allowed = np.zeros(tok.n_vocab, bool)
    allowed[[1000, 2000, 3000, tok.eos_id]] = True

    class Only:
        def allowed(self):
            return allowed

        def advance(self, token):
            assert allowed[token]
    for sampling in (SamplingParams(temperature=0), SamplingParams(temperature=1, seed=2),
                     SamplingParams(temperature=0, logit_bias={5: 100})):
        r = tiny_model.generate("Hello", 12, sampling=sampling, constraint=Only(), reuse_cache=False)
        assert set(r.token_ids) <= {1000, 2000, 3000}


def test_gate_allows_the_end_only_when_the_grammar_accepts(tiny_model):
    tok = tiny_model.tokenizer
    sp = tok.special_token
    gate = Gate(tok, ReplySpec(final=schema_grammar({"enum": ["ab"]}), reasoning_budget=0))
    for t in tok.encode("<|channel|>final<|message|>", allow_special=True):
        assert gate.allowed()[t] and gate.allowed().sum() == 1
        gate.advance(t)
    assert not gate.allowed()[sp("<|return|>")]
    for t in tok.encode('"ab"'):
        gate.advance(t)
    mask = gate.allowed()
    assert mask[sp("<|return|>")] and not mask[sp("<|end|>")] and not mask[sp("<|call|>")]


def test_free_grammar_from_the_first_token(tiny_model):
    f = Free(tiny_model.tokenizer, schema_grammar({"type": "boolean"}))
    ok = np.flatnonzero(f.allowed())
    texts = {tiny_model.tokenizer.decode([int(t)]) for t in ok}
    assert texts and all("true".startswith(s) or "false".startswith(s) for s in texts)
