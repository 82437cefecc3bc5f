"""Bad request bodies on every API the server speaks get a 400 that names the
field (OpenAI's, ollama's and Anthropic's error shapes), never a 500, a
traceback in the log or a silent coercion: wrong types inside messages and
tools, integers past Python's digit limit, lone UTF-16 surrogates, a client
that hangs up mid-body, pydantic's lax mode (true for 1, "0.5" for 0.5,
"yes" for true), and null where the API's default is meant."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from test_cli_habits import free_port
from test_server import httpx

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def served(tiny_path, tmp_path_factory):
    """(base URL, log path) of a server on the tiny model, no API key."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("input") / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "goosedump.server", tiny_path, "--port", str(port),
                                 "--ctx", "512", "--threads", "1", "--no-prompt-cache", "--log-level", "warning"],
                                stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log_path.read_text()
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        yield base, log_path
    finally:
        proc.terminate()
        proc.wait(15)
    assert "Traceback" not in log_path.read_text(), log_path.read_text()


def send(base, path, body=None, content=None):
    return httpx.post(base + path, json=body, content=content, timeout=60)


def message_of(r) -> str:
    body = r.json()
    err = body["error"]
    return err if isinstance(err, str) else err["message"]


def refused(r, *needles):
    assert r.status_code == 400, (r.status_code, r.text)
    text = message_of(r)
    for n in needles:
        assert n in text, text
    return text


@pytest.mark.parametrize("messages,needle,ollama_too", [
    ([{"role": "tool", "name": 5, "content": "x"}], "messages[0].name must be a string", False),
    ([{"role": "tool", "tool_call_id": ["a"], "content": "x"}], "messages[0].tool_call_id must be a string", False),
    ([*USER, {"role": "assistant", "content": "a", "tool_calls": [{"id": ["x"], "function": {"name": "f"}}]},
      {"role": "user", "content": "x"}], "messages[1].tool_calls[0].id must be a string", True),
    ([*USER, {"role": "assistant", "content": "a", "tool_calls": {"a": 1}}, {"role": "user", "content": "x"}],
     "tool_calls must be a list", True),
])
def test_wrong_types_inside_messages_are_named(served, messages, needle, ollama_too):
    base, _ = served
    refused(send(base, "/v1/chat/completions", {"max_tokens": 2, "messages": messages}), needle)
    if ollama_too:     # (ollama's tool messages name their tool by tool_name: its own checks, its own words)
        refused(send(base, "/api/chat", {"stream": False, "options": {"num_predict": 2}, "messages": messages}),
                "tool_calls")


@pytest.mark.parametrize("fields,needle", [
    ({"output_config": {"effort": []}}, "output_config.effort"),
    ({"tool_choice": {"type": []}}, "tool_choice.type"),
    ({"tool_choice": {"type": "tool", "name": 3}}, "tool_choice.name"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": [], "content": "r"}]}]},
     "tool_use_id"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": 5}]}, {"role": "user", "content": "x"}]}, "thinking must be a string"),
])
def test_anthropic_fields_of_the_wrong_type(served, fields, needle):
    base, _ = served
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        r = send(base, path, {"max_tokens": 2, "messages": USER, **fields})
        assert r.status_code == 400, r.text
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
        assert needle in r.json()["error"]["message"], r.text


def test_responses_items_are_named_as_the_body_names_them(served):
    base, _ = served
    for content in ([{"text": 5}], 5, "abc"):
        item = {"type": "reasoning", "content": content}
        for path in ("/v1/responses", "/v1/responses/input_tokens"):
            r = send(base, path, {"max_output_tokens": 2, "input": [item, {"role": "user", "content": "x"}]})
            assert r.json()["error"]["param"] == "input"
            refused(r, "input[0]: a reasoning item's content and summary must be lists of text parts")
    # a rendering error names the input item, not the message it became (instructions come first)
    r = send(base, "/v1/responses", {"instructions": "be brief", "max_output_tokens": 2, "input": [
        {"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "input_image"}]}]})
    text = refused(r, "input[1]")
    assert "messages[" not in text
    refused(send(base, "/v1/responses", {"max_output_tokens": 2, "input": []}), "input is empty")


def test_numbers_past_the_digit_limit(served):
    base, _ = served
    raw = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1' + "0" * 5000 + "}"
    for path in ("/v1/chat/completions", "/api/chat", "/v1/messages"):
        r = httpx.post(base + path, content=raw, headers={"Content-Type": "application/json"}, timeout=60)
        refused(r, "integer of more than 4300 digits")


@pytest.mark.parametrize("path,body,where", [
    ("/v1/responses", {"input": "hi", "max_output_tokens": 2, "instructions": "\ud800"}, "instructions"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 2, "metadata": {"k": "a\udc00"}}, "metadata.k"),
    ("/completion", {"prompt": "hi", "n_predict": 2, "stop": ["\ud800"]}, "stop[0]"),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 2, "model": "\ud800"}, "model"),
    ("/api/chat", {"messages": USER, "model": "\ud800"}, "model"),
])
def test_lone_surrogates_are_refused_where_they_stand(served, path, body, where):
    base, _ = served
    raw = json.dumps(body)           # ensure_ascii: the lone surrogate as its escape, as a client would send it
    assert "\\ud" in raw
    r = httpx.post(base + path, content=raw, headers={"Content-Type": "application/json"}, timeout=60)
    refused(r, f"string at {where} holds an unpaired UTF-16 surrogate")
    if path.startswith("/v1/"):
        assert r.json()["error"]["param"] == where.split(".")[0].split("[")[0]
    # a pair is text, and passes
    ok = httpx.post(base + "/v1/chat/completions", timeout=60, headers={"Content-Type": "application/json"},
                    content='{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}], "max_tokens": 1}')
    assert ok.status_code == 200, ok.text


def test_a_client_that_hangs_up_mid_body_leaves_no_traceback(served):
    base, log = served
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"messages\":")
        time.sleep(0.3)
    time.sleep(0.5)
    assert httpx.get(base + "/health", timeout=5).status_code == 200
    assert "Traceback" not in log.read_text() and "ClientDisconnect" not in log.read_text()


@pytest.mark.parametrize("path,body,field", [
    ("/v1/chat/completions", {"messages": USER, "max_tokens": True}, "max_tokens"),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 2, "n": True}, "'n'"),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 2, "temperature": "0.5"}, "temperature"),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 2, "stream": "yes"}, "stream"),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 2, "stream": 1}, "stream"),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 2, "time_budget": "1"}, "time_budget"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "logprobs": True}, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "stream": True,
                         "stream_options": {"include_usage": "no"}}, "stream_options.include_usage"),
    ("/api/chat", {"messages": USER, "stream": False, "options": {"seed": True}}, "options.seed"),
    ("/api/chat", {"messages": USER, "stream": "no"}, "stream"),
    ("/detokenize", {"tokens": [True]}, "tokens"),
    ("/tokenize", {"content": "hi", "with_pieces": 1}, "with_pieces"),
])
def test_no_lax_coercion(served, path, body, field):
    base, _ = served
    refused(send(base, path, body), field)


