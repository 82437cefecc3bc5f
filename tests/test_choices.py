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


def per_token(c) -> float:
    return sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs)


@pytest.mark.parametrize("logprobs,extra", [(None, dict(seed=21, max_tokens=5)), (2, dict(seed=21, max_tokens=5)),
                                             (1, dict(seed=21, max_tokens=8, stop=["a"]))])
def test_best_of_returns_the_n_most_likely_per_token(client, logprobs, extra):
    """best_of=5, n=2: the two of the five completions (choice k: seed plus
    k, as with n=5) with the highest mean token log-probability, most likely
    first, ranked here from the n=5 response's own log-probabilities (a
    completion a stop string cuts: its tokens up to the one that completes
    the stop string)."""
    kw = dict(model=MODEL, prompt="Once upon a time", temperature=1.0, **extra)
    pool = client.completions.create(n=5, logprobs=logprobs or 0, **kw).choices
    # (no end token: the returned tokens are all; in the stop-string case the
    # lengths differ, so a sum would rank them otherwise)
    assert all(c.finish_reason == ("stop" if "stop" in extra else "length") for c in pool)
    ranked = sorted(pool, key=lambda c: -per_token(c))
    def key(cs):   # what tells the completions apart: their text, and their scores where they come
        return [(c.text, tuple(c.logprobs.token_logprobs) if c.logprobs else None) for c in cs]
    assert key(ranked[:2]) != key(pool[:2])                 # (the pick is not the first two)
    if "stop" in extra:
        by_sum = sorted(pool, key=lambda c: -sum(c.logprobs.token_logprobs))
        assert key(by_sum[:2]) != key(ranked[:2])
    r = client.completions.create(n=2, best_of=5, **({"logprobs": logprobs} if logprobs else {}), **kw)
    assert [c.index for c in r.choices] == [0, 1]
    if logprobs:
        assert key(r.choices) == key(ranked[:2])
        assert [c.logprobs.top_logprobs for c in r.choices] == [c.logprobs.top_logprobs for c in ranked[:2]]
    else:
        assert [c.text for c in r.choices] == [c.text for c in ranked[:2]]
        assert all(c.logprobs is None for c in r.choices)
    # every completion made counts (with a stop string, also what the
    # generation made before it heard of the stop)
    made = sum(len(c.logprobs.token_logprobs) for c in pool)
    if "stop" in extra:
        assert r.usage.completion_tokens >= made
        return
    assert r.usage.completion_tokens == made == 25
    one = client.completions.create(best_of=5, **kw)          # n 1: the best alone
    assert [c.text for c in one.choices] == [ranked[0].text]
    same = client.completions.create(n=2, best_of=2, stream=True, **kw)   # best_of n: plain n, streamable
    text = defaultdict(str)
    for chunk in same:
        for c in chunk.choices:
            text[c.index] += c.text
    assert [text[0], text[1]] == [c.text for c in pool[:2]]


@pytest.mark.parametrize("body,says", [
    ({"prompt": "a", "n": 3, "best_of": 2}, "at least n (3)"),
    ({"prompt": "a", "best_of": 3, "stream": True}, "cannot be streamed"),
    ({"prompt": ["a", "b"], "best_of": 5}, "best_of=5 for each of 2 prompts asks for 10"),
    ({"prompt": "a", "best_of": 0}, "at least n (1)"),
    ({"prompt": "a", "suffix": "z"}, "fill in the middle"),
])
def test_best_of_out_of_reach_is_refused(server, body, says):
    r = post(server, "/v1/completions", {"model": MODEL, "max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == ("suffix" if "suffix" in body else "best_of")
    assert says in r.json()["error"]["message"]


def test_an_end_token_has_its_log_probability(tiny_model):
    """A generation the model ends keeps the end token's log-probability
    (best_of counts it in a completion's measure): the one a prefill of the
    same tokens gives it."""
    tok = tiny_model.tokenizer
    prompt = tok.encode("Once upon a time")
    gen = tiny_model.generate_stream(prompt, max_tokens=8, logprobs=0, grammar='root ::= "ab"')
    for _ in gen.events():
        pass
    end = gen.end_logprob
    assert gen.result.stop_reason == "eos" and end is not None and end.token in tok.eog_ids
    scored = tiny_model.generate(prompt + gen.generated + [end.token], max_tokens=1, prompt_logprobs=0)
    assert scored.prompt_logprobs[-1].token == end.token and scored.prompt_logprobs[-1].logprob == end.logprob
    assert [lp.logprob for lp in gen.token_logprobs] == \
        [lp.logprob for lp in scored.prompt_logprobs[len(prompt) - 1:-1]]
