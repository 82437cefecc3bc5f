"""llama.cpp's chat_template_kwargs as gpt-oss's template reads them
(reasoning_effort, model_identity, enable_thinking), per request and as
serve's --chat-template-kwargs defaults: the prompt is the one the chat
renderer makes with those options (which test_chat.py holds to
openai-harmony), every API of the server takes the defaults, and a
request's own fields win."""
import pytest
from starlette.testclient import TestClient

from goosedump.model import load
from goosedump.options import Options
from goosedump.server.app import create_app
from test_cli_habits import cli, fail
from test_server import USER

IDENTITY = "You are Goose, a model that runs on a CPU."


@pytest.fixture(scope="module")
def model(tiny_path):
    m = load(tiny_path, n_ctx=512, options=Options.from_env(prompt_cache="off"))
    yield m
    m.close()


@pytest.fixture(scope="module")
def defaults(model):
    """A server whose --chat-template-kwargs ask for high effort and another identity."""
    with TestClient(create_app(model, model_name="m",
                               chat_template_kwargs={"reasoning_effort": "high", "model_identity": IDENTITY})) as c:
        yield c


@pytest.fixture(scope="module")
def plain(model):
    with TestClient(create_app(model, model_name="m")) as c:
        yield c


def prompt_tokens(c, path, body) -> int:
    r = c.post(path, json=body)
    assert r.status_code == 200, r.text
    u = r.json()["usage"]
    return u.get("prompt_tokens", u.get("input_tokens", 0)) + u.get("cache_read_input_tokens", 0)


def test_a_requests_kwargs_shape_its_prompt(plain, model):
    kw = {"reasoning_effort": "high", "model_identity": IDENTITY}
    ids = model.render_chat(USER, reasoning_effort="high", model_identity=IDENTITY)
    text = plain.post("/apply-template", json={"messages": USER, "chat_template_kwargs": kw}).json()["prompt"]
    assert text == model.tokenizer.decode(ids) and IDENTITY in text and "Reasoning: high" in text
    assert prompt_tokens(plain, "/v1/chat/completions", {"messages": USER, "max_tokens": 1,
                                                          "chat_template_kwargs": kw}) == len(ids)
    # enable_thinking false is a reasoning budget of 0: the same tokens for the same seed
    body = {"messages": USER, "max_tokens": 12, "seed": 5, "temperature": 0.9}
    off = plain.post("/v1/chat/completions", json={**body, "chat_template_kwargs": {"enable_thinking": False}}).json()
    ref = plain.post("/v1/chat/completions", json={**body, "reasoning_budget": 0}).json()
    assert off["choices"][0]["message"] == ref["choices"][0]["message"]
    # keys gpt-oss's template does not read are ignored, as a template ignores them
    assert prompt_tokens(plain, "/v1/chat/completions", {"messages": USER, "max_tokens": 1,
                                                          "chat_template_kwargs": {"foo": 1}}) == \
        len(model.render_chat(USER))


def test_serves_defaults_reach_every_api_and_a_request_wins(defaults, model):
    high = model.render_chat(USER, reasoning_effort="high", model_identity=IDENTITY)
    low = model.render_chat(USER, reasoning_effort="low", model_identity=IDENTITY)
    assert defaults.post("/apply-template", json={"messages": USER}).json()["prompt"] == model.tokenizer.decode(high)
    assert prompt_tokens(defaults, "/v1/chat/completions", {"messages": USER, "max_tokens": 1}) == len(high)
    assert prompt_tokens(defaults, "/v1/responses", {"input": USER[0]["content"], "max_output_tokens": 1}) == len(high)
    assert prompt_tokens(defaults, "/v1/messages", {"messages": USER, "max_tokens": 1}) == len(high)
    r = defaults.post("/api/chat", json={"messages": USER, "stream": False, "options": {"num_predict": 1}}).json()
    assert r["prompt_eval_count"] == len(high)
    # the request's own effort wins over the defaults
    assert prompt_tokens(defaults, "/v1/chat/completions", {"messages": USER, "max_tokens": 1,
                                                             "reasoning_effort": "low"}) == len(low)
    assert defaults.post("/v1/responses", json={"input": "x", "max_output_tokens": 1,
                                                "reasoning": {"effort": "low"}}).json()["reasoning"]["effort"] == "low"
    assert defaults.post("/v1/responses", json={"input": "x", "max_output_tokens": 1}).json()["reasoning"] == \
        {"effort": "high", "summary": None}


@pytest.mark.parametrize("kw,phrase", [
    ("high", "Invalid 'chat_template_kwargs'"),
    ({"reasoning_effort": "max"}, "chat_template_kwargs.reasoning_effort must be one of low, medium, high"),
    ({"model_identity": 3}, "chat_template_kwargs.model_identity must be a string"),
    ({"enable_thinking": "no"}, "chat_template_kwargs.enable_thinking must be true or false"),
    ({"builtin_tools": ["python"]}, "builtin_tools is not supported"),
])
def test_refusals_are_named(plain, kw, phrase):
    r = plain.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 1, "chat_template_kwargs": kw})
    assert r.status_code == 400 and phrase in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("flag,phrase", [
    ("{nope", "--chat-template-kwargs is not JSON"),
    ("[1]", "--chat-template-kwargs must be a JSON object"),
    ('{"reasoning_effort": "max"}', "--chat-template-kwargs.reasoning_effort must be one of"),
])
def test_serves_flag_is_checked_before_the_model_loads(tiny_path, flag, phrase):
    fail(cli("serve", tiny_path, "--chat-template-kwargs", flag, timeout=60), phrase)
