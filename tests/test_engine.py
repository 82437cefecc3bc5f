"""The engine: queued requests, decoded together, each equal to its answer
alone; cancellation; errors before queueing."""
import dataclasses
import threading

import numpy as np
import pytest

import goosedump
from goosedump.engine import Engine
from goosedump.generate import ContextOverflowError
from goosedump.sampling import SamplingError, SamplingParams

TEXTS = ["hello world", "The cat sat on the", "Once upon a time there was", "x", "1 2 3 4 5 6"]


@pytest.fixture(scope="module")
def model(tiny_path):
    m = goosedump.load(tiny_path)
    yield m
    m.close()


def alone(model, prompt, n, sampling=None):
    return model.generate(prompt, n, sampling=sampling, reuse_cache=False).token_ids


def test_batched_requests_equal_their_answers_alone(model):
    prompts = [model.tokenizer.encode(t) for t in TEXTS]
    # mixed in one batch: greedy, seeded sampling with different knobs, a penalty
    samplers = [None, SamplingParams(temperature=1.0, seed=1), SamplingParams(temperature=0.7, top_p=0.9, seed=2),
                SamplingParams(temperature=0, repetition_penalty=1.3), SamplingParams(temperature=1.2, top_k=40, seed=3)]
    want = [alone(model, p, 24, s) for p, s in zip(prompts, samplers)]
    engine = Engine(model, max_batch=4)
    try:
        reqs = [engine.submit(p, 24, sampling=s) for p, s in zip(prompts, samplers)]
        got = [r.wait().token_ids for r in reqs]
        assert got == want
        # the steps decoded several requests each: they were batched
        assert engine.batched_tokens > engine.steps > 0
        assert max(engine.batched_tokens / engine.steps, 1) > 1.5
        assert all(r.result.text == model.tokenizer.decode(r.result.token_ids) for r in reqs)
    finally:
        engine.close()


