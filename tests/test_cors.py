"""Web pages calling the server from a browser (serve's --cors-origins), and
HEAD. The browser is jsdom's XMLHttpRequest (npm's jsdom, installed here
into a temporary folder), which applies the Fetch standard's CORS checks
as browsers do: the preflight, the allowed origin, method and headers,
the exposed headers. A page on a local origin calls the API with its key
and reads the answer, a 401 and the replica's header; a page from the wider
web is refused (a network error to the page, one note in the server's log);
--cors-origins names others, '*' any, off none. HEAD answers as GET without
its body (ollama's CLI checks a server by HEAD / before each command)."""
import json
import re
import shutil
import socket
import subprocess

import httpx
import pytest
from starlette.testclient import TestClient

from goosedump.model import load
from goosedump.options import Options
from goosedump.server.app import create_app
from goosedump.server.hosts import checked_hosts, host_name, is_loopback
from test_cli_habits import cli, fail
from test_server import KEY, MODEL, USER, Served, free_port

XHR = r"""
// node xhr.js ORIGIN METHOD URL BODY KEY: one XMLHttpRequest from a page on ORIGIN
const { JSDOM } = require("jsdom");
const [origin, method, url, body, key] = process.argv.slice(2);
const dom = new JSDOM("<!doctype html><p>page</p>", { url: origin + "/" });
const xhr = new dom.window.XMLHttpRequest();
xhr.open(method, url);
if (body) xhr.setRequestHeader("Content-Type", "application/json");
if (key) xhr.setRequestHeader("Authorization", "Bearer " + key);
xhr.onload = () => console.log(JSON.stringify({ status: xhr.status, text: xhr.responseText,
                                                replica: xhr.getResponseHeader("X-Goosedump-Replica") }));
xhr.onerror = () => console.log(JSON.stringify({ error: "network error" }));
xhr.send(body || null);
"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """jsdom and the script above, run with node: (origin, method, url, body, key) -> its result."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        pytest.fail("this test needs Node.js 18 or later with npm (nodejs.org, or Debian's nodejs and npm)")
    where = tmp_path_factory.mktemp("jsdom")
    out = subprocess.run([npm, "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(where), "jsdom@26"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"npm install jsdom@26: {out.stderr[-2000:]}"
    (where / "xhr.js").write_text(XHR)

    def request(origin, method, url, body=None, key=None):
        args = [node, str(where / "xhr.js"), origin, method, url, json.dumps(body) if body else "", key or ""]
        r = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=where)
        lines = r.stdout.strip().splitlines()
        assert lines, f"node printed nothing: {r.stderr[-2000:]}"
        return json.loads(lines[-1])
    return request


@pytest.fixture(scope="module")
def served(tiny_path, tmp_path_factory):
    s = Served(tiny_path, tmp_path_factory.mktemp("cors") / "serve.log", "--api-key", KEY)
    yield s
    s.stop()


CHAT = {"model": MODEL, "messages": USER, "max_tokens": 3, "temperature": 0}


def test_a_local_page_calls_the_api_and_reads_its_answers(browser, served):
    url = served.base + "/v1/chat/completions"
    for origin in ("http://localhost:5173", "http://127.0.0.1:3000", "https://localhost", "http://[::1]:8000"):
        r = browser(origin, "POST", url, CHAT, KEY)
        assert r.get("status") == 200, (origin, r)
        reply = json.loads(r["text"])
        assert reply["object"] == "chat.completion" and reply["usage"]["completion_tokens"] == 3
        assert r["replica"], "X-Goosedump-Replica is exposed to the page"
    # an error is the page's to read too (a preflight needs no key; the request does)
    r = browser("http://localhost:5173", "GET", served.base + "/v1/models", key="wrong")
    assert r.get("status") == 401 and json.loads(r["text"])["error"]["code"] == "invalid_api_key", r
    r = browser("http://localhost:5173", "GET", served.base + "/v1/models", key=KEY)
    assert r.get("status") == 200 and json.loads(r["text"])["data"][0]["id"] == MODEL, r


def test_a_page_from_the_wider_web_is_refused_and_the_log_says_how_to_allow_it(browser, served):
    for origin in ("https://ui.example.com", "http://127.0.0.1.example.com", "http://localhost.example.com:5173"):
        r = browser(origin, "POST", served.base + "/v1/chat/completions", CHAT, KEY)
        assert r == {"error": "network error"}, (origin, r)
    browser("https://ui.example.com", "POST", served.base + "/v1/chat/completions", CHAT, KEY)
    log = served.log.read_text()
    assert log.count("a web page from 'https://ui.example.com' was refused (CORS)") == 1, log
    assert "--cors-origins 'local,https://ui.example.com'" in log


def test_a_plain_post_from_a_foreign_page_is_refused_before_the_model_runs(served):
    """A POST that needs no preflight (text/plain, no key: what a page may
    send to any address) is refused with a 403, not run with only its answer
    hidden; the server's own origin and clients without an Origin pass."""
    def generated():
        m = re.search(r"^goosedump_generated_tokens_total (\d+)", httpx.get(served.base + "/metrics").text, re.M)
        return int(m.group(1))
    before = generated()
    body = json.dumps(CHAT)
    r = httpx.post(served.base + "/v1/chat/completions", content=body,
                   headers={"Origin": "https://ui.example.com", "Content-Type": "text/plain"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", r.text
    assert "access-control-allow-origin" not in r.headers
    r = httpx.post(served.base + "/api/chat", content=json.dumps({"model": MODEL, "messages": USER}),
                   headers={"Origin": "null"})
    assert r.status_code == 403 and "may not call this server" in r.json()["error"]        # (ollama's shape)
    assert generated() == before
    assert "from 'null' was refused (CORS); only '*' allows it" in served.log.read_text()
    auth = {"Authorization": f"Bearer {KEY}"}
    own = httpx.post(served.base + "/v1/chat/completions", json=CHAT, headers={**auth, "Origin": served.base})
    assert own.status_code == 200, own.text
    assert httpx.post(served.base + "/v1/chat/completions", json=CHAT, headers=auth).status_code == 200


def test_cors_origins_names_others_any_or_none(browser, tiny_path, tmp_path):
    s = Served(tiny_path, tmp_path / "serve.log", "--api-key", KEY, "--cors-origins", "https://ui.example.com/, local")
    try:
        url = s.base + "/v1/chat/completions"
        assert browser("https://ui.example.com", "POST", url, CHAT, KEY).get("status") == 200
        assert browser("http://localhost:8000", "POST", url, CHAT, KEY).get("status") == 200
        assert browser("https://other.example.com", "POST", url, CHAT, KEY) == {"error": "network error"}
    finally:
        s.stop()
    s = Served(tiny_path, tmp_path / "any.log", "--api-key", KEY, "--cors-origins", "*")
    try:
        assert browser("https://other.example.com", "POST", s.base + "/v1/chat/completions", CHAT, KEY).get(
            "status") == 200
    finally:
        s.stop()


@pytest.fixture(scope="module")
def model(tiny_path):
    m = load(tiny_path, n_ctx=256, options=Options.from_env(prompt_cache="off"))
    yield m
    m.close()


def preflight(c, origin):
    return c.options("/v1/chat/completions", headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                                      "Access-Control-Request-Headers": "authorization,content-type"})


def test_off_allows_no_other_origin_and_local_is_anchored(model):
    with TestClient(create_app(model, model_name=MODEL, cors_origins="off")) as c:
        r = preflight(c, "http://localhost:5173")
        assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
        r = c.get("/v1/models", headers={"Origin": "http://localhost:5173"})
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
        assert c.get("/v1/models", headers={"Origin": "http://testserver"}).status_code == 200   # its own
        assert c.get("/v1/models").status_code == 200
    with TestClient(create_app(model, model_name=MODEL)) as c:
        for origin in ("http://localhost:5173", "https://127.0.0.1", "http://0.0.0.0:8080", "vscode-webview://abc",
                       "app://./index.html"):
            ok = preflight(c, origin)
            assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == origin, origin
            assert "authorization" in ok.headers["access-control-allow-headers"]
        for origin in ("http://localhost:5173.example.com", "http://evil.com/http://localhost", "null",
                       "http://localhost:123456", "ftp://localhost"):
            r = preflight(c, origin)
            assert r.status_code == 400 and "access-control-allow-origin" not in r.headers, origin
    # as a browser writes an origin: lower case, no default port
    with TestClient(create_app(model, model_name=MODEL, cors_origins="HTTPS://UI.Example.com:443/")) as c:
        assert preflight(c, "https://ui.example.com").status_code == 200
        assert preflight(c, "http://localhost:5173").status_code == 400


def test_an_internal_error_is_a_500_a_page_may_read(model, monkeypatch):
    """A bug's 500 passes back through the middleware: the page reads it
    (CORS) and the replica is named, in the API's error shape."""
    app = create_app(model, model_name=MODEL, replica="r1")

    def broken():
        raise RuntimeError("boom")
    monkeypatch.setattr(app.state.server, "model_card", broken)
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.get("/v1/models", headers={"Origin": "http://localhost:5173"})
        assert r.status_code == 500, r.text
        assert r.json()["error"] == {"message": "internal error: RuntimeError: boom", "type": "server_error",
                                     "param": None, "code": None}
        assert r.headers["access-control-allow-origin"] == "http://localhost:5173"
        assert r.headers["x-goosedump-replica"] == "r1"
        assert c.get("/health").status_code == 200          # the server goes on
        assert 'endpoint="/v1/models",status="500"' in c.get("/metrics").text


def test_head_sends_no_body_at_the_asgi_level(model):
    """The middleware itself drops the body (uvicorn would too; another
    ASGI server or a proxy in front need not)."""
    import anyio
    app = create_app(model, model_name=MODEL)
    sent = []

    async def call(method):
        sent.clear()
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": "/health", "raw_path": b"/health", "query_string": b"",
                 "headers": [(b"host", b"testserver")], "client": ("127.0.0.1", 1), "server": ("testserver", 80)}

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            sent.append(message)
        await app(scope, receive, send)
        return list(sent)
    get, head = anyio.run(call, "GET"), anyio.run(call, "HEAD")
    body = b"".join(m.get("body", b"") for m in get if m["type"] == "http.response.body")
    assert json.loads(body)["status"] == "ok"
    assert head[0]["status"] == 200 and dict(head[0]["headers"])[b"content-length"] == str(len(body)).encode()
    assert all(m.get("body", b"") == b"" for m in head if m["type"] == "http.response.body")


def test_head_answers_as_get_without_its_body(served):
    for path in ("/", "/api/version", "/health", "/v1/models", "/api/tags"):
        get = httpx.get(served.base + path, headers={"Authorization": f"Bearer {KEY}"})
        head = httpx.head(served.base + path, headers={"Authorization": f"Bearer {KEY}"})
        assert head.status_code == get.status_code == 200, path
        assert head.content == b"" and head.headers["content-length"] == str(len(get.content)), path
    assert httpx.head(served.base + "/v1/models").status_code == 401               # the key still guards it
    assert httpx.head(served.base + "/v1/chat/completions",
                      headers={"Authorization": f"Bearer {KEY}"}).status_code == 405   # a POST route


@pytest.mark.parametrize("value, needle", [
    ("", "no origin"),
    ("localhost:3000", "'localhost:3000' is not an origin"),
    ("local,https://ui.example.com/app", "'https://ui.example.com/app' is not an origin"),
    ("https://*.example.com", "is not an origin"),
    ("http://user@host", "is not an origin"),
    ("local,*", "* stands alone"),
    ("off,http://localhost:3000", "off stands alone"),
    ("http://localhost:70000", "is not an origin"),
])
def test_a_wrong_cors_origins_is_named(tiny_path, value, needle):
    fail(cli("serve", tiny_path, "--port", str(free_port()), "--cors-origins", value), "--cors-origins", needle)


# --- DNS rebinding: the Host names a server on a loopback address answers (serve's --allowed-hosts) ---

def generated_tokens(base):
    m = re.search(r"^goosedump_generated_tokens_total (\d+)", httpx.get(base + "/metrics").text, re.M)
    return int(m.group(1))


def test_a_page_that_rebinds_its_name_to_this_machine_is_refused(served):
    """What a browser sends once a site has pointed its own name at
    127.0.0.1: the site's name in Host, its origin in Origin (the server's
    own origin to the browser, so CORS lets it through) and, on a GET, no
    Origin at all. The server refuses both before the model runs; the names
    of this machine, addresses and local names pass."""
    port = served.port
    auth = {"Authorization": f"Bearer {KEY}"}
    before = generated_tokens(served.base)
    host = f"rebind.example.com:{port}"
    r = httpx.get(served.base + "/v1/models", headers={**auth, "Host": host})
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed", r.text
    assert "--allowed-hosts" in r.json()["error"]["message"] and "'rebind.example.com:" in r.json()["error"]["message"]
    r = httpx.post(served.base + "/v1/chat/completions", json=CHAT,
                   headers={**auth, "Host": host, "Origin": f"http://{host}"})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers, r.text
    r = httpx.post(served.base + "/api/chat", json={"model": MODEL, "messages": USER}, headers={**auth, "Host": host})
    assert r.status_code == 403 and "does not answer to the host name" in r.json()["error"]    # (ollama's shape)
    assert generated_tokens(served.base) == before
    for name in ("localhost", "LocalHost.", "127.0.0.1", "[::1]", "127.1.2.3", "192.168.1.20", "app.localhost",
                 "printer.local", "host.docker.internal", socket.gethostname()):
        for h in (name, f"{name}:{port}"):
            r = httpx.get(served.base + "/v1/models", headers={**auth, "Host": h})
            assert r.status_code == 200, (h, r.text)
    assert httpx.post(served.base + "/v1/chat/completions", json=CHAT,
                      headers={**auth, "Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"}
                      ).status_code == 200


def test_allowed_hosts_names_others_or_any(tiny_path, tmp_path):
    s = Served(tiny_path, tmp_path / "serve.log", "--allowed-hosts", "llm.example.com, *.corp.example")
    try:
        def status(host):
            return httpx.get(s.base + "/v1/models", headers={"Host": host}).status_code
        assert status("llm.example.com") == 200 and status(f"LLM.example.com:{s.port}") == 200
        assert status("a.corp.example") == 200 and status("b.a.corp.example") == 200
        assert status("corp.example") == 403 and status("other.example.com") == 403
        assert status("localhost") == 200                    # the local names stay
    finally:
        s.stop()
    s = Served(tiny_path, tmp_path / "any.log", "--allowed-hosts", "*")
    try:
        assert httpx.get(s.base + "/v1/models", headers={"Host": "rebind.example.com"}).status_code == 200
    finally:
        s.stop()


def test_which_servers_check_their_host():
    """A loopback address checks by default; another address is reached by
    whatever names point at it, so it checks only the names given."""
    for bind in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "LOCALHOST"):
        assert is_loopback(bind) and checked_hosts(bind) == [socket.gethostname().lower().removesuffix(".")], bind
    for bind in ("0.0.0.0", "::", "192.168.1.5", "myhost"):
        assert not is_loopback(bind) and checked_hosts(bind) is None, bind
    assert checked_hosts("0.0.0.0", "llm.example.com")[1:] == ["llm.example.com"]
    assert checked_hosts("127.0.0.1", "*") is None
    assert [host_name(h) for h in ("Example.COM:8080", "[::1]:80", "[::1]", "a.b.", "", "x:")] == \
        ["example.com", "::1", "::1", "a.b", "", "x"]


@pytest.mark.parametrize("value, needle", [
    ("", "no name"),
    ("http://llm.example.com", "is not a host name"),
    ("llm.example.com:8080", "is not a host name"),
    ("local,*", "'*' stands alone"),
    ("a..b/c", "is not a host name"),
])
def test_a_wrong_allowed_hosts_is_named(tiny_path, value, needle):
    fail(cli("serve", tiny_path, "--port", str(free_port()), "--allowed-hosts", value), "--allowed-hosts", needle)
