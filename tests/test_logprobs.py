"""Log-probabilities through the server (chat completions, completions, the
Responses API; whole and streamed, read by the official openai client)
against the engine's own, and which tokens a chat reply lists. That the
engine's numbers are the model's distribution is test_reference.py's
test_logprobs_are_the_models_distribution (against transformers)."""
import json

import pytest
from openai.types.chat import ChatCompletion

from goosedump.logprobs import ContentLogprobs, TokenLogprob
from goosedump.reply import ReplyStream
from goosedump.sampling import GREEDY
from test_server import HARMONY_REPLY, KEY, MODEL, USER, client, post, server, sse_events  # noqa: F401 (fixtures)


class Fed:
    """A generation's log-probabilities as the engine leaves them: the n-th
    generated token's logprob is -(n + 1), so an entry tells its position."""

    def __init__(self, ids):
        self.token_logprobs = [TokenLogprob(t, -(n + 1.0), ()) for n, t in enumerate(ids)]


def listed(tok, ids, stop=None):
    reply = ReplyStream(tok, stop)
    lps = ContentLogprobs(tok, Fed(ids))
    for t in ids:
        reply.feed(t)
        lps.add(reply)
    reply.close()
    return reply, [int(-e["logprob"]) - 1 for e in lps.entries], lps


def test_a_chat_reply_lists_its_content_tokens_only(tiny_model):
    tok = tiny_model.tokenizer
    ids = tok.encode(HARMONY_REPLY + "<|call|>", allow_special=True)
    reply, positions, lps = listed(tok, ids)
    # the commentary preamble is the content; reasoning, the call's arguments
    # and the format's markup are not listed
    body = tok.encode("Checking.")
    start = next(i for i in range(len(ids)) if ids[i:i + len(body)] == body)
    assert reply.content == "Checking." and positions == list(range(start, start + len(body)))
    assert b"".join(bytes(e["bytes"]) for e in lps.entries).decode() == reply.content
    assert [lps.by_item[i.id] for i in reply.items if i.kind == "content"] == [lps.entries]
    # a final answer after the call's turn: both content items, each its own
    more = tok.encode("<|start|>assistant<|channel|>final<|message|>It is 20 C in Paris.<|return|>",
                      allow_special=True)
    reply, positions, lps = listed(tok, ids + more)
    assert reply.content == "Checking.It is 20 C in Paris."
    assert b"".join(bytes(e["bytes"]) for e in lps.entries).decode() == reply.content
    assert [len(v) for v in lps.by_item.values()] == [len(body), len(tok.encode("It is 20 C in Paris."))]


def test_text_outside_the_format_is_listed_whole(tiny_model):
    """A model that never frames its text: its first tokens wait as a
    header, then turn into content together; all of them are listed."""
    tok = tiny_model.tokenizer
    text = "".join(f" word{i}" for i in range(40))
    ids = tok.encode(text)
    reply, positions, lps = listed(tok, ids)
    assert len(ids) > 48 and reply.content == text and positions == list(range(len(ids)))
    # a stop string: the tokens up to the one that completes it
    reply, positions, _ = listed(tok, ids, stop=["word35"])
    assert reply.stopped and reply.content == text[:text.index("word35")]
    upto = next(n for n in range(len(ids)) if "word35" in tok.decode(ids[:n + 1]))
    assert positions == list(range(upto + 1))


def test_chat_logprobs_are_the_engines(client, tiny_model):
    kw = dict(model=MODEL, messages=USER, max_tokens=64, temperature=0, logprobs=True, top_logprobs=3)
    r = client.chat.completions.create(**kw)
    ChatCompletion.model_validate(r.model_dump())
    choice = r.choices[0]
    entries = choice.logprobs.content
    # the random tiny model writes no format: every token is content
    ref = tiny_model.generate(tiny_model.render_chat(USER), max_tokens=64, sampling=GREEDY, logprobs=3)
    assert [e.logprob for e in entries] == pytest.approx([lp.logprob for lp in ref.logprobs], rel=1e-9, abs=1e-12)
    tok = tiny_model.tokenizer
    assert [bytes(e.bytes) for e in entries] == [tok.token_bytes(t) for t in ref.token_ids]
    assert b"".join(bytes(e.bytes) for e in entries).decode("utf-8", "replace") == choice.message.content
    for e, lp in zip(entries, ref.logprobs):
        assert [bytes(a.bytes) for a in e.top_logprobs] == [tok.token_bytes(i) for i, _ in lp.top]
        assert [a.logprob for a in e.top_logprobs] == pytest.approx([v for _, v in lp.top], rel=1e-9, abs=1e-12)
        assert e.top_logprobs[0].logprob == e.logprob and len(e.top_logprobs) == 3      # greedy: the first
    # streamed: the chunks' lists join to the same
    streamed = []
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            if c.logprobs is not None:
                streamed += c.logprobs.content
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in entries]
    # without top_logprobs: the tokens alone; without logprobs: none
    bare = client.chat.completions.create(**{**kw, "top_logprobs": None}).choices[0].logprobs.content
    assert [e.logprob for e in bare] == [e.logprob for e in entries] and all(e.top_logprobs == [] for e in bare)
    assert client.chat.completions.create(**{**kw, "logprobs": None, "top_logprobs": None}).choices[0].logprobs is None


