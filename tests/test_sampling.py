"""Sampling against transformers' logits processors: the candidate
distribution equals theirs, and draws follow it (chi-square)."""
import math

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from goosedump.sampling import SamplingError, SamplingParams, adjust_logits, distribution, make_rng, sample

V = 3000   # above the nucleus search's first cut, so both of its paths run


def fixed_logits(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(V) * 2.5).astype(np.float32)


def reference(logits, p: SamplingParams, prompt=()):
    """The distribution transformers samples from, in the same order."""
    x = torch.tensor(logits, dtype=torch.float64)[None]
    ids = torch.tensor([list(prompt)], dtype=torch.long) if len(prompt) else torch.zeros((1, 0), dtype=torch.long)
    if p.repetition_penalty != 1:
        x = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(ids, x)
    if not p.temperature_last:
        x = TemperatureLogitsWarper(p.temperature)(ids, x)
    if p.top_k:
        x = TopKLogitsWarper(p.top_k)(ids, x)
    if p.top_p < 1:
        x = TopPLogitsWarper(p.top_p)(ids, x)
    if p.min_p > 0:
        x = MinPLogitsWarper(p.min_p)(ids, x)
    if p.temperature_last:        # llama.cpp's order: the temperature on what the filters left
        x = TemperatureLogitsWarper(p.temperature)(ids, x)
    return torch.softmax(x, -1)[0].numpy()


def dense(ids, probs):
    out = np.zeros(V)
    out[np.arange(V) if ids is None else ids] = probs
    return out


def chi_square_ok(counts, expected_probs, alpha_z=3.72):
    """Pearson's chi-square against expected probabilities, cells with an
    expected count below 5 pooled; the critical value for p = 1e-4 by
    Wilson-Hilferty."""
    n = counts.sum()
    exp = expected_probs * n
    big = exp >= 5
    obs = np.append(counts[big], counts[~big].sum())
    e = np.append(exp[big], exp[~big].sum())
    if e[-1] < 5:   # fold the pooled remainder into the largest cell
        obs[np.argmax(e[:-1])] += obs[-1]
        e[np.argmax(e[:-1])] += e[-1]
        obs, e = obs[:-1], e[:-1]
    assert counts[expected_probs == 0].sum() == 0, "drew a token the distribution excludes"
    stat = float(((obs - e) ** 2 / e).sum())
    df = len(e) - 1
    crit = df * (1 - 2 / (9 * df) + alpha_z * math.sqrt(2 / (9 * df))) ** 3
    return stat < crit, stat, crit


CASES = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.3, top_k=40),
    SamplingParams(temperature=1.0, top_p=0.9),
    SamplingParams(temperature=0.8, top_p=0.999),     # nucleus beyond the first 1024: full sort
    SamplingParams(temperature=1.0, min_p=0.05),
    SamplingParams(temperature=1.2, top_k=100, top_p=0.8, min_p=0.02),
    SamplingParams(temperature=1.0, top_p=0.5, repetition_penalty=1.3),
    SamplingParams(temperature=1.7, top_k=100, top_p=0.8, min_p=0.02, temperature_last=True),
    SamplingParams(temperature=0.6, top_p=0.9, temperature_last=True),
    SamplingParams(temperature=1.0, top_p=0.0),       # the most likely token only
]


@pytest.mark.parametrize("p", CASES, ids=[str(i) for i in range(len(CASES))])
def test_distribution_equals_transformers(p):
    logits = fixed_logits()
    prompt = np.arange(0, V, 7)
    x = adjust_logits(logits, p, prompt, np.empty(0, np.int64))
    ours = dense(*distribution(x, p))
    ref = reference(logits, p, prompt)
    assert set(np.flatnonzero(ours)) == set(np.flatnonzero(ref))
    np.testing.assert_allclose(ours, ref, atol=1e-9, rtol=1e-6)


