"""Several choices in one response, through the openai client: OpenAI's `n`
on /v1/chat/completions and /v1/completions, and a batch of prompts on
/v1/completions (lm-evaluation-harness's batched requests). The engine
decodes the choices together; each equals the same request alone with the
request's seed plus its choice's number (batch-invariant kernels: the same
tokens), whole and streamed; usage counts each prompt once."""
import time
from collections import defaultdict

import httpx
import pytest

from test_server import KEY, MODEL, USER, client, metrics, post, server  # noqa: F401


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


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_stops_every_choice(server, stream):
    key = 'goosedump_generations_total{reason="disconnected"}'
    before = metrics(server)
    body = {"model": MODEL, "messages": USER, "max_tokens": 400, "temperature": 1.0, "seed": 5, "n": 3,
            "stream": stream}
    if stream:
        with httpx.stream("POST", server + "/v1/chat/completions", json=body,
                          headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as r:
            for n, line in enumerate(r.iter_lines()):
                if n == 4:
                    break
    else:
        with pytest.raises(httpx.TimeoutException):
            post(server, "/v1/chat/completions", body, timeout=0.5)
    left = time.monotonic()
    while metrics(server).get(key, 0) - before.get(key, 0) < 3:
        assert time.monotonic() - left < 10, "a choice's generation went on after the client left"
        time.sleep(0.05)
    after = metrics(server)
    assert after[key] - before.get(key, 0) == 3
    assert after["goosedump_generated_tokens_total"] - before["goosedump_generated_tokens_total"] < 3 * 400
