"""Anthropic's Messages API (/v1/messages) through Anthropic's own Python SDK
against a real server process: the same tokens as /v1/chat/completions for
the same request, whole and streamed (the stream accumulated by the SDK);
the token count the usage of the same request; Anthropic's history renders
as the OpenAI history it means; a reply's thinking and tool_use blocks on
token streams made by hand (the random tiny model writes no harmony by
itself), whole and as events the SDK's accumulator folds into the same
message; every refused request named, in Anthropic's error shape."""
import json
from types import SimpleNamespace

import anthropic
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message as AnthropicMessage

from goosedump.reply import ReplyStream
from goosedump.reply_plan import PlanError, arguments_grammar
from goosedump.server.anthropic import Message
from goosedump.server.anthropic_params import MessagesBody, chat_messages, function_tools
from goosedump.server.errors import APIError
from goosedump.structured import any_json_object
from test_server import (HARMONY_REPLY, KEY, MODEL, USER, WEATHER, client, feed_all, httpx,  # noqa: F401
                         no_token_left_stream, post, server)

TOOL = {"name": "get_weather", "description": "Gets the weather in a city.",
        "input_schema": WEATHER["function"]["parameters"]}


@pytest.fixture(scope="module")
def api(server):
    with anthropic.Anthropic(base_url=server, api_key=KEY, max_retries=0, timeout=60) as c:
        yield c


def blocks(message) -> list[dict]:
    return [{k: v for k, v in b.model_dump().items() if k in ("type", "text", "thinking", "name", "input")}
            for b in message.content]


@pytest.mark.parametrize("thinking,budget", [(None, None), ({"type": "disabled"}, 0),
                                             ({"type": "enabled", "budget_tokens": 3}, 3)])
def test_messages_equal_the_chat_route(api, client, thinking, budget):
    kw = dict(model=MODEL, max_tokens=24, system="Be brief.", messages=USER,
              extra_body={"temperature": 0.7, "seed": 11, "top_k": 40})
    if thinking is not None:
        kw["thinking"] = thinking
    m = api.messages.create(**kw)
    extra = {"top_k": 40, **({"reasoning_budget": budget} if budget is not None else {})}
    ref = client.chat.completions.create(model=MODEL, max_tokens=24, temperature=0.7, seed=11, extra_body=extra,
                                         messages=[{"role": "system", "content": "Be brief."}, *USER])
    assert blocks(m) == [{"type": "text", "text": ref.choices[0].message.content}]
    assert m.stop_reason == "max_tokens" and m.stop_sequence is None and m.model == MODEL
    assert m.usage.output_tokens == ref.usage.completion_tokens
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == ref.usage.prompt_tokens
    with api.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert blocks(final) == blocks(m) and final.stop_reason == m.stop_reason
    assert final.usage.output_tokens == m.usage.output_tokens


