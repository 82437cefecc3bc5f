"""The server against hostile or careless clients, by hand: huge and
endless bodies, JSON nested 100,000 deep, invalid UTF-8, absurd numbers,
unsupported fields, a prompt that exactly fills the context, a client that
trickles its body, hundreds of idle connections. Every answer is an
OpenAI-shaped error (or a normal reply), never a 5xx, and the server keeps
serving others."""
import json
import socket
import time

import pytest
from fastapi.testclient import TestClient

try:
    import httpx
except ImportError:
    import httpx2 as httpx

from goosedump.model import load
from goosedump.options import Options
from goosedump.server.app import create_app
from test_server import Served

CTX = 256
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def client(tiny_path):
    model = load(tiny_path, n_ctx=CTX, options=Options.from_env(prompt_cache="off"))
    with TestClient(create_app(model, model_name="m", max_body_bytes=1 << 20), raise_server_exceptions=False) as c:
        yield c, model


def openai_error(r, status: int, param=None, code=None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["type"] == ("invalid_request_error" if status < 500 else "server_error")
    if param is not None:
        assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    return err


def post(c, body, path="/v1/chat/completions", **kw):
    return c.post(path, content=json.dumps(body) if isinstance(body, (dict, list)) else body,
                  headers={"content-type": "application/json", **kw.pop("headers", {})}, **kw)


def test_json_nested_100000_deep_is_a_400(client):
    c, _ = client
    deep = '{"model":"m","messages":[{"role":"user","content":' + "[" * 100_000 + "]" * 100_000 + "}]}"
    assert "too deeply" in openai_error(post(c, deep), 400)["message"]
    deep_obj = '{"model":"m","messages":[{"role":"user","content":"x"}],"x":' + '{"a":' * 100_000 + "1" + "}" * 100_000 + "}"
    openai_error(post(c, deep_obj), 400)


def test_a_body_over_the_limit_is_refused_unread(client):
    c, _ = client
    big = b'{"model":"m","messages":[{"role":"user","content":"' + b"a" * (3 << 20) + b'"}]}'
    openai_error(post(c, big), 413, code="request_too_large")

    def chunked():                       # no Content-Length: counted as it arrives
        yield b'{"model":"m","messages":[{"role":"user","content":"'
        for _ in range(64):
            yield b"a" * (64 << 10)
        yield b'"}]}'
    openai_error(post(c, chunked()), 413, code="request_too_large")


def test_text_longer_than_the_context_is_refused_before_encoding(client):
    c, model = client
    n = CTX * model.tokenizer.max_token_bytes + 1000     # more tokens than the context, for certain
    err = openai_error(post(c, {"model": "m", "messages": [{"role": "user", "content": "a " * (n // 2)}]}), 400,
                       param="messages", code="context_length_exceeded")
    assert "at least" in err["message"]
    err = openai_error(post(c, {"model": "m", "prompt": "b" * n}, "/v1/completions"), 400, param="prompt",
                       code="context_length_exceeded")


def test_odd_values_and_fields(client):
    c, _ = client
    openai_error(post(c, b'{"model":"m","messages":[{"role":"user","content":"\xff\xfe"}]}'), 400)
    r = post(c, '{"model":"m","messages":[{"role":"user","content":"a\\ud800b"}],"max_tokens":2}')  # a lone surrogate
    if r.status_code != 200:
        openai_error(r, 400, param="messages")
    openai_error(post(c, {"model": "m", "messages": USER, "max_tokens": 2**63}), 400, param="max_tokens")
    openai_error(post(c, {"model": "m", "messages": USER, "max_tokens": -(2**63)}), 400, param="max_tokens")
    openai_error(post(c, {"model": "m", "messages": USER, "max_tokens": 2, "n": 100}), 400, param="n")
    openai_error(post(c, {"model": "m", "messages": USER, "temperature": 1e308 * 10}), 400)
    openai_error(post(c, b"[]"), 400)
    openai_error(post(c, b""), 400)
    r = post(c, {"model": "m", "messages": USER, "max_tokens": 2, "some_new_field": {"x": 1}})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 2     # unknown fields are ignored


def test_a_prompt_that_exactly_fills_the_context(client):
    c, model = client
    ids = model.tokenizer.encode("word " * 400)
    r = post(c, {"model": "m", "prompt": ids[:CTX - 4], "max_tokens": 4, "temperature": 0}, "/v1/completions")
    assert r.status_code == 200 and r.json()["usage"]["total_tokens"] <= CTX
    openai_error(post(c, {"model": "m", "prompt": ids[:CTX - 4], "max_tokens": 5}, "/v1/completions"), 400,
                 param="max_tokens")
    openai_error(post(c, {"model": "m", "prompt": ids[:CTX]}, "/v1/completions"), 400, param="prompt",
                 code="context_length_exceeded")


@pytest.fixture(scope="module")
def served(tiny_path, tmp_path_factory):
    s = Served(tiny_path, tmp_path_factory.mktemp("hostile") / "serve.log", "--ctx", str(CTX), "--model-name", "m",
               "--body-timeout", "2", "--no-prompt-cache")
    try:
        yield s.base, s.port
    finally:
        s.stop()


def chat_ok(base):
    r = httpx.post(base + "/v1/chat/completions", json={"model": "m", "messages": USER, "max_tokens": 2}, timeout=60)
    assert r.status_code == 200, r.text


def test_a_trickling_client_is_timed_out_while_others_are_served(served):
    base, port = served
    body = json.dumps({"model": "m", "messages": USER, "max_tokens": 2}).encode()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:10])
        t0 = time.monotonic()
        chat_ok(base)                               # served while the other waits
        s.settimeout(30)
        reply = b""
        while b"\r\n\r\n" not in reply:
            part = s.recv(4096)
            if not part:
                break
            reply += part
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        assert time.monotonic() - t0 < 25


def test_hundreds_of_idle_connections_do_not_stop_the_server(served):
    base, port = served
    idle = []
    try:
        for _ in range(500):
            idle.append(socket.create_connection(("127.0.0.1", port)))
        chat_ok(base)
    finally:
        for s in idle:
            s.close()
    chat_ok(base)
