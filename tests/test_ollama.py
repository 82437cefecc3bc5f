"""Ollama's API (/api/...) through ollama's own Python client against a real
server process: the model described as ollama describes one (checked
against gguf-py's reading of the file), chat and generate equal to the
OpenAI routes for the same request and seed, whole and streamed; ollama's
messages render as the OpenAI history they mean; a reply's thinking and
tool calls in ollama's shapes (on token streams made by hand: the random
tiny model writes no harmony by itself); every refused request named, in
ollama's error shape."""
import datetime as dt
import json
import os
import re
from collections import defaultdict
from types import SimpleNamespace

import gguf
import ollama
import pytest
from ollama import ChatResponse, GenerateResponse

from goosedump import __version__
from goosedump.reply import ReplyStream
from goosedump.server.ollama import Shape, pieces, tool_call
from goosedump.server.ollama_params import chat_messages
from test_server import (CTX, HARMONY_REPLY, KEY, MODEL, USER, WEATHER, client, feed_all, httpx, post,  # noqa: F401
                         server)

OPTIONS = {"temperature": 0.8, "top_k": 50, "top_p": 0.95, "seed": 7, "num_predict": 24, "repeat_penalty": 1.1,
           "presence_penalty": 0.2}
# the same request in the OpenAI API's names
OPENAI = dict(temperature=0.8, top_p=0.95, seed=7, max_tokens=24, presence_penalty=0.2,
              extra_body={"top_k": 50, "repetition_penalty": 1.1})


@pytest.fixture(scope="module")
def api(server):
    with ollama.Client(host=server, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as c:
        yield c


def test_the_model_as_ollama_lists_and_shows_it(api, server, tiny_path):
    reader = gguf.GGUFReader(tiny_path)
    params = sum(int(t.n_elements) for t in reader.tensors)
    by_type = defaultdict(int)
    for t in reader.tensors:
        by_type[t.tensor_type.name] += int(t.n_bytes)
    (m,) = api.list().models
    assert m.model == MODEL and m.size == os.path.getsize(tiny_path)
    assert m.details.format == "gguf" and m.details.family == "gpt-oss"
    assert 1e6 <= params < 1e9 and m.details.parameter_size == f"{params / 1e6:.0f}M"
    assert m.details.quantization_level == max(by_type, key=by_type.get)
    (p,) = api.ps().models
    assert p.model == MODEL and p.context_length == CTX and p.size == m.size
    # ollama's CLI shows a digest's first 12 characters (and fails on none), ps "Forever" past 20 years ahead
    assert re.fullmatch("[0-9a-f]{64}", m.digest) and p.digest == m.digest, (m.digest, p.digest)
    assert p.expires_at > dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=21 * 365), p.expires_at
    for name in (MODEL, MODEL + ":latest"):
        s = api.show(name)
        assert s.modelinfo["general.architecture"] == "gpt-oss" and s.modelinfo["general.parameter_count"] == params
        assert s.modelinfo["gpt-oss.block_count"] == int(reader.fields["gpt-oss.block_count"].contents())
        assert {"completion", "tools", "thinking"} <= set(s.capabilities) and s.details == m.details
    with pytest.raises(ollama.ResponseError, match="not found") as e:
        api.show("llama3")
    assert e.value.status_code == 404
    assert httpx.get(server + "/api/version").json() == {"version": __version__}
    assert httpx.get(server + "/").status_code == 200


