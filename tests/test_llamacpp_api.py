"""llama.cpp's own POST /completion against a real server process: the same
tokens as the engine generates for the prompt and sampling (and as
/v1/completions gives), whole and streamed as llama.cpp streams them; its
prompt forms, stop words, n_probs (the engine's log-probabilities), grammar,
logit_bias forms and llama.cpp's readings of top_k and temperature below 0;
every refused request named."""
import json

import pytest

from goosedump.sampling import SamplingParams
from test_server import CTX, KEY, MODEL, client, httpx, no_token_left_stream, post, server  # noqa: F401 (fixtures)

PROMPT = "Once upon a time"
BODY = {"prompt": PROMPT, "n_predict": 16, "seed": 9, "temperature": 0.8, "top_k": 50, "return_tokens": True}


def stream(server, body) -> list[dict]:
    with httpx.stream("POST", server + "/completion", json={**body, "stream": True},
                      headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln[len("data: "):] for ln in r.iter_lines() if ln.startswith("data: ")]
    return [json.loads(x) for x in lines]          # (no [DONE]: json.loads would fail on it)


def test_completion_is_the_engines_and_the_openai_routes(server, client, tiny_model):
    r = post(server, "/completion", BODY).json()
    ids = tiny_model.tokenizer.encode(PROMPT, allow_special=True)
    ref = tiny_model.generate(ids, max_tokens=16, sampling=SamplingParams(temperature=0.8, top_k=50, seed=9))
    assert r["tokens"] == ref.token_ids and r["content"] == tiny_model.tokenizer.decode(ref.token_ids)
    assert r["content"] == client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, seed=9,
                                                     temperature=0.8, extra_body={"top_k": 50}).choices[0].text
    assert (r["stop"], r["stop_type"], r["stopping_word"]) == (True, "limit", "")
    assert (r["tokens_predicted"], r["tokens_evaluated"], r["prompt"]) == (16, len(ids), PROMPT)
    assert r["timings"]["predicted_n"] == 16 and r["generation_settings"]["top_k"] == 50
    events = stream(server, BODY)
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
    assert "".join(e["content"] for e in events) == r["content"]
    assert [t for e in events[:-1] for t in e["tokens"]] == r["tokens"]
    assert events[-1]["stop_type"] == "limit" and events[-1]["tokens_predicted"] == 16
    # a prompt of text and ids mixed is their tokens in order
    mixed = post(server, "/completion", {**BODY, "prompt": ["Once", *tiny_model.tokenizer.encode(" upon a time")]})
    assert mixed.json()["tokens"] == r["tokens"]