def test_stop_sequences_and_token_counts(api, client):
    kw = dict(model=MODEL, max_tokens=40, messages=USER, extra_body={"temperature": 0})
    text = api.messages.create(**kw).content[0].text
    k = next(k for k in range(len(text) // 2, len(text) - 4) if text.find(text[k:k + 4]) == k and text[k:k + 4].strip())
    m = api.messages.create(**kw, stop_sequences=["zzz-never", text[k:k + 4]])
    assert m.content[0].text == text[:k] and (m.stop_reason, m.stop_sequence) == ("stop_sequence", text[k:k + 4])
    count = api.messages.count_tokens(model=MODEL, system="Be brief.", messages=USER, tools=[TOOL])
    ref = client.chat.completions.create(model=MODEL, max_tokens=1, tools=[WEATHER],
                                         messages=[{"role": "system", "content": "Be brief."}, *USER])
    assert count.input_tokens == ref.usage.prompt_tokens


def test_anthropic_history_renders_as_the_openai_history(tiny_model):
    history = [
        {"role": "user", "content": [{"type": "text", "text": "What is the weather in Paris?"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Call the tool.", "signature": ""},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "20 C"}]},
                                     {"type": "text", "text": "And tomorrow?"}]}]
    body = MessagesBody(max_tokens=8, system=[{"type": "text", "text": "Be brief."}], messages=history, tools=[TOOL])
    openai_history = [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Call the tool.",
         "tool_calls": [{"id": "c", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c", "content": "20 C"}, {"role": "user", "content": "And tomorrow?"}]
    tools = function_tools(body.tools)
    assert tools == [WEATHER]
    ids = tiny_model.render_chat(chat_messages(body), tools=tools)
    assert ids == tiny_model.render_chat(openai_history, tools=[WEATHER])
    # a failed call's result (is_error) reads as an error to the model
    history[2]["content"][0]["is_error"] = True
    failed = chat_messages(MessagesBody(max_tokens=8, messages=history, tools=[TOOL]))
    assert [m["content"] for m in failed if m["role"] == "tool"] == ["Error: 20 C"]
    assert "Error: 20 C" in tiny_model.tokenizer.decode(tiny_model.render_chat(failed, tools=tools))
    history[2]["content"][0]["is_error"] = None          # (unset, as clients that write every field send it)
    assert [m["content"] for m in chat_messages(MessagesBody(max_tokens=8, messages=history, tools=[TOOL]))
            if m["role"] == "tool"] == ["20 C"]
    history[2]["content"][0]["is_error"] = "yes"
    with pytest.raises(APIError, match=r"messages\[2\]\.content\[0\]\.is_error must be true or false, got 'yes'"):
        chat_messages(MessagesBody(max_tokens=8, messages=history, tools=[TOOL]))


def test_thinking_and_tool_use_blocks_whole_and_streamed(tiny_model):
    tok = tiny_model.tokenizer
    ids = tok.encode(HARMONY_REPLY, allow_special=True)
    turn = ReplyStream(tok)
    events = feed_all(turn, ids)
    r = SimpleNamespace(stop_reason="eos", prompt_tokens=50, cached_tokens=20, generated_tokens=len(ids))
    msg = Message("m", "shown")
    whole = msg.whole(turn, r)
    AnthropicMessage.model_validate(whole)
    assert [b["type"] for b in whole["content"]] == ["thinking", "thinking", "text", "tool_use"]
    assert "\n".join(b["thinking"] for b in whole["content"][:2]) == turn.reasoning
    assert whole["content"][2]["text"] == turn.content == "Checking."
    assert whole["content"][3]["input"] == json.loads(turn.tool_calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert whole["content"][3]["id"] == "toolu_" + turn.tool_calls[0]["id"].removeprefix("call_")
    assert whole["stop_reason"] == "tool_use"
    assert whole["usage"] == {"input_tokens": 30, "output_tokens": len(ids), "cache_read_input_tokens": 20,
                              "cache_creation_input_tokens": 0}
    # the stream's events, folded by the SDK's own accumulator, give the same blocks
    snapshot, bufs = None, {}
    raw = [{**whole, "content": [], "stop_reason": None}] + \
        [json.loads(s.split("data: ", 1)[1]) for s in msg.deltas(events, {})]
    snapshot = accumulate_event(event={"type": "message_start", "message": raw[0]}, current_snapshot=None,
                                json_bufs=bufs)
    for e in raw[1:]:
        snapshot = accumulate_event(event=e, current_snapshot=snapshot, json_bufs=bufs)
    assert [b.model_dump(exclude_none=True, exclude={"parsed_output", "citations"}) for b in snapshot.content] == \
        [{k: v for k, v in b.items()} for b in whole["content"]]
    # display omitted: the thinking blocks stay, empty
    hidden = Message("m", "omitted").whole(turn, r)
    assert [b.get("thinking") for b in hidden["content"][:2]] == ["", ""]
    # thinking not asked for (unset or disabled): no thinking blocks at all, whole or streamed, as Anthropic's
    # API (content[0].text is the answer's), the stream's indexes counting the blocks it sends
    plain = Message("m", "none")
    assert [b["type"] for b in plain.whole(turn, r)["content"]] == ["text", "tool_use"]
    started = [json.loads(s.split("data: ", 1)[1]) for s in plain.deltas(events, {})]
    assert {e["type"] for e in started} == {"content_block_start", "content_block_delta", "content_block_stop"}
    assert [e["index"] for e in started if e["type"] == "content_block_start"] == [0, 1]
    assert all(e["delta"]["type"] != "thinking_delta" for e in started if e["type"] == "content_block_delta")
    # a call cut before its arguments close is left out
    cut = ReplyStream(tok)
    feed_all(cut, ids[:-3])
    assert [b["type"] for b in Message("m", "shown").whole(cut, r)["content"]] == ["thinking", "thinking", "text"]


def test_tool_arguments_parse_where_the_api_returns_objects():
    bad = {"name": "f", "parameters": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}
    with pytest.raises(PlanError):
        arguments_grammar({**bad, "strict": True}, False)
    assert arguments_grammar(bad, True) == any_json_object()        # (ollama's and Anthropic's APIs)
    assert arguments_grammar(bad, False) is None
    good = {"name": "f", "parameters": WEATHER["function"]["parameters"]}
    assert arguments_grammar(good, True) == arguments_grammar({**good, "strict": True}, False) != any_json_object()


@pytest.mark.parametrize("body,status,kind,phrase", [
    ({"model": "claude-sonnet-4-5"}, 404, "not_found_error", "does not exist"),
    ({"max_tokens": None}, 400, "invalid_request_error", "Invalid 'max_tokens'"),
    ({"max_tokens": 0}, 400, "invalid_request_error", "It must be at least 1"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400, "invalid_request_error",
     "only client tools"),
    ({"tool_choice": {"type": "some"}}, 400, "invalid_request_error", "tool_choice.type must be"),
    ({"thinking": {"type": "enabled", "budget_tokens": -1}}, 400, "invalid_request_error", "budget_tokens"),
    ({"thinking": {"type": "maybe"}}, 400, "invalid_request_error", "thinking.type must be"),
    ({"output_config": {"effort": "extreme"}}, 400, "invalid_request_error", "output_config.effort"),
    ({"stop_sequences": [""]}, 400, "invalid_request_error", "stop_sequences"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400, "invalid_request_error",
     "reads text only"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "1"}]}]},
     400, "invalid_request_error", "tool_use_id 'x'"),
    ({"messages": [*USER, {"role": "assistant", "content": "The"}], "thinking": {"type": "adaptive"}}, 400,
     "invalid_request_error", "prefill of the reply) cannot go with thinking on"),
    ({"messages": [*USER, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "get_weather",
                                                               "input": {}}]}], "tools": [TOOL]}, 400,
     "invalid_request_error", "cannot hold tool calls"),
    ({"messages": [*USER, {"role": "assistant", "content": "The"}], "output_config": {"format": {
        "type": "json_schema", "schema": {"type": "object"}}}}, 400, "invalid_request_error",
     "breaks the reply's constraint (output_config.format)"),
    ({"messages": [{"role": "system", "content": "x"}]}, 400, "invalid_request_error", "role is user or assistant"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, 400, "invalid_request_error",
     "messages[0].content[0]: a text block needs its 'text'"),
])
def test_refusals_are_named_in_anthropics_shape(server, body, status, kind, phrase):
    full = {k: v for k, v in {"model": MODEL, "max_tokens": 8, "messages": USER, **body}.items() if v is not None}
    r = post(server, "/v1/messages", full)
    assert r.status_code == status, r.text
    e = r.json()
    assert e["type"] == "error" and e["error"]["type"] == kind and phrase in e["error"]["message"], e


