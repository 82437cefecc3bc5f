"""goosedump serve: the OpenAI-compatible server, through the official openai
client against a real server process on loopback, plus unit tests of the
reply building (the random tiny model never writes tool calls or reasoning
by itself, so those paths are tested on token streams made by hand)."""
import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pydantic
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent

from goosedump.harmony import HarmonyParser
from goosedump.reply import ReplyStream, StopFilter, reply_from_messages
from goosedump.sampling import GREEDY
from goosedump.server.chat_completions import ChatDeltas, chat_message
from goosedump.server.params import finish_reason, forced_call_header
from goosedump.server.responses import ResponseEvents, responses_messages
from goosedump.server.schemas import ResponsesBody

try:
    import httpx
except ImportError:                 # the openai client's fork of it
    import httpx2 as httpx

KEY = "test-key-123"
CTX = 512
MODEL = "tiny"
USER = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Gets the weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
RETURN, CALL = 200002, 200012          # <|return|> and <|call|> in o200k_harmony
STREAM_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)


# --- the server process -----------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """`python -m goosedump.server MODEL` with extra flags on a free port,
    answering /health; its output in `log`."""

    def __init__(self, tiny_path, log, *extra, env=None):
        self.port, self.log = free_port(), log
        self.base = f"http://127.0.0.1:{self.port}"
        with open(log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "goosedump.server", tiny_path, "--port", str(self.port),
                                          "--ctx", str(CTX), "--threads", "1", "--model-name", MODEL, *extra],
                                         stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"the server exited ({self.proc.returncode}):\n{log.read_text()}")
            try:
                if httpx.get(self.base + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"the server did not answer /health in 60 s:\n{log.read_text()}")
            time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def server(tiny_path, tmp_path_factory):
    """The server on a free port, its API key from the environment (the
    --api-key default)."""
    s = Served(tiny_path, tmp_path_factory.mktemp("server") / "server.log", "--log-level", "warning",
               env={**os.environ, "GOOSEDUMP_API_KEY": KEY})
    try:
        yield s.base
    finally:
        s.stop()


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0, timeout=60) as c:
        yield c


def post(server, path, body=None, key=KEY, content=None, timeout=60):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(server + path, json=body, content=content, headers=headers, timeout=timeout)


def metrics(server) -> dict[str, float]:
    text = httpx.get(server + "/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def sse_events(server, path, body) -> list[dict]:
    with httpx.stream("POST", server + path, json=body, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=60) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln[len("data: "):] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]" or path == "/v1/responses"
    return [json.loads(x) for x in lines if x != "[DONE]"]


def joined_stream(stream) -> tuple[str, str, list, str | None, object]:
    """(content, reasoning_content, tool calls, finish_reason, usage) of a
    chat stream, merged as a client merges them."""
    content, reasoning, calls, finish, usage = [], [], {}, None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            d = choice.delta
            content.append(d.content or "")
            reasoning.append(getattr(d, "reasoning_content", None) or "")
            for tc in d.tool_calls or []:
                c = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                c["id"] = tc.id or c["id"]
                c["name"] += (tc.function.name or "") if tc.function else ""
                c["arguments"] += (tc.function.arguments or "") if tc.function else ""
            finish = choice.finish_reason or finish
    return "".join(content), "".join(reasoning), [calls[i] for i in sorted(calls)], finish, usage


# --- unit: replies built from token streams ------------------------------------------

HARMONY_REPLY = ("<|channel|>analysis<|message|>The user wants the weather. ¡Olé! 日本<|end|>"
                 "<|start|>assistant<|channel|>analysis<|message|>Call the tool.<|end|>"
                 "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
                 "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
                 '{"city": "Paris"}')       # then <|call|>, which the engine does not pass on


def feed_all(turn: ReplyStream, tokens) -> list[tuple]:
    events = []
    for t in tokens:
        events += turn.feed(t)
    return events + turn.close()


def test_reply_stream_splits_a_reply_like_reply_from_messages(tiny_model):
    tok = tiny_model.tokenizer
    ids = tok.encode(HARMONY_REPLY, allow_special=True)
    turn = ReplyStream(tok)
    events = feed_all(turn, ids)
    parser = HarmonyParser(tok)
    for t in ids:
        parser.feed(t)
    ref = reply_from_messages(parser.close())
    assert turn.content == ref.content == "Checking."
    assert turn.reasoning == ref.reasoning_content == "The user wants the weather. ¡Olé! 日本\nCall the tool."
    assert [c["function"] for c in turn.tool_calls] == [c["function"] for c in ref.tool_calls] == [
        {"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    assert [i.kind for i in turn.items] == ["reasoning", "reasoning", "content", "tool_call"]
    # every item starts, streams its text and ends, in order
    for item in turn.items:
        mine = [(w, t) for w, i, t in events if i is item]
        assert mine[0] == ("start", "") and mine[-1] == ("end", "")
        assert "".join(t for w, t in mine if w == "delta") == item.text
    assert turn.reasoning_tokens > 0


def test_reply_stream_on_generated_tokens_equals_reply_from_messages(tiny_model):
    """The random model's output (no harmony structure, split UTF-8) split the
    same way, streamed or not."""
    for n in (5, 60):
        r = tiny_model.chat(USER, max_tokens=n, sampling=GREEDY)
        turn = ReplyStream(tiny_model.tokenizer)
        events = feed_all(turn, r.result.token_ids)
        assert (turn.content, turn.reasoning) == (r.reply.content, r.reply.reasoning_content)
        merged = {"content": "", "reasoning_content": ""}
        for d in ChatDeltas()(events):
            for k, v in d.items():
                merged[k] += v
        assert merged == {"content": r.reply.content, "reasoning_content": r.reply.reasoning_content}


def test_tool_call_reply_as_chat_message_and_stream(tiny_model):
    tok = tiny_model.tokenizer
    turn = ReplyStream(tok)
    events = feed_all(turn, tok.encode(HARMONY_REPLY, allow_special=True))
    msg = chat_message(turn)
    assert msg["role"] == "assistant" and msg["content"] == "Checking."
    assert msg["reasoning_content"] == "The user wants the weather. ¡Olé! 日本\nCall the tool."
    (call,) = msg["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert finish_reason("eos", turn.stopped, bool(turn.tool_calls)) == "tool_calls"
    # the stream's deltas, merged as a client does, give the same message
    deltas = ChatDeltas()(events)
    chunks = [ChatCompletionChunk.model_validate(
        {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
         "choices": [{"index": 0, "delta": d, "finish_reason": None}]}) for d in deltas]
    content, reasoning, calls, _, _ = joined_stream(chunks)
    assert (content, reasoning) == (msg["content"], msg["reasoning_content"])
    assert calls == [{"id": call["id"], "name": "get_weather", "arguments": call["function"]["arguments"]}]
    # the history the client sends back renders as the model wrote it
    again = tiny_model.render_chat(USER + [msg, {"role": "tool", "tool_call_id": call["id"], "content": "20 C"}],
                                   tools=[WEATHER])
    assert tok.decode(again).endswith('<|start|>functions.get_weather to=assistant<|channel|>commentary'
                                      '<|message|>20 C<|end|><|start|>assistant')


def test_forced_tool_call_header_puts_the_parser_in_the_arguments(tiny_model):
    tok = tiny_model.tokenizer
    prefix = forced_call_header(tok, "get_weather")
    turn = ReplyStream(tok, prefix=prefix)
    events = feed_all(turn, tok.encode('{"city": "Oslo"}'))
    assert events[0][0] == "start" and events[0][1].kind == "tool_call"
    assert turn.tool_calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    # nothing generated after the header (a <|call|> at once): still one call, empty arguments
    turn = ReplyStream(tok, prefix=prefix)
    assert [w for w, _, _ in turn.close()] == ["start", "end"]
    assert turn.tool_calls[0]["function"] == {"name": "get_weather", "arguments": ""}


def test_stop_filter_holds_back_a_possible_stop():
    f = StopFilter(["END", "xyz"])
    assert f.push("abc E") == "abc "           # "E" may begin END
    assert f.push("N") == ""
    assert f.push("Dgame") == "" and f.hit
    f = StopFilter(["END"])
    assert f.push("abc EN") == "abc " and f.push("o") == "ENo" and not f.hit
    assert f.push("x E") + f.flush() == "x E"
    f = StopFilter(["lo w"])
    assert [f.push(p) for p in ["hel", "lo", " w"]] == ["he", "l", ""] and f.hit


def test_reply_stream_stop_string_cuts_content(tiny_model):
    tok = tiny_model.tokenizer
    text = ("<|channel|>analysis<|message|>think STOP here<|end|>"
            "<|start|>assistant<|channel|>final<|message|>Paris. STOP more")
    turn = ReplyStream(tok, stop=["STOP"])
    events = []
    for t in tok.encode(text, allow_special=True):
        events += turn.feed(t)
        if turn.stopped:
            break
    assert turn.stopped and turn.content == "Paris. " and turn.reasoning == "think STOP here"
    assert all(i.done for i in turn.items) and turn.close() == []
    assert finish_reason("cancelled", turn.stopped) == "stop"


def test_finish_reasons():
    assert finish_reason("eos", False) == "stop"
    assert finish_reason("eos", False, tool_calls=True) == "tool_calls"
    assert finish_reason("max_tokens", False) == "length"
    assert finish_reason("repetition", False) == "repetition"
    assert finish_reason("time_budget", False) == "time_budget"


def test_responses_events_have_the_official_shapes(tiny_model):
    tok = tiny_model.tokenizer
    turn = ReplyStream(tok)
    ev = ResponseEvents()
    sse = ev.items(feed_all(turn, tok.encode(HARMONY_REPLY, allow_special=True)))
    events = [json.loads(s.split("data: ", 1)[1]) for s in sse]
    for e, s in zip(events, sse):
        assert s.startswith(f"event: {e['type']}\n")
        STREAM_EVENT.validate_python(e)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    types = [e["type"] for e in events]
    reasoning = ["response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
                 "response.reasoning_text.done", "response.content_part.done", "response.output_item.done"]
    dedup = [t for i, t in enumerate(types) if i == 0 or t != types[i - 1]]
    assert dedup == reasoning * 2 + [
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done"]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done[3] == {"id": turn.items[3].id, "type": "function_call", "call_id": turn.items[3].call_id,
                       "name": "get_weather", "arguments": '{"city": "Paris"}', "status": "completed"}
    assert done[2]["content"][0]["text"] == "Checking."


def test_responses_input_items_become_messages():
    body = ResponsesBody(input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "Use the tool."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "20 C"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is 20 C."}]},
        {"role": "user", "content": "Thanks"}], instructions="Be brief.")
    messages, sources = responses_messages(body)
    # where each came from, for errors (the assistant turn from its first item, the reasoning)
    assert sources == ["instructions", "input[0]", "input[1]", "input[3]", "input[4]", "input[5]"]
    assert messages == [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"role": "assistant", "content": "", "reasoning_content": "Use the tool.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "20 C"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "It is 20 C."}]},
        {"role": "user", "content": "Thanks"}]


# --- end to end: the openai client against the server ---------------------------------

def test_health_metrics_and_models(server, client):
    r = httpx.get(server + "/health")          # open without the key
    assert r.status_code == 200 and r.json() == {"status": "ok", "model": MODEL}
    assert httpx.get(server + "/metrics").status_code == 200
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).owned_by == "goosedump"


def test_api_key_required(server):
    for key in (None, "wrong"):
        for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions")):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            r = httpx.request(method, server + path, headers=headers, json={"messages": USER})
            assert r.status_code == 401, (key, path)
            assert r.json()["error"]["code"] == "invalid_api_key"
    with openai.OpenAI(base_url=server + "/v1", api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model=MODEL, messages=USER, max_tokens=2)


def test_chat_equals_the_engine_and_counts_tokens(client, tiny_model):
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=24, temperature=0)
    ChatCompletion.model_validate(r.model_dump())
    ref = tiny_model.chat(USER, max_tokens=24, sampling=GREEDY)
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == ref.reply.content and choice.message.content
    assert getattr(choice.message, "reasoning_content", None) in (None, ref.reply.reasoning_content or None)
    assert choice.finish_reason == "length"
    assert r.usage.prompt_tokens == len(tiny_model.render_chat(USER)) == ref.result.prompt_tokens
    assert r.usage.completion_tokens == 24 == ref.result.generated_tokens
    assert r.usage.total_tokens == r.usage.prompt_tokens + 24
    assert 0 <= r.usage.prompt_tokens_details.cached_tokens < r.usage.prompt_tokens
    # the same conversation again: its prefix comes from the KV cache
    again = client.chat.completions.create(model=MODEL, messages=USER, max_completion_tokens=24, temperature=0)
    assert again.choices[0].message.content == choice.message.content
    assert again.usage.prompt_tokens_details.cached_tokens > 0


def test_chat_stream_equals_plain(client):
    kw = dict(model=MODEL, messages=USER, max_tokens=70, temperature=0, reasoning_effort="low")
    plain = client.chat.completions.create(**kw)
    stream = client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    for c in chunks:
        ChatCompletionChunk.model_validate(c.model_dump())
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    content, reasoning, calls, finish, usage = joined_stream(chunks)
    msg = plain.choices[0].message
    assert content == msg.content and reasoning == (getattr(msg, "reasoning_content", None) or "")
    assert len(content) > 20 and calls == []
    assert finish == plain.choices[0].finish_reason == "length"
    assert (usage.prompt_tokens, usage.completion_tokens) == (plain.usage.prompt_tokens, 70)
    # without include_usage, no usage chunk
    assert all(c.usage is None for c in client.chat.completions.create(**kw, stream=True))


def test_same_seed_same_text(client):
    kw = dict(model=MODEL, messages=USER, max_tokens=12, temperature=1.0, top_p=0.95)
    a, b, c = (client.chat.completions.create(**kw, seed=s).choices[0].message.content for s in (7, 7, 8))
    assert a == b and a != c
    # -1 asks for a fresh seed, as llama.cpp's server reads it
    assert client.chat.completions.create(**kw, seed=-1).choices[0].message.content


def test_stop_strings(client):
    kw = dict(model=MODEL, messages=USER, max_tokens=60, temperature=0)
    full = client.chat.completions.create(**kw).choices[0].message.content
    stop = full[20:24]
    want = full[:full.find(stop)]
    r = client.chat.completions.create(**kw, stop=[stop, "never-there"])
    assert r.choices[0].message.content == want and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 60
    content, _, _, finish, _ = joined_stream(client.chat.completions.create(**kw, stop=stop, stream=True))
    assert (content, finish) == (want, "stop")
    # the same on raw completions
    kw = dict(model=MODEL, prompt="The capital of France is", max_tokens=40, temperature=0)
    text = client.completions.create(**kw).choices[0].text
    stop = text[15:18]
    r = client.completions.create(**kw, stop=stop)
    assert r.choices[0].text == text[:text.find(stop)] and r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kw, stop=stop, stream=True))
    assert streamed == r.choices[0].text


def test_completions_equal_the_engine(client, tiny_model):
    prompt = "<|start|>user<|message|>Hello<|end|><|start|>assistant"   # special tokens are read as such
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0)
    ref = tiny_model.generate(prompt, max_tokens=20)
    assert r.choices[0].text == ref.text and r.object == "text_completion"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (ref.prompt_tokens, 20)
    assert r.choices[0].finish_reason == "length"
    ids = tiny_model.tokenizer.encode(prompt, allow_special=True)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=20, temperature=0)
    assert by_ids.choices[0].text == ref.text
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ref.text
    assert chunks[-1].usage.completion_tokens == 20


def test_logit_bias_forces_and_forbids_tokens(client, tiny_model):
    tok = tiny_model.tokenizer
    x = tok.encode(" Paris")[0]
    r = client.completions.create(model=MODEL, prompt="Hi", max_tokens=3, temperature=0, logit_bias={str(x): 100})
    assert r.choices[0].text == tok.decode([x] * 3)
    plain = client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, temperature=0).choices[0].text
    first = tiny_model.generate("Hi", max_tokens=1).token_ids[0]
    assert plain == tiny_model.generate("Hi", max_tokens=4).text
    banned = client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, temperature=0,
                                       logit_bias={str(first): -100}).choices[0].text
    assert banned != plain
    # an immediate <|return|>: an empty answer that ends by itself
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=5, temperature=0,
                                       logit_bias={str(RETURN): 100})
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content == ""
    assert r.usage.completion_tokens == 0


def test_tool_conversation_is_accepted(client, tiny_model):
    messages = USER + [
        {"role": "assistant", "content": None, "reasoning_content": "Need the weather.",
         "tool_calls": [{"id": "call_9", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_9", "content": '{"temp_c": 20}'}]
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], max_tokens=8, temperature=0)
    assert r.usage.prompt_tokens == len(tiny_model.render_chat(messages, tools=[WEATHER]))
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.content
    # tool_choice "none" renders no tools
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], tool_choice="none",
                                       max_tokens=2, temperature=0)
    assert r.usage.prompt_tokens == len(tiny_model.render_chat(messages))


def test_tool_choice_forces_the_call(client, tiny_model):
    header = forced_call_header(tiny_model.tokenizer, "get_weather")
    n_prompt = len(tiny_model.render_chat(USER, tools=[WEATHER])) + len(header)
    for choice in ({"type": "function", "function": {"name": "get_weather"}}, "required"):
        r = client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER], tool_choice=choice,
                                           max_tokens=6, temperature=0)
        (call,) = r.choices[0].message.tool_calls
        assert call.function.name == "get_weather" and call.id.startswith("call_")
        assert r.choices[0].finish_reason == "length" and r.usage.prompt_tokens == n_prompt
    # the model ends the call at once (<|call|>): finish_reason tool_calls, streamed alike
    kw = dict(model=MODEL, messages=USER, tools=[WEATHER], tool_choice="required", max_tokens=6, temperature=0,
              logit_bias={str(CALL): 100})
    r = client.chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
    assert r.choices[0].message.tool_calls[0].function.arguments == ""
    content, _, calls, finish, _ = joined_stream(client.chat.completions.create(**kw, stream=True))
    assert finish == "tool_calls" and [c["name"] for c in calls] == ["get_weather"] and content == ""


def test_responses_plain_and_streamed(server, client):
    chat_text = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=20, temperature=0).choices[0].message.content
    r = client.responses.create(model=MODEL, input="hi", max_output_tokens=20, temperature=0)
    Response.model_validate(r.model_dump())
    assert r.output_text == chat_text and r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens"
    assert (r.usage.output_tokens, r.usage.input_tokens) == (20, r.usage.total_tokens - 20)
    events = sse_events(server, "/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 20,
                                                  "temperature": 0, "stream": True})
    for e in events:
        STREAM_EVENT.validate_python(e)
    types = [e["type"] for e in events]
    assert types[:5] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == chat_text
    final = Response.model_validate(events[-1]["response"])
    assert final.output_text == chat_text and final.usage.output_tokens == 20
    assert final.output[0].status == "incomplete"


def test_responses_stream_helper_and_function_calls(client):
    """The client's own stream state machine (it checks item identities)
    over a response that completes, and a forced function call."""
    with client.responses.stream(model=MODEL, input="hi", extra_body={"logit_bias": {str(RETURN): 100}}) as s:
        types = [e.type for e in s]
        final = s.get_final_response()
    assert types == ["response.created", "response.in_progress", "response.completed"]
    assert final.status == "completed" and final.output == []
    # (strict false: the Responses API makes a tool strict by default, whose arguments cannot be empty)
    tool = {"type": "function", "name": "get_weather", "description": "Weather.",
            "parameters": WEATHER["function"]["parameters"], "strict": False}
    with client.responses.stream(model=MODEL, input="Weather in Paris?", tools=[tool],
                                 tool_choice={"type": "function", "name": "get_weather"},
                                 extra_body={"logit_bias": {str(CALL): 100}}) as s:
        types = [e.type for e in s]
        final = s.get_final_response()
    assert "response.function_call_arguments.done" in types
    (call,) = final.output
    assert (call.type, call.name, call.arguments, call.status) == ("function_call", "get_weather", "", "completed")
    # a whole tool loop sent back as input items is accepted
    r = client.responses.create(model=MODEL, tools=[tool], max_output_tokens=4, temperature=0, input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "Use the tool."}]},
        {"type": "function_call", "call_id": call.call_id, "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call_output", "call_id": call.call_id, "output": "20 C"}])
    assert r.status == "incomplete" and r.usage.output_tokens == 4


ERRORS = [
    # (endpoint, body, status, param, code)
    ("/v1/chat/completions", {"model": "gpt-4o", "messages": USER}, 404, "model", "model_not_found"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages", None),
    ("/v1/chat/completions", {"messages": "hello"}, 400, "messages", None),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages", None),
    ("/v1/chat/completions", {"messages": USER, "temperature": "hot"}, 400, "temperature", None),
    ("/v1/chat/completions", {"messages": USER, "temperature": 500}, 400, "temperature", None),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": "many"}, 400, "max_tokens", None),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 0}, 400, "max_tokens", "integer_below_min_value"),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": CTX}, 400, "max_tokens", "context_length_exceeded"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 600}], "max_tokens": 5},
     400, "messages", "context_length_exceeded"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 600}]},
     400, "messages", "context_length_exceeded"),
    ("/v1/chat/completions", {"messages": USER, "n": 9}, 400, "n", None),
    ("/v1/chat/completions", {"messages": USER, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", None),
    ("/v1/chat/completions", {"messages": USER, "logit_bias": {"999999999": 5}}, 400, "logit_bias", None),
    ("/v1/chat/completions", {"messages": USER, "logit_bias": {"x": 5}}, 400, "logit_bias", None),
    ("/v1/chat/completions", {"messages": USER, "reasoning_effort": "extreme"}, 400, "reasoning_effort", None),
    ("/v1/chat/completions", {"messages": USER, "tools": [WEATHER], "tool_choice": {
        "type": "function", "function": {"name": "nope"}}}, 400, "tool_choice", None),
    ("/v1/chat/completions", {"messages": USER, "tools": [{"type": "web_search"}]}, 400, "tools", None),
    ("/v1/chat/completions", {"messages": USER, "time_budget": -1}, 400, "time_budget", None),
    ("/v1/chat/completions", {"messages": USER, "seed": -5}, 400, "seed", None),
    # llama-server's and vLLM's samplers goosedump has not, turned on: refused by name, not ignored
    ("/v1/chat/completions", {"messages": USER, "typical_p": 0.2}, 400, "typical_p", None),
    ("/v1/completions", {"prompt": "x", "mirostat": 2}, 400, "mirostat", None),
    ("/v1/completions", {"prompt": "x", "dry_multiplier": 0.8}, 400, "dry_multiplier", None),
    ("/v1/responses", {"input": "x", "xtc_probability": 0.5}, 400, "xtc_probability", None),
    ("/v1/chat/completions", {"messages": USER, "ignore_eos": True}, 400, "ignore_eos", None),
    ("/v1/chat/completions", {"messages": USER, "ignore_eos": 0}, 400, "ignore_eos", None),
    ("/v1/completions", {"prompt": ""}, 400, "prompt", None),
    ("/v1/completions", {"prompt": [5, 10 ** 7]}, 400, "prompt", None),
    ("/v1/completions", {"prompt": "x", "max_tokens": -3}, 400, "max_tokens", "integer_below_min_value"),
    ("/v1/responses", {"input": [{"type": "image_generation_call"}]}, 400, "input", None),
    ("/v1/responses", {"input": "hi", "previous_response_id": "resp_1"}, 400, "previous_response_id", None),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 10 ** 6}, 400, "max_output_tokens",
     "context_length_exceeded"),
]


@pytest.mark.parametrize("path,body,status,param,code", ERRORS)
def test_bad_requests_get_openai_errors(server, path, body, status, param, code):
    r = post(server, path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["message"]
    assert (err["param"], err["code"]) == (param, code), err
    if code != "context_length_exceeded" and param:
        assert param in err["message"]


def test_malformed_json_and_unknown_routes(server):
    for content in (b"{not json", b"[1, 2]", b""):
        r = post(server, "/v1/chat/completions", content=content)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = post(server, "/v1/nothing-here", {})
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_errors_through_the_client(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=USER)
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 600}])
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=USER, max_tokens=0)
    assert e.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[])


def test_concurrent_clients_each_get_their_own_answer(client):
    prompts = [f"Question number {i}: what is {i} times {i + 3}?" for i in range(6)]

    def ask(i, stream=False):
        kw = dict(model=MODEL, messages=[{"role": "user", "content": prompts[i]}], max_tokens=12, temperature=0)
        if stream:
            return joined_stream(client.chat.completions.create(**kw, stream=True))[0]
        return client.chat.completions.create(**kw).choices[0].message.content

    alone = [ask(i) for i in range(len(prompts))]
    assert len(set(alone)) == len(alone)
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda i: ask(i, stream=i % 2 == 1), range(len(prompts))))
    assert together == alone


def test_disconnect_stops_the_generation(server, client):
    before = metrics(server)
    body = {"model": MODEL, "messages": USER, "max_tokens": 400, "temperature": 1.0, "seed": 5, "stream": True}
    with httpx.stream("POST", server + "/v1/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as r:
        n = 0
        for line in r.iter_lines():
            n += line.startswith("data: ")
            if n == 2:           # the role, then the first text
                break
    closed = time.monotonic()
    key = 'goosedump_generations_total{reason="disconnected"}'
    while metrics(server).get(key, 0) == before.get(key, 0):
        assert time.monotonic() - closed < 5, "the generation did not stop after the client left"
        time.sleep(0.05)
    after = metrics(server)
    generated = after["goosedump_generated_tokens_total"] - before["goosedump_generated_tokens_total"]
    assert 0 < generated < 400
    t = time.monotonic()
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=4, temperature=0)
    assert r.usage.completion_tokens == 4 and time.monotonic() - t < 5
    # a plain (not streamed) request whose client gives up is stopped too
    before = after
    with pytest.raises(httpx.TimeoutException):
        post(server, "/v1/chat/completions", {**body, "stream": False}, timeout=0.5)
    gave_up = time.monotonic()
    while metrics(server).get(key, 0) == before[key]:
        assert time.monotonic() - gave_up < 5, "the generation did not stop after the client left"
        time.sleep(0.05)
    generated = metrics(server)["goosedump_generated_tokens_total"] - before["goosedump_generated_tokens_total"]
    assert 0 < generated < 400


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "x", "max_tokens": 200, "stop": [""]}),
    ("/v1/completions", {"prompt": ["x", "y"], "max_tokens": 200, "stop": list("abcde")}),
    ("/v1/responses", {"input": "hi", "stop": list("abcde")}),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 200, "stop": [""]}),
])
def test_a_refused_stop_list_runs_nothing(server, path, body):
    """The stop strings are checked before the generation is queued: a 400
    had left it running (a batch slot held to its token limit)."""
    before = metrics(server)
    r = post(server, path, {"model": MODEL, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop", r.text
    time.sleep(1.0)
    after = metrics(server)
    assert after["goosedump_generated_tokens_total"] == before["goosedump_generated_tokens_total"]
    assert after["goosedump_active_requests"] == 0 and after["goosedump_queue_length"] == 0


def test_usage_after_a_stop_string_counts_the_tokens_up_to_it(server, client, tiny_model):
    """completion_tokens is the tokens up to the one that completes the
    stop string (the engine may be a step or more ahead when it hears)."""
    prompt = "Once upon a time"
    ids = tiny_model.generate(tiny_model.tokenizer.encode(prompt), 60, reuse_cache=False).token_ids
    text = tiny_model.tokenizer.decode(ids)
    tok, checked = tiny_model.tokenizer, []
    for at in (len(text) // 3, len(text) // 2):
        stop = text[at:at + 3]
        if not stop.strip() or text.find(stop) != at:
            continue
        m = next(m for m in range(1, len(ids) + 1) if stop in tok.decode(ids[:m]))
        # (max_tokens m + 1: the engine ends on its own, a token past the stop, before the stop is heard)
        for stream, limit in ((False, 60), (True, 60), (False, m + 1), (True, m + 1)):
            kw = dict(model=MODEL, prompt=prompt, max_tokens=limit, temperature=0, stop=[stop])
            if stream:
                chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
                got, used = "".join(c.choices[0].text for c in chunks if c.choices), chunks[-1].usage
            else:
                r = client.completions.create(**kw)
                got, used = r.choices[0].text, r.usage
            assert got == text[:at] and used.completion_tokens == m, (stream, limit, at, used)
        checked.append(at)
    assert checked


def test_metrics_count_requests_and_tokens(server, client):
    before = metrics(server)
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=7, temperature=0)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[])
    after = metrics(server)
    ok = 'goosedump_requests_total{endpoint="/v1/chat/completions",status="200"}'
    bad = 'goosedump_requests_total{endpoint="/v1/chat/completions",status="400"}'
    assert after[ok] - before.get(ok, 0) == 1 and after[bad] - before.get(bad, 0) == 1
    assert after["goosedump_generated_tokens_total"] - before["goosedump_generated_tokens_total"] == 7
    assert after["goosedump_prompt_tokens_total"] - before["goosedump_prompt_tokens_total"] == r.usage.prompt_tokens
    cached = "goosedump_prompt_tokens_cached_total"
    assert after[cached] - before.get(cached, 0) == r.usage.prompt_tokens_details.cached_tokens
    stopped = 'goosedump_generations_total{reason="max_tokens"}'
    assert after[stopped] - before.get(stopped, 0) == 1
    assert after["goosedump_tokens_per_second"] > 0
    for name in ("goosedump_expert_cache_hits_total", "goosedump_expert_cache_misses_total",
                 "goosedump_queue_length", "goosedump_active_requests", "goosedump_busy_seconds_total"):
        assert name in after
    assert after["goosedump_queue_length"] == 0 and after["goosedump_active_requests"] == 0


def no_token_left_stream(server, path, tok, fields: dict) -> list:
    """The data events of a stream whose grammar's one token ("q") a
    -Infinity bias bans (as Python's JSON reads it): no token is left."""
    q, = tok.encode("q")
    body = json.dumps({**fields, "stream": True, "grammar": 'root ::= "q"', "logit_bias": {str(q): float("-inf")}})
    with httpx.stream("POST", server + path, content=body, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}) as r:
        return [json.loads(ln[len("data: "):]) for ln in r.iter_lines()
                if ln.startswith("data: ") and ln != "data: [DONE]"]