def test_stop_words_probs_grammar_and_bias(server, client, tiny_model):
    greedy = {"prompt": PROMPT, "n_predict": 30, "temperature": 0}
    text = post(server, "/completion", greedy).json()["content"]
    k = next(k for k in range(len(text) // 2, len(text) - 4) if text.find(text[k:k + 4]) == k and text[k:k + 4].strip())
    r = post(server, "/completion", {**greedy, "stop": ["never-here", text[k:k + 4]]}).json()
    assert (r["content"], r["stop_type"], r["stopping_word"]) == (text[:k], "word", text[k:k + 4])
    # llama.cpp's readings: temperature below 0 is greedy, top_k at or below 0 is off
    assert post(server, "/completion", {**greedy, "temperature": -1, "top_k": -1}).json()["content"] == text
    probs = post(server, "/completion", {**greedy, "n_predict": 8, "n_probs": 3}).json()["completion_probabilities"]
    ref = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3)
    assert [p["logprob"] for p in probs] == ref.choices[0].logprobs.token_logprobs
    ids = tiny_model.tokenizer.encode(PROMPT)
    gen = tiny_model.generate(ids, max_tokens=8, sampling=SamplingParams(temperature=0), logprobs=3)
    assert [[a["id"] for a in p["top_logprobs"]] for p in probs] == [[i for i, _ in lp.top] for lp in gen.logprobs]
    yes_no = post(server, "/completion", {"prompt": PROMPT, "n_predict": 8, "seed": 1,
                                          "grammar": 'root ::= "yes" | "no"'}).json()
    assert yes_no["content"] in ("yes", "no")
    token = tiny_model.tokenizer.encode(" the")[0]
    pairs = post(server, "/completion", {**greedy, "n_predict": 4, "logit_bias": [[token, 50]]}).json()
    as_dict = post(server, "/completion", {**greedy, "n_predict": 4, "logit_bias": {str(token): 50}}).json()
    assert pairs["content"] == as_dict["content"] == " the" * 4
    # llama.cpp's false bans the token (it had been read as a bias of 0), and a text biases its tokens
    first = post(server, "/completion", {**greedy, "n_predict": 1, "return_tokens": True}).json()["tokens"][0]
    banned = post(server, "/completion", {**greedy, "n_predict": 1, "return_tokens": True,
                                          "logit_bias": [[first, False]]}).json()
    assert banned["tokens"] and banned["tokens"][0] != first
    as_text = post(server, "/completion", {**greedy, "n_predict": 4, "logit_bias": [[" the", 50]]}).json()
    assert as_text["content"] == " the" * 4


@pytest.mark.parametrize("body,phrase", [
    ({"prompt": [-1]}, "prompt holds -1"),
    ({"prompt": []}, "The prompt is empty"),
    ({"n_predict": -3}, "n_predict must be a number of tokens >= 1"),
    ({"n_predict": None, "max_tokens": "x"}, "max_tokens must be a number of tokens"),
    ({"prompt": ["Once", " upon"]}, "a list of 2 texts is 2 prompts"),
    ({"top_p": 1.01}, "top_p must be in [0, 1]"),
    ({"repeat_penalty": 0}, "repeat_penalty must be a finite number greater than 0"),
    ({"mirostat": 2}, "no mirostat sampler"),
    ({"repeat_penalty": 1.1, "repeat_last_n": -2}, "repeat_last_n must be an integer >= -1"),
    ({"n_probs": 21}, "n_probs must be from 0 to 20"),
    ({"grammar": "root ::= nothing-defined"}, "grammar"),
    ({"logit_bias": [[1.5, 2]]}, "logit_bias[0]'s token must be a token id or a text, got 1.5"),
    ({"logit_bias": [[1, 2, 3]]}, "logit_bias[0] must be a pair"),
    ({"logit_bias": [[1, "x"]]}, "logit_bias[0]'s bias must be a number, or false"),
    ({"logit_bias": [[1, True]]}, "logit_bias[0]'s bias must be a number, or false"),
    ({"dry_multiplier": 0.8}, "dry_multiplier=0.8 is not supported"),
    ({"xtc_probability": 0.5}, "xtc_probability=0.5 is not supported"),
    ({"ignore_eos": True}, "ignore_eos=True is not supported"),
    ({"n_probs": 2, "post_sampling_probs": True}, "post_sampling_probs=True is not supported"),
    ({"n_predict": True}, "n_predict"),
    ({"prompt": [True, "hi"]}, "prompt"),
    ({"stream": "yes"}, "stream"),
    ({"stop": [""]}, "stop must be a list of non-empty strings"),
    ({"temperature": "hot"}, "temperature: Input should be a valid number"),
    ({"repeat_penalty": [1]}, "repeat_penalty: Input should be a valid number"),
])
def test_refusals_are_named(server, body, phrase):
    r = post(server, "/completion", {"prompt": PROMPT, "n_predict": 2, **body})
    assert r.status_code == 400 and phrase in r.json()["error"]["message"], r.text


def test_samplers_order_and_chain(server, client):
    """/completion samples in llama.cpp's order (the temperature last), the
    same tokens as the OpenAI route's temperature_last; `samplers` may put
    the temperature first (the OpenAI routes' order), and a sampler it
    leaves out is off."""
    body = {"prompt": PROMPT, "n_predict": 8, "seed": 3, "temperature": 1.6, "top_p": 0.6, "min_p": 0.05}
    openai_kw = dict(model=MODEL, prompt=PROMPT, max_tokens=8, seed=3, temperature=1.6, top_p=0.6)

    def text(**extra):
        return client.completions.create(**openai_kw, extra_body={"min_p": 0.05, **extra}).choices[0].text
    assert post(server, "/completion", body).json()["content"] == text(temperature_last=True) != text()
    first = {**body, "samplers": ["penalties", "temperature", "top_k", "top_p", "min_p"]}
    assert post(server, "/completion", first).json()["content"] == text()
    # llama.cpp's default chain, its off samplers included, is the default order
    full = {**body, "samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
                                 "temperature"]}
    assert post(server, "/completion", full).json()["content"] == text(temperature_last=True)
    # the same as letters, llama.cpp's default string ("e": the penalties, kept)
    penalized = {**body, "repeat_penalty": 1.5}
    assert post(server, "/completion", {**penalized, "samplers": "edskypmxt"}).json()["content"] == \
        post(server, "/completion", penalized).json()["content"] != post(server, "/completion", body).json()["content"]
    # top_p and min_p left out of the chain: off
    short = post(server, "/completion", {**body, "samplers": "kt"}).json()["content"]
    assert short == post(server, "/completion", {**body, "top_p": 1.0, "min_p": 0.0}).json()["content"]
    for samplers, says in ((["top_p", "top_k"], "is not an order goosedump applies"),
                           (["mirostat_v9"], "unknown sampler 'mirostat_v9'"), (7, "samplers must be")):
        r = post(server, "/completion", {**body, "samplers": samplers})
        assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
    props = httpx.get(server + "/props", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).json()
    assert props["default_generation_settings"]["params"]["samplers"] == ["penalties", "top_k", "top_p", "min_p",
                                                                          "temperature"]


