"""Several choices in one response, through the openai client: OpenAI's `n`
on /v1/chat/completions and /v1/completions, and a batch of prompts on
/v1/completions (lm-evaluation-harness's batched requests). The engine
decodes the choices together; each equals the same request alone with the
request's seed plus its choice's number (batch-invariant kernels: the same
tokens), whole and streamed; usage counts each prompt once."""
from collections import defaultdict

import pytest

from test_server import MODEL, USER, client, post, server  # noqa: F401


def test_chat_n_choices_equal_single_requests(client):
    kw = dict(model=MODEL, messages=USER, max_tokens=6, temperature=1.0, seed=40, logprobs=True, top_logprobs=2)
    r = client.chat.completions.create(n=3, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    singles = [client.chat.completions.create(**{**kw, "seed": 40 + k}) for k in range(3)]
    for c, one in zip(r.choices, singles):
        assert c.message.content == one.choices[0].message.content
        assert c.logprobs.content == one.choices[0].logprobs.content and c.finish_reason == "length"
    assert len({c.message.content for c in r.choices}) > 1
    assert r.usage.prompt_tokens == singles[0].usage.prompt_tokens
    assert r.usage.completion_tokens == 18 == sum(s.usage.completion_tokens for s in singles)
    stream = client.chat.completions.create(n=3, stream=True, stream_options={"include_usage": True}, **kw)
    text, last = defaultdict(str), None
    for chunk in stream:
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
        last = chunk
    assert [text[i] for i in range(3)] == [c.message.content for c in r.choices]
    assert last.usage.completion_tokens == 18 and last.usage.prompt_tokens == r.usage.prompt_tokens


def test_a_batch_of_prompts_with_n(client, tiny_model):
    prompts = ["Once upon a time", "The capital of France"]
    kw = dict(model=MODEL, max_tokens=5, temperature=0.9, seed=7, logprobs=1, echo=True)
    r = client.completions.create(prompt=prompts, n=2, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    for i, c in enumerate(r.choices):
        one = client.completions.create(prompt=prompts[i // 2], **{**kw, "seed": 7 + i % 2}).choices[0]
        assert c.text == one.text and c.text.startswith(prompts[i // 2])
        assert c.logprobs.token_logprobs == one.logprobs.token_logprobs
    n_prompt = sum(len(tiny_model.tokenizer.encode(p)) for p in prompts)
    assert r.usage.prompt_tokens == n_prompt and r.usage.completion_tokens == 20
    ids = [tiny_model.tokenizer.encode(p) for p in prompts]
    by_ids = client.completions.create(prompt=ids, n=2, **kw)
    assert [c.text for c in by_ids.choices] == [c.text for c in r.choices]
    stream = client.completions.create(prompt=prompts, n=2, stream=True, **kw)
    text = defaultdict(str)
    for chunk in stream:
        for c in chunk.choices:
            text[c.index] += c.text
    assert [text[i] for i in range(4)] == [c.text for c in r.choices]


@pytest.mark.parametrize("path,body,param,says", [
    ("/v1/chat/completions", {"messages": USER, "n": 9}, "n", "at most 8"),
    ("/v1/chat/completions", {"messages": USER, "n": 0}, "n", "at least 1"),
    ("/v1/completions", {"prompt": ["a", "b", "c"], "n": 3}, "prompt", "n=3 for each of 3 prompts"),
    ("/v1/completions", {"prompt": ["a", ""]}, "prompt", "empty"),
    ("/v1/responses", {"input": "hi", "n": 2}, "n", "not supported here"),
])
def test_too_many_choices_are_refused(server, path, body, param, says):
    r = post(server, path, {"model": MODEL, "max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and says in r.json()["error"]["message"]