@pytest.mark.parametrize("p", CASES[:7], ids=[str(i) for i in range(7)])
def test_draws_follow_the_distribution(p):
    logits = fixed_logits(1)
    rng = make_rng(SamplingParams(seed=123))
    draws = np.array([sample(logits, p, rng) for _ in range(20000)])
    expected = reference(logits, p)
    ok, stat, crit = chi_square_ok(np.bincount(draws, minlength=V).astype(float), expected)
    assert ok, f"chi-square {stat:.1f} over the critical {crit:.1f}"


def test_chi_square_has_power():
    """The check rejects draws from the distribution before top-p: it can fail."""
    logits = fixed_logits(1)
    loose, tight = SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, top_p=0.9)
    rng = np.random.default_rng(5)
    draws = np.array([sample(logits, loose, rng) for _ in range(20000)])
    counts = np.bincount(draws, minlength=V).astype(float)
    with pytest.raises(AssertionError, match="excludes"):
        chi_square_ok(counts, reference(logits, tight))
    # and a milder error, temperature 1.1 instead of 1.0, is caught too
    ok, _, _ = chi_square_ok(counts, reference(logits, SamplingParams(temperature=1.1)))
    assert not ok


def test_greedy_is_argmax_after_bias_and_penalties():
    logits = fixed_logits()
    best = int(np.argmax(logits))
    assert sample(logits, SamplingParams(temperature=0), None) == best
    second = int(np.argsort(-logits)[1])
    assert sample(logits, SamplingParams(temperature=0, logit_bias={best: -100}), None) == second
    # a strong repetition penalty on the best token moves greedy to the next
    assert sample(logits, SamplingParams(temperature=0, repetition_penalty=100.0), None,
                  prompt=np.array([best])) == second


def test_presence_and_frequency_follow_openai_formula():
    logits = np.zeros(10, np.float32)
    out = np.array([3, 3, 3, 5])
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    x = adjust_logits(logits, p, np.empty(0, np.int64), out)
    expected = np.zeros(10)
    expected[3] = -(0.5 + 0.25 * 3)
    expected[5] = -(0.5 + 0.25 * 1)
    np.testing.assert_allclose(x, expected)


def test_seed_reproduces_and_differs():
    logits = fixed_logits()
    p = SamplingParams(temperature=1.0, seed=42)
    a = [sample(logits, p, r) for r in [make_rng(p)] for _ in range(50)]
    b = [sample(logits, p, r) for r in [make_rng(p)] for _ in range(50)]
    c = [sample(logits, p, r) for r in [make_rng(SamplingParams(seed=43))] for _ in range(50)]
    assert a == b and a != c


def test_seed_minus_one_is_a_fresh_seed():
    assert SamplingParams(seed=-1).seed is None and SamplingParams(seed=0).seed == 0


@pytest.mark.parametrize("kw,msg", [
    ({"temperature": -1}, "temperature must be between 0 and 100, got -1"),
    ({"top_p": -0.1}, "top_p must be in \\[0, 1\\], got -0.1"),
    ({"top_k": -3}, "top_k must be an integer >= 0"),
    ({"min_p": 1.5}, "min_p must be in \\[0, 1\\], got 1.5"),
    ({"repetition_penalty": 0}, "repetition_penalty must be a finite number greater than 0"),
    ({"repetition_penalty": math.inf}, "repetition_penalty must be a finite number greater than 0"),
    ({"presence_penalty": 3}, "presence_penalty must be between -2 and 2, got 3"),
    ({"seed": "x"}, "seed must be an integer >= 0"),
    ({"repeat_last_n": -2}, "repeat_last_n must be an integer >= -1"),
    ({"seed": -5}, "seed must be an integer >= 0 \\(-1 or none: a fresh seed\\), got -5"),
])
def test_bad_parameters_are_named(kw, msg):
    with pytest.raises(SamplingError, match=msg):
        SamplingParams(**kw)


def test_top_k_minus_one_is_off_as_vllm_reads_it():
    assert SamplingParams(top_k=-1) == SamplingParams(top_k=0) and SamplingParams(top_k=-1).top_k == 0
    with pytest.raises(SamplingError, match="0 or -1: off"):
        SamplingParams(top_k=-2)