def test_no_token_left_is_a_400(server, tiny_model):
    """A grammar whose one token the bias bans: no token is left. A 400 that
    says so, greedy or sampled (greedy had emitted token 0, the draw an id
    past the vocabulary: a 500); streamed, an error event."""
    body = {"prompt": PROMPT, "n_predict": 3, "grammar": 'root ::= "q"', "logit_bias": [["q", False]]}
    for t in (0, 1.0):
        r = post(server, "/completion", {**body, "temperature": t})
        assert r.status_code == 400 and "no token is left to choose" in r.json()["error"]["message"], r.text
    events = stream(server, {**body, "temperature": 1.0})
    assert "no token is left to choose" in json.dumps(events[-1])
    assert post(server, "/completion", {"prompt": PROMPT, "n_predict": 2}).status_code == 200   # the server goes on
    # an OpenAI stream (a -Infinity bias, as Python's JSON reads it): the request's error, not the server's
    events = no_token_left_stream(server, "/v1/completions", tiny_model.tokenizer, {"prompt": "Once", "max_tokens": 3})
    error = events[-1]["error"]
    assert error["type"] == "invalid_request_error" and "no token is left to choose" in error["message"], events


def test_llama_servers_aliases_are_the_routes_they_name(server, client):
    """llama-server's names without /v1 (a client given the server's root as
    its base URL uses them): /chat/completions, /responses, /models, the
    input-token counts, /v1/health, and /completions as llama.cpp's own
    /completion. Each answers as its route does, with the key required
    where the route requires it, and is counted as that route."""
    import openai
    from test_server import metrics
    with openai.OpenAI(base_url=server, api_key=KEY, max_retries=0, timeout=60) as root:
        kw = dict(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, seed=4, temperature=0.7)
        before = metrics(server).get('goosedump_requests_total{endpoint="/v1/chat/completions",status="200"}', 0)
        assert root.chat.completions.create(**kw).choices[0].message == client.chat.completions.create(
            **kw).choices[0].message
        after = metrics(server)['goosedump_requests_total{endpoint="/v1/chat/completions",status="200"}']
        assert after == before + 2
        assert [m.id for m in root.models.list()] == [MODEL]
        kw = dict(model=MODEL, input="Hi", max_output_tokens=8, temperature=0)
        assert root.responses.create(**kw).output_text == client.responses.create(**kw).output_text
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
    assert post(server, "/chat/completions/input_tokens", body).json() == \
        post(server, "/v1/chat/completions/input_tokens", body).json()
    assert httpx.get(server + "/v1/health", timeout=10).json() == httpx.get(server + "/health", timeout=10).json()
    assert post(server, "/completions", BODY).json()["tokens"] == post(server, "/completion", BODY).json()["tokens"]
    for path in ("/chat/completions", "/completions", "/responses"):
        r = post(server, path, body, key=None)
        assert r.status_code == 401, (path, r.status_code)
    assert post(server, "/chat/completions", {"model": MODEL, "messages": []}).json()["error"]["param"] == "messages"


