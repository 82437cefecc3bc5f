"""Choosing the next token from the logits: a pure function of the logits,
the tokens so far, the parameters and a seeded generator.

Order of operations, as transformers and vLLM apply them:
  1. logit bias (added), then penalties: repetition (HF/CTRL style: a seen
     token's positive logit is divided by it, a negative one multiplied; over
     the prompt and the output), presence and frequency (OpenAI's formula,
     logit - presence * [count > 0] - frequency * count, over the output);
     with repeat_last_n (llama.cpp's and ollama's window), all three over
     the last repeat_last_n tokens of the prompt and output (-1: all, 0: none);
  2. temperature 0: the argmax, done;
  3. logits / temperature, then top-k, top-p (the smallest set of most
     likely tokens whose mass reaches p), min-p (tokens at least min_p times
     as likely as the most likely one), each on the tempered distribution;
     with temperature_last (llama.cpp's order, which its /completion takes),
     top-k, top-p and min-p on the untempered distribution, then the
     temperature on what they leave;
  4. a draw from what is left, renormalised.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import math

import numpy as np

# top-p looks for the nucleus among this many best tokens first and sorts the
# whole vocabulary only when their mass falls short (exact either way).
_NUCLEUS_FIRST = 1024


class SamplingError(ValueError):
    pass


class NoTokenLeft(SamplingError):
    """Every token excluded (logit_bias bans, a grammar, the reply's format):
    the generation cannot go on."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0     # 0: greedy
    top_k: int = 0               # 0: off
    top_p: float = 1.0           # 1: off; 0: the most likely token only
    min_p: float = 0.0           # 0: off
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict = field(default_factory=dict)   # token id -> added to its logit
    seed: int | None = None      # None (or -1, llama.cpp's spelling): fresh entropy
    temperature_last: bool = False   # llama.cpp's order: top-k/p, min-p before the temperature
    repeat_last_n: int | None = None     # llama.cpp's penalty window (None: transformers' and OpenAI's)

    def __post_init__(self):
        if self.seed == -1 and not isinstance(self.seed, bool):
            object.__setattr__(self, "seed", None)
        if self.top_k == -1 and not isinstance(self.top_k, bool):     # (vLLM's off, which its clients send)
            object.__setattr__(self, "top_k", 0)

        def check(name, ok, expected):
            if not ok:
                raise SamplingError(f"{name} must be {expected}, got {getattr(self, name)!r}")
        num = (int, float)
        check("temperature", isinstance(self.temperature, num) and 0 <= self.temperature <= 100, "between 0 and 100")
        check("top_k", isinstance(self.top_k, int) and self.top_k >= 0, "an integer >= 0 (0 or -1: off)")
        check("top_p", isinstance(self.top_p, num) and 0 <= self.top_p <= 1, "in [0, 1]")
        check("min_p", isinstance(self.min_p, num) and 0 <= self.min_p <= 1, "in [0, 1]")
        check("repetition_penalty", isinstance(self.repetition_penalty, num) and 0 < self.repetition_penalty
              and math.isfinite(self.repetition_penalty), "a finite number greater than 0 (1: off)")
        check("presence_penalty", isinstance(self.presence_penalty, num) and -2 <= self.presence_penalty <= 2,
              "between -2 and 2")
        check("frequency_penalty", isinstance(self.frequency_penalty, num) and -2 <= self.frequency_penalty <= 2,
              "between -2 and 2")
        check("logit_bias", isinstance(self.logit_bias, dict), "a mapping of token id to bias")
        check("repeat_last_n", self.repeat_last_n is None or (isinstance(self.repeat_last_n, int)
                                                               and not isinstance(self.repeat_last_n, bool)
                                                               and self.repeat_last_n >= -1),
              "an integer >= -1 (-1: the whole context, 0: no penalties)")
        check("seed", self.seed is None or (isinstance(self.seed, int) and self.seed >= 0),
              "an integer >= 0 (-1 or none: a fresh seed)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def plain_greedy(self) -> bool:
        """Greedy with nothing that changes the logits: the fused argmax over
        the output head gives the same token without materialising logits."""
        return (self.greedy and not self.logit_bias and self.repetition_penalty == 1
                and self.presence_penalty == 0 and self.frequency_penalty == 0)

    def check_vocab(self, n_vocab: int) -> None:
        for t, b in self.logit_bias.items():
            try:
                tid = int(t)
            except (TypeError, ValueError):
                raise SamplingError(f"logit_bias key {t!r} is not a token id") from None
            if not 0 <= tid < n_vocab:
                raise SamplingError(f"logit_bias token id {tid} is outside the vocabulary (0..{n_vocab - 1})")
            if isinstance(b, bool) or not isinstance(b, (int, float)) or not (-100 <= b <= 100 or b == -math.inf):
                raise SamplingError(f"logit_bias for token {tid} must be a number in [-100, 100] (or -inf: never "
                                    f"this token), got {b!r}")


GREEDY = SamplingParams(temperature=0.0)
# The order of the samplers, in llama.cpp's names, as each order applies them
SAMPLER_ORDER = ("penalties", "temperature", "top_k", "top_p", "min_p")
SAMPLER_ORDER_TEMPERATURE_LAST = ("penalties", "top_k", "top_p", "min_p", "temperature")


def adjust_logits(logits: np.ndarray, p: SamplingParams, prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
    """Step 1: bias and penalties, on a float64 copy."""
    x = logits.astype(np.float64)
    for t, b in p.logit_bias.items():
        x[int(t)] += b
    if p.repeat_last_n is not None:
        return _penalize_window(x, p, prompt, output)
    if p.repetition_penalty != 1:
        seen = np.unique(np.concatenate([prompt, output]).astype(np.int64))
        v = x[seen]
        x[seen] = np.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and len(output):
        ids, counts = np.unique(output.astype(np.int64), return_counts=True)
        x[ids] -= p.presence_penalty + p.frequency_penalty * counts
    return x


def _penalize_window(x: np.ndarray, p: SamplingParams, prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
    """llama.cpp's penalties: each token's count in the last repeat_last_n
    tokens of prompt and output; a counted token's logit divided by the
    repetition penalty (multiplied where not positive), then less presence
    plus frequency times its count."""
    n = p.repeat_last_n
    if n == 0 or (p.repetition_penalty == 1 and not p.presence_penalty and not p.frequency_penalty):
        return x
    window = np.concatenate([prompt[-n:] if n > 0 else prompt, output]).astype(np.int64)
    if n > 0:
        window = window[-n:]
    if not len(window):
        return x
    ids, counts = np.unique(window, return_counts=True)
    v = x[ids]
    if p.repetition_penalty != 1:
        v = np.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
    x[ids] = v - (p.presence_penalty + p.frequency_penalty * counts)
    return x


def distribution(x: np.ndarray, p: SamplingParams) -> tuple[np.ndarray | None, np.ndarray]:
    """Step 3: the candidate token ids (None: the whole vocabulary, in order)
    and their probabilities (summing to 1) after temperature, top-k, top-p
    and min-p. x: adjusted logits."""
    ids = None
    if p.top_k and p.top_k < len(x):
        ids = np.argpartition(-x, p.top_k - 1)[:p.top_k]
        x = x[ids]
    probs = _softmax(x, 1.0 if p.temperature_last else p.temperature)
    keep = None
    if p.top_p < 1:
        order = _descending(probs, p.top_p)
        cum = np.cumsum(probs[order])
        keep = order[:int(np.searchsorted(cum, p.top_p)) + 1]    # the first prefix reaching p
    if p.min_p > 0:
        big = np.flatnonzero(probs >= p.min_p * probs.max())
        keep = big if keep is None else np.intersect1d(keep, big)
    if keep is not None:
        ids = keep if ids is None else ids[keep]
        probs = probs[keep]
        x = x[keep]
        probs = probs / probs.sum()
    if p.temperature_last and p.temperature != 1:
        probs = _softmax(x, p.temperature)
    return ids, probs


def _softmax(x: np.ndarray, temperature: float) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x / temperature
        if not np.isfinite(z.max()):    # a temperature so small that x / T overflows (or every logit
            # underflows to -inf): shift first, the largest to 0
            z = (x - x.max()) / temperature
    probs = np.exp(z - z.max())
    return probs / probs.sum()


def _descending(probs: np.ndarray, mass: float) -> np.ndarray:
    """Indices of probs in descending order, as far as the nucleus needs."""
    if len(probs) > _NUCLEUS_FIRST:
        top = np.argpartition(-probs, _NUCLEUS_FIRST - 1)[:_NUCLEUS_FIRST]
        top = top[np.argsort(-probs[top], kind="stable")]
        if probs[top].sum() >= mass:
            return top
    return np.argsort(-probs, kind="stable")


def sample(logits: np.ndarray, p: SamplingParams, rng: np.random.Generator,
           prompt: np.ndarray | None = None, output: np.ndarray | None = None) -> int:
    """The next token id."""
    prompt = np.empty(0, np.int64) if prompt is None else np.asarray(prompt)
    output = np.empty(0, np.int64) if output is None else np.asarray(output)
    x = adjust_logits(logits, p, prompt, output)
    if p.greedy:
        return best(x)
    if not x.max() > -np.inf:
        raise NoTokenLeft(NO_TOKEN_LEFT)
    ids, probs = distribution(x, p)
    # inverse CDF with one uniform draw: one draw per token keeps seeded runs
    # reproducible. The draw is scaled to the sum as rounded, so that it never
    # falls past the end onto a token of probability 0 (a masked one).
    cum = np.cumsum(probs)
    i = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
    return int(ids[i]) if ids is not None else i


NO_TOKEN_LEFT = ("no token is left to choose: logit_bias, the grammar or the reply's format excludes every one "
                 "(or the model's logits are not numbers)")


def best(x: np.ndarray) -> int:
    """The argmax of x, lowest id among equals; NoTokenLeft if every value is
    -inf or NaN (np.argmax would name an excluded token)."""
    t = int(np.argmax(x))
    if not x[t] > -np.inf:
        raise NoTokenLeft(NO_TOKEN_LEFT)
    return t


def make_rng(p: SamplingParams) -> np.random.Generator:
    return np.random.default_rng(p.seed)
