"""Chat turns through the engine: KV cache reuse across turns (equal to a
cold run), seeded sampling, cancellation."""
import numpy as np
import pytest

import goosedump
from goosedump.sampling import SamplingParams

DATE = "2025-06-28"


@pytest.fixture()
def model(tiny_path):
    m = goosedump.load(tiny_path)
    yield m
    m.close()


def test_second_turn_prefills_only_new_tokens_and_equals_cold_run(model, tiny_path):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    first = model.chat(messages, max_tokens=12, date=DATE)
    cache_tokens = list(model._cache.tokens)
    messages += [first.reply.to_message(), {"role": "user", "content": "And another one?"}]
    second = model.chat(messages, max_tokens=12, date=DATE)
    prompt = second.result.prompt_token_ids
    common = next(i for i, (a, b) in enumerate(zip(cache_tokens + [-1], prompt)) if a != b)
    assert second.result.cached_tokens == common > len(first.result.prompt_token_ids) // 2
    assert second.result.profile is None
    # the prefill ran only the new tokens: that is all the cache gained
    assert model._cache.tokens[:len(prompt)] == prompt
    with goosedump.load(tiny_path) as cold:
        ref = cold.chat(messages, max_tokens=12, date=DATE)
    assert ref.result.cached_tokens == 0
    assert second.result.token_ids == ref.result.token_ids
    assert second.result.prompt_token_ids == ref.result.prompt_token_ids


def test_rewind_after_decoding_wrapped_the_sliding_rings(model):
    """A turn that decoded past the sliding window's ring: the next turn still
    reuses the previous prompt, from the window saved at its end, and the new
    tokens' logits equal a cold run's."""
    tr = model.transformer
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 199_000, 60), rng.integers(0, 199_000, 30)
    cache = model.new_cache(512)
    assert cache.rings, "the tiny model has sliding layers with rings shorter than the context"
    ring = len(cache.k[cache.rings[0][0]])
    generated = rng.integers(0, 199_000, 2 * ring)      # wraps every ring
    tr.forward(a, cache)
    cache.save_window()
    tr.forward(generated, cache)
    assert cache.reuse(np.concatenate([a, b])) == len(a)
    warm = tr.head.logits(tr.forward(b, cache))
    cold = tr.head.logits(tr.forward(np.concatenate([a, b]), model.new_cache(512)))[len(a):]
    np.testing.assert_array_equal(warm, cold)     # kernels are batch-invariant: equal bits


def test_rewind_without_saved_window_starts_over(model):
    tr = model.transformer
    cache = model.new_cache(512)
    a = np.arange(1000, 1060)
    tr.forward(a, cache)
    ring = len(cache.k[cache.rings[0][0]])
    tr.forward(np.arange(2000, 2000 + 2 * ring), cache)
    assert cache.reuse(np.concatenate([a, [5, 6]])) == 0     # the rings lost a's window: recompute
    assert cache.n == 0 and cache.tokens == []
    # a short rewind stays within the ring and is kept
    tr.forward(a, cache)
    tr.forward(np.arange(3000, 3010), cache)
    assert cache.reuse(np.concatenate([a, [7]])) == len(a)


def test_seeded_sampling_reproduces(model):
    prompt = "Once upon a time"
    p = SamplingParams(temperature=1.0, top_p=0.95, seed=7)
    a = model.generate(prompt, max_tokens=16, sampling=p)
    b = model.generate(prompt, max_tokens=16, sampling=p)
    c = model.generate(prompt, max_tokens=16, sampling=SamplingParams(temperature=1.0, top_p=0.95, seed=8))
    assert a.token_ids == b.token_ids != c.token_ids
    greedy = model.generate(prompt, max_tokens=16)
    # temperature 0 with a penalty runs the logits path: without one it equals the fused argmax
    assert model.generate(prompt, max_tokens=16, sampling=SamplingParams(temperature=0, logit_bias={0: 0.0})
                          ).token_ids == greedy.token_ids


def test_logit_bias_bans_a_token(model):
    greedy = model.generate("Hello there", max_tokens=8)
    banned = greedy.token_ids[0]
    r = model.generate("Hello there", max_tokens=8, sampling=SamplingParams(temperature=0, logit_bias={banned: -100}))
    assert banned not in r.token_ids


def test_cancel_stops_before_the_next_token(model):
    gen = model.generate_stream("Count with me", max_tokens=50)
    pieces = []
    for token, piece in gen.events():
        pieces.append(token)
        if len(pieces) == 3:
            gen.cancel("client_gone")
    assert gen.result.stop_reason == "client_gone" and gen.result.generated_tokens == 3


def test_chat_stream_deltas_add_up_to_the_reply(model):
    # The random model writes no channel headers of its own: a JSON schema
    # makes it open a channel (some seeds pick analysis) and a reasoning
    # budget ends the analysis, so the reply holds reasoning and an answer.
    for seed in range(16):
        stream = model.chat_stream([{"role": "user", "content": "Hi"}], max_tokens=60, date=DATE,
                                   sampling=SamplingParams(temperature=1.0, seed=seed), json_schema='{"type": "object"}',
                                   reasoning_budget=20)
        deltas = [e for e in stream if e.what == "delta"]
        r = stream.reply
        if r.reasoning_content and r.content:
            break
    else:
        pytest.fail("no seed of 16 gave a reply with reasoning and an answer")
    assert [m.channel for m in r.messages] == ["analysis", "final"]
    assert "".join(d.text for d in deltas if d.item.kind == "reasoning") == r.reasoning_content
    assert "".join(d.text for d in deltas if d.item.kind == "content") == r.content
    parsed = "".join(m.text for m in r.messages)
    assert "".join(d.text for d in deltas) == parsed
    assert stream.result.prompt_token_ids[-2:] == model.tokenizer.encode("<|start|>assistant", allow_special=True)


def test_short_malformed_answer_still_reaches_the_reader(model):
    """Random weights never write a harmony header: a short answer that never
    reached <|message|> comes out at the end, as one delta."""
    stream = model.chat_stream([{"role": "user", "content": "Hi"}], max_tokens=5, date=DATE)
    deltas = [e for e in stream if e.what == "delta"]
    assert stream.result.generated_tokens == 5
    text = "".join(m.text for m in stream.reply.messages)
    assert text and "".join(d.text for d in deltas) == text == stream.reply.content
