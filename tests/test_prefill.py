"""A reply that continues the last assistant message (a prefill): Anthropic's
API and ollama's /api/chat take a last assistant message so, the OpenAI
route with vLLM's continue_final_message. The prompt equals openai-harmony's
rendering of the conversation with that message left open; the reply holds
only what follows it, equal to a raw completion of that prompt, through each
API's own client; constraints hold the prefill to them; every refusal
named."""
import json
import re

import anthropic
import ollama
import openai_harmony as H
import pytest
from openai_harmony import Conversation, Message, Role

from goosedump.chat import ChatError, prefill_tokens, split_prefill
from goosedump.reply import ReplyStream
from goosedump.sampling import GREEDY
from refs import harmony_encoding
from test_chat import DATE, reference_messages
from test_server import KEY, MODEL, USER, client, feed_all, post, server  # noqa: F401

ANSWER = {"role": "assistant", "content": "The capital is"}
THOUGHT = {"role": "assistant", "reasoning_content": "The user asks about France."}
BOTH = {"role": "assistant", "reasoning_content": "Easy.", "content": "It is"}
COLD = {"temperature": 0}   # greedy, where a client has no temperature argument


@pytest.mark.parametrize("last", [ANSWER, THOUGHT, BOTH], ids=["content", "reasoning", "both"])
def test_prompt_is_openai_harmonys_with_the_last_message_open(tiny_model, last):
    enc = harmony_encoding()
    history, got = split_prefill(USER + [last])
    assert history == USER and got is last
    ours = tiny_model.render_chat(history, date=DATE) + prefill_tokens(tiny_model.tokenizer, last, "m")
    turn = []
    if last.get("reasoning_content"):
        turn.append(Message.from_role_and_content(Role.ASSISTANT, last["reasoning_content"]).with_channel("analysis"))
    if last.get("content"):
        turn.append(Message.from_role_and_content(Role.ASSISTANT, last["content"]).with_channel("final"))
    ref = enc.render_conversation(Conversation.from_messages(reference_messages(USER, {}) + turn),
                                  config=H.RenderConversationConfig(auto_drop_analysis=False))
    assert enc.decode([ref[-1]]) == "<|end|>"
    assert ours == ref[:-1], f"\nours: {enc.decode(ours)!r}\nref:  {enc.decode(ref[:-1])!r}"


def test_an_empty_last_assistant_message_is_dropped_and_calls_refused(tiny_model):
    assert split_prefill(USER + [{"role": "assistant", "content": ""}]) == (USER, None)
    assert split_prefill(USER) == (USER, None)
    call = {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                 "function": {"name": "f", "arguments": "{}"}}]}
    with pytest.raises(ChatError, match="cannot hold tool calls"):
        prefill_tokens(tiny_model.tokenizer, call, "messages[1]")


def test_reply_stream_sends_only_what_follows_the_prefill(tiny_model):
    tok = tiny_model.tokenizer
    prefix = prefill_tokens(tok, BOTH, "m")
    for generated, content in [(" Paris.<|return|>", " Paris."), ("<|return|>", "")]:
        turn = ReplyStream(tok, prefix=prefix)
        events = feed_all(turn, tok.encode(generated, allow_special=True))
        assert turn.content == content and turn.reasoning == ""
        assert "".join(text for what, item, text in events if what == "delta") == content
        assert [(what, item.kind) for what, item, _ in events if what != "delta"] == [("start", "content"),
                                                                                      ("end", "content")]
    turn = ReplyStream(tok, prefix=prefill_tokens(tok, THOUGHT, "m"))
    feed_all(turn, tok.encode(" Paris.<|end|><|start|>assistant<|channel|>final<|message|>Paris<|return|>",
                              allow_special=True))
    assert (turn.reasoning, turn.content) == (" Paris.", "Paris")


def raw_continuation(client, tiny_model, messages, n):
    """The greedy raw completion of the prompt with the last message open."""
    history, last = split_prefill(messages)
    prompt = tiny_model.render_chat(history) + prefill_tokens(tiny_model.tokenizer, last, "m")
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=n, temperature=0)
    return r.choices[0].text


@pytest.mark.parametrize("last", [ANSWER, BOTH], ids=["content", "both"])
def test_openai_continue_final_message_equals_the_raw_completion(server, client, tiny_model, last):
    messages = USER + [last]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0,
                                       extra_body={"continue_final_message": True, "add_generation_prompt": False})
    content = r.choices[0].message.content
    assert content and content == raw_continuation(client, tiny_model, messages, 12)
    assert content == tiny_model.chat(messages, 12, sampling=GREEDY, continue_final_message=True).reply.content
    assert r.usage.completion_tokens == 12
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0,
                                            stream=True, extra_body={"continue_final_message": True})
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == content
    # without the flag the last message is a finished turn: another prompt
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, temperature=0)
    assert plain.usage.prompt_tokens == len(tiny_model.render_chat(messages))
    assert r.usage.prompt_tokens == len(tiny_model.render_chat(USER) + prefill_tokens(tiny_model.tokenizer, last, "m"))
    template = post(server, "/apply-template", {"messages": messages, "continue_final_message": True})
    assert template.json()["prompt"].endswith("<|channel|>final<|message|>" + last["content"])