@pytest.mark.parametrize("think,effort,budget", [(None, "medium", None), (False, "low", 0), ("high", "high", None)])
def test_chat_equals_the_openai_route(api, client, think, effort, budget):
    r = api.chat(model=MODEL, messages=USER, options=OPTIONS, think=think)
    extra = {**OPENAI["extra_body"], **({"reasoning_budget": budget} if budget is not None else {})}
    ref = client.chat.completions.create(model=MODEL, messages=USER, reasoning_effort=effort,
                                         **{**OPENAI, "extra_body": extra})
    assert r.message.role == "assistant" and r.message.content == ref.choices[0].message.content
    assert r.message.content and r.message.thinking is None and not r.message.tool_calls
    assert (r.prompt_eval_count, r.eval_count) == (ref.usage.prompt_tokens, ref.usage.completion_tokens)
    assert r.done and r.done_reason == ref.choices[0].finish_reason == "length"
    assert r.total_duration >= r.prompt_eval_duration + r.eval_duration > 0
    chunks = list(api.chat(model=MODEL, messages=USER, options=OPTIONS, think=think, stream=True))
    assert "".join(c.message.content for c in chunks) == r.message.content
    assert [c.done for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert (chunks[-1].eval_count, chunks[-1].done_reason) == (r.eval_count, "length")


def test_generate_equals_completions_and_chat(api, client, tiny_model):
    prompt = "The capital of France is"
    r = api.generate(model=MODEL, prompt=prompt, raw=True, options=OPTIONS)
    ref = client.completions.create(model=MODEL, prompt=prompt, **OPENAI)
    assert r.response == ref.choices[0].text and r.eval_count == ref.usage.completion_tokens
    ids = tiny_model.tokenizer.encode(prompt, allow_special=True)
    assert r.context[:len(ids)] == ids and len(r.context) == len(ids) + r.eval_count
    streamed = list(api.generate(model=MODEL, prompt=prompt, raw=True, options=OPTIONS, stream=True))
    assert "".join(c.response for c in streamed) == r.response and streamed[-1].context == r.context
    # the context carries on: what follows it continues the same tokens
    more = api.generate(model=MODEL, prompt=" And", context=r.context, raw=True, options=OPTIONS)
    ref = client.completions.create(model=MODEL, prompt=r.context + tiny_model.tokenizer.encode(" And"), **OPENAI)
    assert more.response == ref.choices[0].text
    # not raw: the prompt is a user turn, the system field its instructions, as the chat renders them
    messages = [{"role": "system", "content": "Be brief."}] + USER
    g = api.generate(model=MODEL, prompt=USER[0]["content"], system="Be brief.", options=OPTIONS)
    c = api.chat(model=MODEL, messages=messages, options=OPTIONS)
    assert g.response == c.message.content and g.context[:g.prompt_eval_count] == tiny_model.render_chat(messages)


def test_stop_strings_and_logprobs(api, client):
    greedy = {"temperature": 0, "num_predict": 40}
    text = api.chat(model=MODEL, messages=USER, options=greedy).message.content
    k = next(k for k in range(len(text) // 2, len(text) - 4) if text.find(text[k:k + 4]) == k and text[k:k + 4].strip())
    stop = text[k:k + 4]
    r = api.chat(model=MODEL, messages=USER, options={**greedy, "stop": [stop]})
    assert r.message.content == text[:k] and r.done_reason == "stop"
    streamed = list(api.chat(model=MODEL, messages=USER, options={**greedy, "stop": [stop]}, stream=True))
    assert "".join(c.message.content for c in streamed) == text[:k]
    # log-probabilities: the OpenAI route's, whole and streamed
    r = api.chat(model=MODEL, messages=USER, options={**greedy, "num_predict": 16}, logprobs=True, top_logprobs=3)
    ref = client.chat.completions.create(model=MODEL, messages=USER, temperature=0, max_tokens=16, logprobs=True,
                                         top_logprobs=3).choices[0].logprobs.content
    assert [(e.token, e.logprob) for e in r.logprobs] == [(e.token, e.logprob) for e in ref]
    assert [[(a.token, a.logprob) for a in e.top_logprobs] for e in r.logprobs] == \
        [[(a.token, a.logprob) for a in e.top_logprobs] for e in ref]
    chunks = api.chat(model=MODEL, messages=USER, options={**greedy, "num_predict": 16}, logprobs=True, stream=True)
    assert [e.logprob for c in chunks for e in c.logprobs or []] == [e.logprob for e in ref]


def test_ollama_history_renders_as_the_openai_history(tiny_model):
    time_tool = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    tools = [WEATHER, time_tool]
    mine = [{"role": "system", "content": "Be brief."}, *USER,
            {"role": "assistant", "content": "", "thinking": "Call the tools.",
             "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                            {"function": {"name": "get_time", "arguments": {}}}]},
            {"role": "tool", "content": "20 C", "tool_name": "get_weather"},
            {"role": "tool", "content": "noon"}]          # no tool_name: the call not yet answered
    theirs = [{"role": "system", "content": "Be brief."}, *USER,
              {"role": "assistant", "content": None, "reasoning_content": "Call the tools.",
               "tool_calls": [{"id": "a", "type": "function",
                               "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                              {"id": "b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
              {"role": "tool", "tool_call_id": "a", "content": "20 C"},
              {"role": "tool", "tool_call_id": "b", "content": "noon"}]
    ids = tiny_model.render_chat(chat_messages(mine), tools=tools)
    assert ids == tiny_model.render_chat(theirs, tools=tools)
    assert "<|start|>functions.get_time to=assistant" in tiny_model.tokenizer.decode(ids)
    # results in another order than the calls, each naming its call by tool_call_id (ollama's ids), no tool_name
    mine[2]["tool_calls"] = [{**c, "id": i} for c, i in zip(mine[2]["tool_calls"], ("a", "b"))]
    mine[3:] = [{"role": "tool", "content": "noon", "tool_call_id": "b"},
                {"role": "tool", "content": "20 C", "tool_call_id": "a"}]
    theirs[3:] = theirs[:2:-1]
    assert tiny_model.render_chat(chat_messages(mine), tools=tools) == tiny_model.render_chat(theirs, tools=tools)


def test_thinking_and_tool_calls_in_ollamas_shapes(tiny_model):
    tok = tiny_model.tokenizer
    ids = tok.encode(HARMONY_REPLY, allow_special=True)
    turn = ReplyStream(tok)
    events = feed_all(turn, ids)
    chat, gen = Shape(SimpleNamespace(name="m"), True, True), Shape(SimpleNamespace(name="m"), False, True)
    chunks = [ChatResponse.model_validate(chat.chunk(**p)) for p in pieces(events)]
    assert "".join(c.message.content for c in chunks) == turn.content == "Checking."
    assert "".join(c.message.thinking or "" for c in chunks) == turn.reasoning
    calls = [tc for c in chunks for tc in c.message.tool_calls or []]
    assert [(tc.function.name, dict(tc.function.arguments)) for tc in calls] == [("get_weather", {"city": "Paris"})]
    assert [tool_call(i) for i in turn.items if i.kind == "tool_call"] == [
        {"id": turn.tool_calls[0]["id"],
         "function": {"name": "get_weather", "arguments": json.loads(turn.tool_calls[0]["function"]["arguments"])}}]
    texts = [GenerateResponse.model_validate(gen.chunk(**p)) for p in pieces(events) if "calls" not in p]
    assert "".join(t.response for t in texts) == turn.content
    assert "".join(t.thinking or "" for t in texts) == turn.reasoning
    # think false hides what reasoning there is
    hidden = Shape(SimpleNamespace(name="m"), True, False)
    assert all("thinking" not in hidden.chunk(**p)["message"] for p in pieces(events))
    # a call cut before its arguments end is left out (done_reason says the limit cut the reply)
    cut = ReplyStream(tok)
    assert not [p for p in pieces(feed_all(cut, ids[:-3])) if "calls" in p] and cut.tool_calls


@pytest.mark.parametrize("path,body,phrase", [
    ("/api/chat", {"model": "other", "messages": USER}, "model 'other' not found"),
    ("/api/chat", {"messages": USER, "options": {"temperature": -1}}, "options.temperature must be"),
    ("/api/chat", {"messages": USER, "options": {"repeat_penalty": 0}}, "options.repeat_penalty must be"),
    ("/api/chat", {"messages": USER, "options": {"mirostat": 2}}, "no mirostat sampler"),
    ("/api/chat", {"messages": USER, "options": {"bogus": 1}}, "unknown option 'bogus'"),
    ("/api/chat", {"messages": USER, "options": {"temperature": "hot"}}, "options.temperature: Input should be"),
    ("/api/chat", {"messages": USER, "options": {"seed": 1.5}}, "options.seed: Input should be a valid integer"),
    ("/api/chat", {"messages": USER, "options": {"num_predict": 0}}, "options.num_predict must be"),
    ("/api/chat", {"messages": USER, "options": {"stop": [""]}}, "options.stop must be"),
    ("/api/chat", {"messages": USER, "options": {"repeat_penalty": 1.2, "repeat_last_n": -3}},
     "options.repeat_last_n must be an integer >= -1"),
    ("/api/chat", {"messages": USER, "options": {"repeat_last_n": "64"}}, "options.repeat_last_n"),
    ("/api/chat", {"messages": USER, "think": "max"}, "think must be"),
    ("/api/chat", {"messages": USER, "format": "yaml"}, "format must be"),
    ("/api/chat", {"messages": USER, "top_logprobs": 2}, "top_logprobs needs logprobs"),
    ("/api/chat", {"messages": USER, "logprobs": True, "top_logprobs": 21}, "top_logprobs must be from 0 to 20"),
    ("/api/chat", {"messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}, "reads text only"),
    ("/api/chat", {"messages": [{"role": "tool", "content": "20 C"}]}, "needs the tool_name"),
    ("/api/chat", {"messages": "hi"}, "Invalid 'messages'"),
    ("/api/generate", {"prompt": "hi", "suffix": "x"}, "suffix is not supported"),
    ("/api/generate", {"prompt": "hi", "template": "{{ .Prompt }}"}, "template is not supported"),
    ("/api/generate", {"prompt": "hi", "raw": True, "system": "s"}, "system has no place in a raw prompt"),
    ("/api/generate", {"prompt": "hi", "raw": True, "context": [-1]}, "context holds -1"),
    ("/api/show", {"model": "other"}, "model 'other' not found"),
    ("/api/pull", {"model": "other"}, "/api/pull is not supported"),
    ("/api/nothing", {}, "Not Found"),
])
def test_refusals_are_named_in_ollamas_shape(server, path, body, phrase):
    r = post(server, path, {**body, "stream": False})
    # an unknown model or route 404, an endpoint this server does not offer 501, the rest the request's fault
    expect = 404 if "not found" in phrase.lower() else 501 if path == "/api/pull" else 400
    assert r.status_code == expect, r.text
    assert set(r.json()) == {"error"} and phrase in r.json()["error"], r.json()


def test_the_model_management_routes_answer_501_through_ollamas_client(api):
    """pull, push, create, copy and delete, as ollama's own client sends them
    (delete is a DELETE: it had met a 405 Method Not Allowed)."""
    calls = {"pull": lambda: api.pull("other"), "push": lambda: api.push("other"),
             "create": lambda: api.create("other", from_="tiny"), "copy": lambda: api.copy("tiny", "other"),
             "delete": lambda: api.delete("other")}
    for name, call in calls.items():
        with pytest.raises(ollama.ResponseError) as e:
            call()
        assert e.value.status_code == 501 and f"/api/{name} is not supported" in e.value.error, (name, e.value)


def test_the_api_key_guards_ollamas_routes_too(server):
    r = post(server, "/api/chat", {"messages": USER}, key=None)
    assert r.status_code == 401 and r.json() == {"error": "No API key given: send the header "
                                                          "'Authorization: Bearer YOUR_KEY'."}
    assert httpx.get(server + "/api/tags", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_repeat_last_n_0_and_mirostat_settings(api, client):
    """repeat_last_n: llama.cpp's window for the three penalties, 0 turning
    them off; and mirostat_tau/eta, which clients send with ollama's
    defaults, change nothing while mirostat is off."""
    prompt = "The capital of France is"
    plain = {k: v for k, v in OPTIONS.items() if k not in ("repeat_penalty", "presence_penalty")}
    off = api.generate(model=MODEL, prompt=prompt, raw=True,
                       options={**OPTIONS, "presence_penalty": 1.5, "frequency_penalty": 1.0, "repeat_last_n": 0})
    assert off.response == api.generate(model=MODEL, prompt=prompt, raw=True, options=plain).response
    kw = {k: v for k, v in OPENAI.items() if k not in ("presence_penalty", "extra_body")}
    assert off.response == client.completions.create(model=MODEL, prompt=prompt, **kw,
                                                     extra_body={"top_k": 50}).choices[0].text
    # a window of 64, as ollama's and llama.cpp's default: the OpenAI route's extension gives the same tokens
    windowed = {**OPTIONS, "repeat_last_n": 64, "frequency_penalty": 0.5}
    got = api.generate(model=MODEL, prompt=prompt, raw=True, options=windowed).response
    assert got == client.completions.create(model=MODEL, prompt=prompt, **{**OPENAI, "extra_body": {
        **OPENAI["extra_body"], "repeat_last_n": 64}}, frequency_penalty=0.5).choices[0].text
    assert got != api.generate(model=MODEL, prompt=prompt, raw=True,
                               options={**windowed, "repeat_last_n": 1}).response
    tuned = api.generate(model=MODEL, prompt=prompt, raw=True,
                         options={**OPTIONS, "mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1})
    assert tuned.response == api.generate(model=MODEL, prompt=prompt, raw=True, options=OPTIONS).response


def test_a_limit_past_the_context_is_a_most(api, server):
    """ollama reads num_predict as a most: past what the context leaves, the
    reply stops where the context is full (done_reason length), not a 400;
    a null stop is no stop, as every null option is unset."""
    r = api.chat(model=MODEL, messages=USER, options={"temperature": 0, "num_predict": 10 ** 6})
    assert r.done_reason == "length" and r.prompt_eval_count + r.eval_count == CTX, r
    g = api.generate(model=MODEL, prompt="Once upon a time", raw=True, options={"temperature": 0, "num_predict": 4096,
                                                                               "stop": None})
    assert g.done_reason == "length" and g.prompt_eval_count + g.eval_count == CTX, g
    assert api.generate(model=MODEL, prompt="Once", options={"num_predict": 2, "stop": None}).eval_count == 2


def test_raw_logprobs_end_with_the_tokens_a_stop_string_kept(api):
    """The engine may make a token or more past a stop string before it
    hears of it: raw generate's log-probabilities are those of the tokens
    returned (the context's), whole and streamed."""
    greedy = {"temperature": 0, "num_predict": 40}
    text = api.generate(model=MODEL, prompt="Once upon a time", raw=True, options=greedy).response
    k = next(k for k in range(len(text) // 2, len(text) - 4) if text.find(text[k:k + 4]) == k and text[k:k + 4].strip())
    opts = {**greedy, "stop": [text[k:k + 4]]}
    r = api.generate(model=MODEL, prompt="Once upon a time", raw=True, options=opts, logprobs=True)
    assert r.response == text[:k] and r.done_reason == "stop"
    assert len(r.logprobs) == r.eval_count == len(r.context) - r.prompt_eval_count, (len(r.logprobs), r.eval_count)
    chunks = list(api.generate(model=MODEL, prompt="Once upon a time", raw=True, options=opts, logprobs=True,
                               stream=True))
    assert sum(len(c.logprobs or []) for c in chunks) == chunks[-1].eval_count == r.eval_count


def test_metadata_json_cannot_hold_and_a_string_flag(tmp_path, small_vocab):
    """A float key that is NaN answers /api/show with null there (it had
    been a 500 for the whole answer); add_bos_token written as the string
    "false" adds no BOS on /tokenize (llama.cpp reads the key as a bool)."""
    from starlette.testclient import TestClient

    from goosedump import load, synth
    from goosedump.gguf import ValueType
    from goosedump.server.app import create_app

    def edit(kv, tensors):
        kv.append(("general.some_ratio", ValueType.FLOAT32, float("nan"), None))
        kv.append(("tokenizer.ggml.add_bos_token", ValueType.STRING, "false", None))
    path = tmp_path / "odd.gguf"
    synth.write_model(path, "tiny", seed=1, vocab=small_vocab, edit=edit)
    m = load(path)
    with TestClient(create_app(m, model_name="odd")) as c:
        r = c.post("/api/show", json={"model": "odd"})
        assert r.status_code == 200 and r.json()["model_info"]["general.some_ratio"] is None, r.text
        r = c.post("/tokenize", json={"content": "hi", "add_special": True})
        assert r.json()["tokens"] == m.tokenizer.encode("hi"), (r.json(), m.tokenizer.bos_id)