def test_completion_logprobs_are_the_engines(client, tiny_model):
    kw = dict(model=MODEL, prompt="The capital of France is", max_tokens=20, temperature=0, logprobs=2)
    r = client.completions.create(**kw)
    lp, text = r.choices[0].logprobs, r.choices[0].text
    ref = tiny_model.generate(kw["prompt"], max_tokens=20, logprobs=2)
    assert text == ref.text
    assert lp.token_logprobs == pytest.approx([x.logprob for x in ref.logprobs], rel=1e-9, abs=1e-12)
    tok = tiny_model.tokenizer
    assert lp.tokens == [tok.token_bytes(t).decode("utf-8", "replace") for t in ref.token_ids]
    # each token's text starts at its offset (tokens that split a character aside)
    for t, start, end in zip(lp.tokens, lp.text_offset, lp.text_offset[1:] + [len(text)]):
        if "\ufffd" not in t:
            assert text[start:end] == t
    for top, x in zip(lp.top_logprobs, ref.logprobs):
        assert max(top.values()) == pytest.approx(x.logprob) and 1 <= len(top) <= 2
    # sampled, the chosen token is among its alternatives whatever its rank: up to logprobs + 1 (OpenAI's
    # reference: "the API will always return the logprob of the sampled token"), 0 alternatives its own alone
    for n in (0, 1):
        sampled = client.completions.create(**{**kw, "temperature": 1.5, "seed": 3, "logprobs": n}).choices[0].logprobs
        for token, value, top in zip(sampled.tokens, sampled.token_logprobs, sampled.top_logprobs):
            assert top[token] == pytest.approx(value) and len(top) <= n + 1, (token, top)
    chunks = [c for c in client.completions.create(**kw, stream=True) if c.choices and c.choices[0].logprobs]
    joined = {k: sum((getattr(c.choices[0].logprobs, k) for c in chunks), []) for k in
              ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
    assert joined == {k: getattr(lp, k) for k in joined}


def test_responses_logprobs_equal_the_chats(server, client):
    messages = [{"role": "user", "content": USER[0]["content"]}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=60, temperature=0,
                                          logprobs=True, top_logprobs=2).choices[0].logprobs.content
    want = [e.model_dump() for e in chat]
    r = client.responses.create(model=MODEL, input=messages, max_output_tokens=60, temperature=0, top_logprobs=2,
                                include=["message.output_text.logprobs"])
    (text,) = [p for o in r.output if o.type == "message" for p in o.content]
    assert [e.model_dump(exclude_none=True) for e in text.logprobs] == want
    events = sse_events(server, "/v1/responses", {"model": MODEL, "input": messages, "max_output_tokens": 60,
                                                  "temperature": 0, "top_logprobs": 2, "stream": True,
                                                  "include": ["message.output_text.logprobs"]})
    deltas = [x for e in events if e["type"] == "response.output_text.delta" for x in e["logprobs"]]
    (done,) = [e for e in events if e["type"] == "response.output_text.done"]
    assert deltas == done["logprobs"] == want
    # not asked for: empty lists, as OpenAI's
    r = client.responses.create(model=MODEL, input=messages, max_output_tokens=8, temperature=0)
    assert all(p.logprobs == [] for o in r.output if o.type == "message" for p in o.content)


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"messages": USER, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": USER, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": USER, "logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("/v1/completions", {"prompt": "Hi", "logprobs": 21}, "logprobs"),
    ("/v1/responses", {"input": "Hi", "top_logprobs": 30}, "top_logprobs"),
    ("/v1/responses", {"input": "Hi", "include": "message.output_text.logprobs"}, "include"),
])
def test_logprob_requests_out_of_range_are_named(server, path, body, param):
    r = post(server, path, {**body, "max_tokens": 2} if "responses" not in path else body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"], json.dumps(err)