def test_the_sdk_lists_the_model(api, client):
    (m,) = api.models.list().data
    assert (m.id, m.type, m.display_name) == (MODEL, "model", MODEL)
    assert api.models.retrieve(MODEL).id == MODEL
    assert m.created_at.timestamp() == client.models.retrieve(MODEL).created      # the same card, both SDKs


def test_the_api_key_in_either_header(server):
    body = {"model": MODEL, "max_tokens": 2, "messages": USER}
    assert httpx.post(server + "/v1/messages", json=body, headers={"x-api-key": KEY}, timeout=60).status_code == 200
    r = httpx.post(server + "/v1/messages", json=body, timeout=60)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.post(server + "/v1/messages", json=body, headers={"x-api-key": "wrong"}, timeout=60)
    assert r.status_code == 401


def test_max_tokens_past_the_context_engine_stops_and_stream_usage(api, server, tiny_model):
    """A max_tokens past the context (Claude Code sends 32000) is served to
    the context's end: model_context_window_exceeded (it had been a 400); an
    engine stop is one of the API's reasons, named beside (the SDK refused
    "time_budget"); message_start's usage splits the prompt as the final
    one does; a request error mid-stream keeps its type."""
    from test_server import CTX
    m = api.messages.create(model=MODEL, max_tokens=32000, messages=USER,
                            extra_body={"reasoning_budget": 0, "temperature": 0})
    assert m.stop_reason == "model_context_window_exceeded", m.stop_reason     # (greedy: no end token here)
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens + m.usage.output_tokens == CTX
    timed = post(server, "/v1/messages", {"model": MODEL, "max_tokens": 50, "messages": USER,
                                          "time_budget": 1e-6}).json()
    AnthropicMessage.model_validate(timed)
    assert (timed["stop_reason"], timed["goosedump_stop_reason"]) == ("max_tokens", "time_budget")
    body = {"model": MODEL, "max_tokens": 8, "messages": USER, "temperature": 0, "stream": True}
    with httpx.stream("POST", server + "/v1/messages", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}"}) as r:
        events = [json.loads(ln[len("data: "):]) for ln in r.iter_lines() if ln.startswith("data: ")]
    start, delta = events[0]["message"]["usage"], next(e for e in events if e["type"] == "message_delta")["usage"]
    assert (start["input_tokens"], start["cache_read_input_tokens"]) == \
        (delta["input_tokens"], delta["cache_read_input_tokens"])
    assert start["input_tokens"] + start["cache_read_input_tokens"] > 0
    events = no_token_left_stream(server, "/v1/messages", tiny_model.tokenizer,
                                  {"max_tokens": 8, "reasoning_budget": 0, "messages": USER})
    assert events[-1]["type"] == "error" and events[-1]["error"]["type"] == "invalid_request_error", events[-1]