def test_responses_echo_effort_state_and_the_engines_own_stops(server, tiny_model):
    """The Responses object validates as the SDK's Response whatever ended it
    (an engine stop such as time_budget is no API reason: null, goosedump's
    beside it); it echoes what was applied; conversation (stored state) and
    efforts gpt-oss lacks are refused by name; a request error mid-stream is
    an error event and response.failed with invalid_prompt, not server_error."""
    from openai.types.responses import Response as SDKResponse
    base = {"model": MODEL, "input": "Hi", "max_output_tokens": 40, "temperature": 0.5, "top_p": 0.9}
    out = post(server, "/v1/responses", {**base, "time_budget": 1e-6, "parallel_tool_calls": False,
                                         "reasoning": {"effort": "low", "summary": "auto"}}).json()
    SDKResponse.model_validate(out)
    assert out["status"] == "incomplete" and out["incomplete_details"] == {"reason": None,
                                                                          "goosedump_reason": "time_budget"}
    assert (out["parallel_tool_calls"], out["temperature"], out["top_p"]) == (False, 0.5, 0.9)
    assert out["reasoning"] == {"effort": "low", "summary": "auto"}
    for body, param in (({"conversation": "conv_1"}, "conversation"), ({"reasoning": {"effort": "minimal"}},
                                                                       "reasoning")):
        r = post(server, "/v1/responses", {**base, **body})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    events = no_token_left_stream(server, "/v1/responses", tiny_model.tokenizer,
                                  {"input": "Hi", "max_output_tokens": 8, "reasoning_budget": 0})
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"], events[-3:]
    assert "no token is left to choose" in events[-2]["message"]
    assert events[-1]["response"]["error"]["code"] == "invalid_prompt"