def test_a_prefill_is_held_to_the_schema(client):
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Lyon"]}}, "required": ["city"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    start = '{"city":"'
    r = client.chat.completions.create(model=MODEL, messages=USER + [{"role": "assistant", "content": start}],
                                       max_tokens=12, temperature=0, response_format=fmt,
                                       extra_body={"continue_final_message": True})
    assert json.loads(start + r.choices[0].message.content)["city"] in ("Paris", "Lyon")
    assert r.choices[0].finish_reason == "stop"


@pytest.fixture(scope="module")
def claude(server):
    with anthropic.Anthropic(base_url=server, api_key=KEY, max_retries=0, timeout=60) as c:
        yield c


def test_anthropic_prefill_continues_the_message(claude, client, tiny_model):
    m = claude.messages.create(model=MODEL, max_tokens=12, messages=USER + [ANSWER], extra_body=COLD)
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == raw_continuation(client, tiny_model, USER + [ANSWER], 12)
    with claude.messages.stream(model=MODEL, max_tokens=12, messages=USER + [ANSWER], extra_body=COLD) as s:
        assert s.get_final_message().content[0].text == m.content[0].text
    blocks = {"role": "assistant", "content": [{"type": "thinking", "thinking": "Easy.", "signature": ""},
                                               {"type": "text", "text": "It is"}]}
    both = claude.messages.create(model=MODEL, max_tokens=12, messages=USER + [blocks], extra_body=COLD)
    assert both.content[0].text == raw_continuation(client, tiny_model, USER + [BOTH], 12)
    count = claude.messages.count_tokens(model=MODEL, messages=USER + [ANSWER])
    assert count.input_tokens == len(tiny_model.render_chat(USER)) + \
        len(prefill_tokens(tiny_model.tokenizer, ANSWER, "m"))
    with pytest.raises(anthropic.BadRequestError, match="thinking on"):
        claude.messages.create(model=MODEL, max_tokens=12, messages=USER + [ANSWER],
                               thinking={"type": "enabled", "budget_tokens": 16})


@pytest.fixture(scope="module")
def olla(server):
    with ollama.Client(host=server, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as c:
        yield c


def test_ollama_chat_continues_the_last_message(olla, client, tiny_model):
    options = {"temperature": 0, "num_predict": 12}
    r = olla.chat(model=MODEL, messages=USER + [ANSWER], options=options)
    assert r.message.content == raw_continuation(client, tiny_model, USER + [ANSWER], 12)
    assert not r.message.thinking
    thought = olla.chat(model=MODEL, messages=USER + [{"role": "assistant", "thinking": THOUGHT["reasoning_content"]}],
                        options=options)
    ref = tiny_model.chat(USER + [THOUGHT], 12, sampling=GREEDY, continue_final_message=True).reply
    assert (thought.message.thinking or "", thought.message.content) == (ref.reasoning_content, ref.content)
    assert ref.reasoning_content


@pytest.mark.parametrize("body,param,says", [
    ({"messages": USER, "continue_final_message": True}, "continue_final_message", "needs an assistant message last"),
    ({"messages": USER + [ANSWER], "continue_final_message": True, "add_generation_prompt": True},
     "add_generation_prompt", "cannot both be true"),
    ({"messages": USER, "add_generation_prompt": False}, "add_generation_prompt", "only with continue_final_message"),
    ({"messages": USER + [{"role": "assistant", "content": "x", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
      "continue_final_message": True}, "messages", "cannot hold tool calls"),
    ({"messages": USER + [ANSWER], "continue_final_message": True, "response_format": {"type": "json_object"}},
     "messages", "breaks the reply's constraint \\(response_format\\)"),
    ({"messages": USER + [BOTH], "continue_final_message": True, "reasoning_budget": 0},
     "messages", "breaks the reply's constraint \\(reasoning_budget\\)"),
    ({"messages": USER + [ANSWER], "continue_final_message": True, "tool_choice": "required", "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]},
     "tool_choice", "cannot continue the last assistant message"),
])
def test_refused_prefills_are_named(server, body, param, says):
    r = post(server, "/v1/chat/completions", {"model": MODEL, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param
    assert re.search(says, err["message"]), err["message"]