def test_whole_number_floats_where_llama_cpp_and_ollama_take_them(served):
    """llama.cpp and ollama read 4.0 as 4; OpenAI's routes keep integers strict."""
    base, _ = served
    ints = send(base, "/completion", {"prompt": "hi", "n_predict": 4, "temperature": 0, "n_probs": 2}).json()
    floats = send(base, "/completion", {"prompt": "hi", "n_predict": 4.0, "temperature": 0, "n_probs": 2.0}).json()
    assert floats["tokens_predicted"] == 4 and floats["content"] == ints["content"]
    assert len(floats["completion_probabilities"][0]["top_logprobs"]) == 2
    r = send(base, "/api/generate", {"prompt": "hi", "stream": False,
                                     "options": {"num_predict": 3.0, "seed": 42.0, "top_k": 40.0}})
    assert r.status_code == 200 and r.json()["eval_count"] == 3, r.text
    refused(send(base, "/completion", {"prompt": "hi", "n_predict": 4.5}), "n_predict")
    refused(send(base, "/v1/chat/completions", {"messages": USER, "max_tokens": 2.0}), "max_tokens")


def test_null_is_the_default(served):
    base, _ = served
    r = send(base, "/v1/chat/completions", {"messages": USER, "max_tokens": 2, "stream": None})
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"
    # ollama streams unless told not to: null is its default too
    r = send(base, "/api/chat", {"messages": USER, "stream": None, "options": {"num_predict": 2}})
    lines = [json.loads(x) for x in r.text.splitlines() if x.strip()]
    assert r.status_code == 200 and len(lines) > 1 and lines[-1]["done"]
    # /v1/completions: null max_tokens is OpenAI's 16, not the whole context
    base_body = {"prompt": "Once upon a time", "temperature": 0, "logit_bias": {"200002": -100, "199999": -100}}
    unsaid = send(base, "/v1/completions", {**base_body, "max_tokens": None}).json()
    sixteen = send(base, "/v1/completions", {**base_body, "max_tokens": 16}).json()
    assert unsaid["usage"]["completion_tokens"] == sixteen["usage"]["completion_tokens"] == 16
    assert unsaid["choices"][0]["text"] == sixteen["choices"][0]["text"]


def test_tool_parameters_must_be_a_schema(served):
    base, _ = served
    for params, needle in (({"type": "bogus"}, "parameters.type must be one of"),
                           ({"type": "object", "properties": 5}, "parameters.properties must be an object"),
                           ({"type": "object", "properties": {"a": {"type": "strin"}}},
                            "parameters.properties.a.type"),
                           ({"type": "object", "required": "a"}, "parameters.required must be a list"),
                           ({"type": "array", "items": [{"type": "string"}, {"type": "nope"}]},
                            "parameters.items[1].type")):
        tool = {"type": "function", "function": {"name": "f", "parameters": params}}
        refused(send(base, "/v1/chat/completions", {"messages": USER, "max_tokens": 2, "tools": [tool]}),
                "tools[0] (f): invalid schema", needle)
    # items as a list (tuple validation, drafts 4-7) is a schema
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"pair": {"type": "array", "items": [{"type": "string"}, {"type": "number"}]}}}}}
    assert send(base, "/v1/chat/completions", {"messages": USER, "max_tokens": 2, "tools": [tool]}).status_code == 200


def test_ollama_format_errors_name_format(served):
    base, _ = served
    r = send(base, "/api/generate", {"prompt": "hi", "raw": True, "stream": False, "format": {"type": "bogus"}})
    text = refused(r, "format")
    assert "json_schema" not in text