def test_limits_as_llama_server_reads_them(server, tiny_model):
    """n_predict is a most (past the context the answer stops where it is
    full); max_tokens where n_predict is not given; 0 evaluates the prompt
    alone (the next request with it finds it cached); a null stop is none;
    predicted_per_second is predicted_n over predicted_ms."""
    n_prompt = len(tiny_model.tokenizer.encode(PROMPT))
    r = post(server, "/completion", {"prompt": PROMPT, "n_predict": 10 ** 6, "temperature": 0}).json()
    assert (r["stop_type"], r["tokens_predicted"]) == ("limit", CTX - n_prompt), r["tokens_predicted"]
    t = r["timings"]
    assert abs(t["predicted_per_second"] - t["predicted_n"] / t["predicted_ms"] * 1e3) < 1e-6 * t["predicted_per_second"]
    assert post(server, "/completion", {"prompt": PROMPT, "max_tokens": 3}).json()["tokens_predicted"] == 3
    assert post(server, "/completion", {"prompt": PROMPT, "n_predict": 2, "max_tokens": 5,
                                        "stop": None}).json()["tokens_predicted"] == 2
    # top_n_sigma at or below 0 is off, as llama.cpp applies it (SillyTavern sends 0 by default), here and on /v1
    for value in (0, 0.0, -1):
        assert post(server, "/completion", {"prompt": PROMPT, "n_predict": 1, "top_n_sigma": value}).status_code == 200
        assert post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1,
                                                "top_n_sigma": value}).status_code == 200
    prompt = PROMPT + " in a land far away"
    warm = post(server, "/completion", {"prompt": prompt, "n_predict": 0, "n_probs": 2, "return_tokens": True}).json()
    assert (warm["content"], warm["tokens"], warm["tokens_predicted"], warm["stop_type"]) == ("", [], 0, "limit")
    assert warm["completion_probabilities"] == [] and warm["timings"]["predicted_n"] == 0
    assert warm["tokens_evaluated"] == len(tiny_model.tokenizer.encode(prompt))
    after = post(server, "/completion", {"prompt": prompt + " there lived", "n_predict": 1}).json()
    assert after["tokens_cached"] >= warm["tokens_evaluated"] - 1, after
    events = stream(server, {"prompt": prompt, "n_predict": 0})
    assert len(events) == 1 and events[0]["stop"] and events[0]["content"] == "" and events[0]["tokens_predicted"] == 0


def test_probs_end_with_the_tokens_a_stop_word_kept(server):
    """The engine may make a token or more past a stop word before it hears
    of it: n_probs has one entry per token returned, whole and streamed."""
    greedy = {"prompt": PROMPT, "n_predict": 30, "temperature": 0}
    text = post(server, "/completion", greedy).json()["content"]
    k = next(k for k in range(len(text) // 2, len(text) - 4) if text.find(text[k:k + 4]) == k and text[k:k + 4].strip())
    body = {**greedy, "stop": [text[k:k + 4]], "n_probs": 1, "return_tokens": True}
    r = post(server, "/completion", body).json()
    assert r["stop_type"] == "word" and len(r["completion_probabilities"]) == len(r["tokens"]) == r["tokens_predicted"]
    events = stream(server, body)
    assert sum(len(e.get("completion_probabilities", [])) for e in events) == events[-1]["tokens_predicted"]
