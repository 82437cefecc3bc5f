"""/v1/completions with echo (and logprobs): the prompt first, with its
tokens' log-probabilities, as OpenAI's legacy completions and evaluation
harnesses (lm-evaluation-harness's loglikelihood: echo, logprobs, a
token-id prompt in a batch of one) use them; through the openai client,
equal to the engine's prompt scores and the same request without echo."""
import json

import pytest
from openai.types import Completion

from test_server import MODEL, client, post, server  # noqa: F401

PROMPT = "The quick brown fox jumps over the lazy dog. It was"


@pytest.fixture(scope="module")
def ids(tiny_model):
    return tiny_model.tokenizer.encode(PROMPT)


def test_echo_puts_the_prompt_and_its_scores_first(client, tiny_model, ids):
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0, echo=True, logprobs=2)
    # the first token has no log-probability: null, as OpenAI's and vLLM's echo
    # give it (the client's types say float: it does not check them)
    first = r.model_dump()
    first["choices"][0]["logprobs"]["token_logprobs"][0], first["choices"][0]["logprobs"]["top_logprobs"][0] = 0.0, {}
    Completion.model_validate(first)
    plain = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0, logprobs=2)
    (c,), (p,) = r.choices, plain.choices
    assert c.text == PROMPT + p.text
    lp = c.logprobs
    n = len(ids)
    assert len(lp.tokens) == n + 8 and "".join(lp.tokens) == c.text
    assert lp.text_offset == [len("".join(lp.tokens[:k])) for k in range(n + 8)]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[n:] == p.logprobs.token_logprobs and lp.top_logprobs[n:] == p.logprobs.top_logprobs
    engine = tiny_model.generate(ids, 1, prompt_logprobs=2).prompt_logprobs
    assert lp.token_logprobs[1:n] == [e.logprob for e in engine]
    # each prompt token among its alternatives (as a sampled token is: up to logprobs + 1, OpenAI's rule)
    dec = tiny_model.tokenizer.decode
    assert [len(t) for t in lp.top_logprobs[1:n]] == [len({dec([i]) for i, _ in e.top} | {dec([e.token])})
                                                      for e in engine]
    assert all(t[tok] == v for t, tok, v in zip(lp.top_logprobs[1:n], lp.tokens[1:n], lp.token_logprobs[1:n]))
    assert r.usage.prompt_tokens == n and r.usage.completion_tokens == 8


def test_scoring_a_generation_gives_its_own_log_probabilities(client, ids):
    gen = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0, logprobs=1)
    text = gen.choices[0].text
    scored = client.completions.create(model=MODEL, prompt=PROMPT + text, max_tokens=1, temperature=0, echo=True,
                                       logprobs=1).choices[0].logprobs
    assert scored.token_logprobs[len(ids):len(ids) + 6] == gen.choices[0].logprobs.token_logprobs


def test_echo_streamed_and_lm_eval_s_request(server, client, ids):
    whole = client.completions.create(model=MODEL, prompt=ids, max_tokens=4, temperature=0, echo=True, logprobs=1)
    chunks = list(client.completions.create(model=MODEL, prompt=ids, max_tokens=4, temperature=0, echo=True,
                                            logprobs=1, stream=True))
    assert chunks[0].choices[0].text == PROMPT
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    joined = [v for c in chunks if c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert joined == whole.choices[0].logprobs.token_logprobs
    # lm-evaluation-harness's loglikelihood request: a batch of one token-id prompt, one token, echo
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": [ids], "temperature": 0, "max_tokens": 1,
                                         "logprobs": 1, "seed": 1234, "echo": True})
    assert r.status_code == 200, r.text
    (choice,) = r.json()["choices"]
    ctxlen = 5                                    # the continuation: the prompt's tokens after the fifth
    continuation = choice["logprobs"]["token_logprobs"][ctxlen:-1]
    tops = choice["logprobs"]["top_logprobs"][ctxlen:-1]
    assert len(continuation) == len(ids) - ctxlen and all(v < 0 for v in continuation)
    # the top one, and the prompt's own token where it is not that one (lm-eval's is_greedy reads the max)
    tokens = choice["logprobs"]["tokens"][ctxlen:-1]
    assert all(1 <= len(t) <= 2 and tok in t for t, tok in zip(tops, tokens))
    assert continuation == whole.choices[0].logprobs.token_logprobs[ctxlen:len(ids)]
    no_logprobs = client.completions.create(model=MODEL, prompt=ids, max_tokens=4, temperature=0, echo=True)
    assert no_logprobs.choices[0].text == whole.choices[0].text and no_logprobs.choices[0].logprobs is None
    two = json.loads(post(server, "/v1/completions", {"model": MODEL, "prompt": [ids, ids[:4]], "echo": True,
                                                      "max_tokens": 1, "temperature": 0}).text)["choices"]
    assert len(two) == 2 and two[0]["text"].startswith(PROMPT)
    assert two[1]["text"].startswith("".join(whole.choices[0].logprobs.tokens[:4]))     # a batch: one choice each


def test_max_tokens_0_with_echo_scores_the_prompt_alone(server, client, ids):
    """OpenAI's legacy scoring request (older harnesses send it): the prompt
    and its scores, nothing generated."""
    kw = dict(model=MODEL, prompt=ids, temperature=0, echo=True, logprobs=2)
    one = client.completions.create(max_tokens=1, **kw)
    zero = client.completions.create(max_tokens=0, **kw)
    (c,) = zero.choices
    assert c.text == PROMPT and c.finish_reason == "length"
    assert c.logprobs.token_logprobs == one.choices[0].logprobs.token_logprobs[:len(ids)]
    assert c.logprobs.tokens == one.choices[0].logprobs.tokens[:len(ids)]
    assert (zero.usage.prompt_tokens, zero.usage.completion_tokens) == (len(ids), 0)
    streamed = list(client.completions.create(max_tokens=0, stream=True, **kw))
    assert "".join(ch.choices[0].text for ch in streamed if ch.choices) == PROMPT
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": ids, "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