def test_logit_bias_checked_against_vocabulary():
    with pytest.raises(SamplingError, match="logit_bias token id 5000 is outside the vocabulary"):
        SamplingParams(logit_bias={5000: 1}).check_vocab(V)
    with pytest.raises(SamplingError, match="logit_bias for token 3 must be a number in \\[-100, 100\\]"):
        SamplingParams(logit_bias={3: 500}).check_vocab(V)


def llama_penalties(logits, p, history):
    """llama.cpp's penalties sampler (llama_sampler_penalties_apply), token
    by token: counts over the last repeat_last_n tokens; a counted token's
    logit multiplied by the penalty where <= 0, else divided; then less
    count * frequency + presence."""
    n = p.repeat_last_n
    window = [] if n == 0 else list(history)[-n:] if n > 0 else list(history)
    counts = {}
    for t in window:
        counts[t] = counts.get(t, 0) + 1
    out = [float(v) for v in logits]
    for t, c in counts.items():
        v = out[t]
        v = v * p.repetition_penalty if v <= 0 else v / p.repetition_penalty
        out[t] = v - (c * p.frequency_penalty + p.presence_penalty)
    return np.array(out)


@pytest.mark.parametrize("n", [-1, 0, 1, 5, 64, 10_000])
def test_repeat_last_n_is_llama_cpps_window(n):
    logits = fixed_logits(3)
    rng = np.random.default_rng(n + 7)
    prompt, output = rng.integers(0, 40, 50), rng.integers(0, 40, 30)      # repeats in both
    p = SamplingParams(repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.25, repeat_last_n=n)
    ours = adjust_logits(logits, p, prompt, output)
    np.testing.assert_allclose(ours, llama_penalties(logits, p, np.concatenate([prompt, output])), rtol=1e-12)
    if n not in (0,):
        # not the default's (prompt counted for presence and frequency, or a window)
        assert not np.allclose(ours, adjust_logits(logits, SamplingParams(
            repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.25), prompt, output))


def test_temperature_last_is_llama_cpps_order_on_a_known_case():
    """p = .5/.3/.15/.05, T = 2, top-p .75: llama.cpp keeps the two tokens
    whose untempered mass reaches .75, then tempers them: sqrt(.5) : sqrt(.3)."""
    x = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    ids, probs = distribution(x, SamplingParams(temperature=2, top_p=0.75, temperature_last=True))
    want = np.sqrt([0.5, 0.3]) / np.sqrt([0.5, 0.3]).sum()
    assert sorted(ids) == [0, 1]
    np.testing.assert_allclose(probs[np.argsort(ids)], want, rtol=1e-12)
    ids, _ = distribution(x, SamplingParams(temperature=2, top_p=0.75))    # tempered first: three tokens
    assert sorted(ids) == [0, 1, 2]


def test_no_token_left_is_an_error_not_an_excluded_token():
    """Every token excluded (bans, a grammar): NoTokenLeft, greedy or not
    (np.argmax had named token 0, the draw an id past the vocabulary)."""
    from goosedump.sampling import NoTokenLeft
    x = np.full(V, -np.inf, np.float32)
    for p in (SamplingParams(temperature=0), SamplingParams(temperature=1.0, seed=1)):
        with pytest.raises(NoTokenLeft, match="no token is left to choose"):
            sample(x, p, make_rng(p))
    banned = SamplingParams(temperature=0.5, logit_bias={t: -math.inf for t in range(V)})
    with pytest.raises(NoTokenLeft):
        sample(fixed_logits(), banned, make_rng(banned))


def test_a_tiny_temperature_on_negative_logits_is_the_argmax():
    x = np.full(V, -100.0)
    x[17] = -99.0
    for t in (1e-308, 1e-30):
        p = SamplingParams(temperature=t, seed=0)
        assert sample(x, p, make_rng(p)) == 17