def test_streamed_events_spell_the_text_and_fifo_order(model):
    engine = Engine(model, max_batch=1)
    try:
        done = []
        reqs = [engine.submit(model.tokenizer.encode(t), 8) for t in TEXTS]

        def consume(r):
            pieces = [p for _, p in r.events()]
            assert "".join(pieces) == r.result.text
            done.append(r.id)
        threads = [threading.Thread(target=consume, args=(r,)) for r in reqs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        # one at a time, first come first served: they start in submission order
        starts = [r.started for r in reqs]
        assert starts == sorted(starts)
    finally:
        engine.close()


def test_cancel_stops_a_running_request_and_a_waiting_one(model):
    engine = Engine(model, max_batch=1)
    try:
        long = engine.submit(model.tokenizer.encode("go on"), 400, sampling=SamplingParams(temperature=1, seed=0))
        waiting = engine.submit(model.tokenizer.encode("later"), 400)
        waiting.cancel("client_gone")
        first = next(long.events())
        assert first is not None
        long.cancel("disconnected")
        r = long.wait()
        assert r.stop_reason == "disconnected" and r.generated_tokens < 400
        w = waiting.wait()
        assert w.stop_reason == "client_gone" and w.generated_tokens == 0
        assert waiting.cache is None      # it took no conversation's cache (nor wrote one to disk)
        # the engine serves the next request normally
        nxt = engine.submit(model.tokenizer.encode("hello world"), 6).wait()
        assert nxt.token_ids == alone(model, model.tokenizer.encode("hello world"), 6)
    finally:
        engine.close()


def test_a_generation_ends_once_and_says_so_whatever_its_end_raises(model):
    """The engine fails a step whose generation's end raised by ending it
    again: the second end changes nothing (the engine's bookkeeping had run
    twice, one cache kept for two later requests), and the consumer hears
    of the end either way (it had waited for ever)."""
    calls = []

    def before_end(g):
        calls.append(g)
        raise MemoryError("no room")
    gen = model.stepper.new(model.tokenizer.encode("hi"), 2, before_end=before_end)
    with pytest.raises(MemoryError):
        gen.end(None, RuntimeError("the first"))
    gen.end(None, RuntimeError("the second"))
    assert gen.done and len(calls) == 1
    with pytest.raises(RuntimeError, match="the first"):
        gen.wait()


def test_errors_are_raised_before_queueing(model):
    engine = Engine(model)
    try:
        with pytest.raises(ValueError, match="the prompt is empty"):
            engine.submit([], 4)
        with pytest.raises(ValueError, match="token id 999999 is outside the vocabulary"):
            engine.submit([1, 999999], 4)
        with pytest.raises(ContextOverflowError, match="exceeds the context"):
            engine.submit([1] * 10, model.n_ctx)
        with pytest.raises(SamplingError, match="logit_bias token id -5"):
            engine.submit([1, 2], 4, sampling=SamplingParams(logit_bias={-5: 1.0}))
        assert engine.queue_length == 0 and engine.completed == 0
    finally:
        engine.close()
    with pytest.raises(ValueError, match="max_batch must be at least 1"):
        Engine(model, max_batch=0)


def test_a_new_turn_reuses_an_idle_cache(model):
    engine = Engine(model, max_batch=2)
    try:
        first = model.tokenizer.encode("We talked about the weather in Oslo today")
        r1 = engine.submit(first, 6).wait()
        follow = first + r1.token_ids + model.tokenizer.encode(" and then?")
        r2 = engine.submit(follow, 6).wait()
        assert r2.cached_tokens >= len(first)
        assert r2.token_ids == alone(model, follow, 6)
        assert np.isfinite(engine.busy_seconds) and engine.completed == 2
    finally:
        engine.close()


def test_interleaved_conversations_keep_their_caches(model):
    """Two conversations sharing a system prompt, their turns interleaved: the
    second's first turn gets a cache of its own instead of overwriting the
    first's (which it would share only the system prompt with), so each next
    turn finds its whole previous prompt cached, and the answers stay equal
    to cold ones."""
    engine = Engine(model, max_batch=2)
    system = model.tokenizer.encode("You are a helpful assistant who answers briefly.")
    try:
        a = system + model.tokenizer.encode(" Tell me about Oslo.")
        ra = engine.submit(a, 4).wait()
        b = system + model.tokenizer.encode(" Tell me about Lima.")
        rb = engine.submit(b, 4).wait()
        a2 = a + ra.token_ids + model.tokenizer.encode(" More?")
        b2 = b + rb.token_ids + model.tokenizer.encode(" More?")
        ra2, rb2 = engine.submit(a2, 4).wait(), engine.submit(b2, 4).wait()
        assert ra2.cached_tokens >= len(a) and rb2.cached_tokens >= len(b)
        assert ra2.token_ids == alone(model, a2, 4) and rb2.token_ids == alone(model, b2, 4)
        # a third conversation with no room left takes the older cache (a's), not b's
        engine.submit(system + model.tokenizer.encode(" Tell me about Rome."), 4).wait()
        b3 = b2 + rb2.token_ids + model.tokenizer.encode(" Again?")
        assert engine.submit(b3, 4).wait().cached_tokens >= len(b2)
    finally:
        engine.close()


def test_conversations_with_the_same_turns_each_keep_their_cache(model):
    """A conversation's turns, then another's with the same turns (greedy: the
    same answers; test_replicas' sessions a and c when Ray puts both on one
    replica): each of the second's next turns continues its own cache's last
    prompt and takes that cache, where the first's cache shares a longer
    prefix but holds a later turn, so every turn after the first finds its
    whole previous prompt cached."""
    engine = Engine(model, max_batch=4)
    turns = [" Tell me about Oslo.", " More?", " Again?"]
    try:
        answers = {}
        for s in ("a", "c"):
            prompt, answers[s] = [], []
            for i, turn in enumerate(turns):
                before = prompt + answers[s][-1] if i else model.tokenizer.encode("You are brief.")
                previous, prompt = prompt, before + model.tokenizer.encode(turn)
                r = engine.submit(prompt, 4).wait()
                if i:
                    assert r.cached_tokens >= len(previous), (s, i, r.cached_tokens, len(previous))
                answers[s].append(r.token_ids)
        assert answers["a"] == answers["c"]
        assert answers["c"][-1] == alone(model, prompt, 4)
    finally:
        engine.close()


def test_a_batched_generation_is_profiled_like_a_lone_one(model):
    """The server's engine profiles through the same probe as the CLI: a
    request's profile splits its steps' time into parts that add up, while
    another request shares those steps unprofiled."""
    engine = Engine(model, max_batch=2)
    try:
        a = engine.submit(model.tokenizer.encode("Once upon a time"), 10, profile=True)
        b = engine.submit(model.tokenizer.encode("The cat sat on the"), 10)
        ra, rb = a.wait(), b.wait()
    finally:
        engine.close()
    assert rb.profile is None and ra.profile is not None
    assert ra.token_ids == alone(model, model.tokenizer.encode("Once upon a time"), 10)
    for phase, p in ra.profile["phases"].items():
        split = p["split"]
        assert sum(split["seconds"].values()) == pytest.approx(split["total_seconds"], rel=1e-9)
        assert split["seconds"]["experts"] > 0 and split["seconds"]["attn_proj"] > 0
    assert ra.profile["phases"]["decode"]["split"]["tokens"] == ra.decode_steps
    # the routing of this request's rows only: one row per token and layer
    decode = ra.profile["phases"]["decode"]["routing"]
    assert decode["selections"] == ra.decode_steps * model.config.n_layer * model.config.n_expert_used


def test_a_cancel_is_heard_between_the_layers_of_a_prefill(model, monkeypatch):
    """A client that leaves during a long prompt's prefill (minutes on a CPU,
    every other request waiting) stops it at the next layer; the cache keeps
    the passes done, its rings as they were there, so a retry prefills only
    the rest and answers as alone."""
    engine = Engine(model, max_batch=2)
    prompt = model.tokenizer.encode("a long prompt " * 40)
    assert len(prompt) > 96
    tr = model.stepper.tr
    monkeypatch.setattr(tr, "options", dataclasses.replace(tr.options, prefill_tokens=32))   # passes of 32
    real, seen, box, bound = tr.attention, [], {}, threading.Event()

    def attention(L, i, *a, **kw):
        seen.append(i)
        if i == 1 and seen.count(1) == 3:         # the client leaves in the third pass
            bound.wait(30)
            box["gen"].cancel("disconnected")
        return real(L, i, *a, **kw)
    try:
        monkeypatch.setattr(tr, "attention", attention)
        box["gen"] = gen = engine.submit(prompt, 8)
        bound.set()
        r = gen.wait()
        assert r.stop_reason == "disconnected" and r.generated_tokens == 0
        layers = len(tr.layers)
        assert seen == list(range(layers)) * 2 + [0, 1]      # two passes whole, the third to layer 1
        assert gen.cache.n == 64 and gen.cache.tokens == prompt[:64]
        monkeypatch.setattr(tr, "attention", real)
        again = engine.submit(prompt, 6).wait()
        assert again.cached_tokens == 64 and again.token_ids == alone(model, prompt, 6)
    finally:
        engine.close()


def test_one_generations_failure_ends_it_alone(model):
    """A generation whose constraint fails mid-answer ends with that error;
    the others decoded in the same batch go on, equal to their answers alone
    (the whole batch had failed with it)."""
    class Breaks:
        def __init__(self):
            self.calls = 0

        def allowed(self):
            self.calls += 1
            if self.calls == 3:
                raise RuntimeError("the grammar's matcher failed")
            return np.ones(model.config.n_vocab, bool)

        def advance(self, token):
            pass
    engine = Engine(model, max_batch=2)
    try:
        prompts = [model.tokenizer.encode(t) for t in ("hello world", "The cat sat on the")]
        broken = engine.submit(prompts[0], 8, constraint=Breaks())
        fine = engine.submit(prompts[1], 8)
        with pytest.raises(RuntimeError, match="matcher failed"):
            broken.wait()
        assert fine.wait().token_ids == alone(model, prompts[1], 8)
        assert engine.submit(prompts[0], 4).wait().token_ids == alone(model, prompts[0], 4)
    finally:
        engine.close()


def test_a_failing_end_callback_ends_its_generation_alone(model):
    """An on_event callback that raises at the end event had killed the
    worker: every other generation, and every later submit, waited for
    ever."""
    engine = Engine(model)
    try:
        def broken(gen, event):
            if event is None:
                raise RuntimeError("boom")
        good = engine.submit([976, 4853], 5)
        engine.submit([5, 77, 300], 5, on_event=broken)
        assert good.wait().generated_tokens == 5 and engine.alive
        assert engine.submit([976], 3).wait().generated_tokens == 3
    finally:
        engine.close()


@pytest.mark.parametrize("max_batch", [1, 4])
def test_close_ends_what_runs_and_what_waits(model, max_batch):
    """close() cancels the generations running and queued (their consumers
    had waited for ever; a full batch had run on to its limits first)."""
    engine = Engine(model, max_batch=max_batch)
    gens = [engine.submit([976, 4853], 3000 // 8) for _ in range(3)]
    while not any(g.started for g in gens):
        threading.Event().wait(0.01)
    engine.close()
    for g in gens:
        assert g.wait().stop_reason == "cancelled" and g.result.generated_tokens < 3000 // 8
    with pytest.raises(ValueError, match="max_batch must be at least 1"):
        Engine(model, max_batch=2.5)
