"""Log-probabilities of generated tokens, as OpenAI's APIs report them.

A token's log-probability is taken from the model's own distribution at its
position: the softmax of the logits over the vocabulary, UNUSED ids left out
(they are never picked), before anything the request does to choose a token
(logit bias, penalties, temperature, top-k/p, a grammar's mask), as vLLM and
OpenAI report them. So the numbers say what the model thought, whatever
picked the token; a forced token (a grammar, a bias) may carry a low one.
The normaliser is summed in float64 over the float32 logits.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

MAX_TOP = 20             # as OpenAI's top_logprobs


def check_logprobs(n, name: str = "logprobs") -> None:
    """None (off) or the number of alternatives per token, 0..MAX_TOP."""
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_TOP):
        raise ValueError(f"{name} must be a number of alternatives from 0 to {MAX_TOP} (or None: off), got {n!r}")


class TokenLogprob(NamedTuple):
    token: int
    logprob: float
    top: tuple            # ((token id, logprob), ..), most likely first, ties by id


def log_normaliser(row: np.ndarray) -> float:
    """log(sum(exp(row))) of a logits row (-inf entries count nothing)."""
    m = float(np.max(row))
    return m + float(np.log(np.sum(np.exp(row.astype(np.float64) - m))))


class Pending:
    """One row's logits kept as the model gave them (before the sampler and
    a constraint change them), until its token is known."""

    def __init__(self, row: np.ndarray, n_top: int):
        self.row = row.copy()
        self.lse = log_normaliser(self.row)
        self.n_top = n_top

    def of(self, token: int) -> TokenLogprob:
        return token_logprob(self.row, self.lse, token, self.n_top)


def token_logprob(row: np.ndarray, lse: float, token: int, k: int) -> TokenLogprob:
    """token's log-probability in a logits row (lse: its log_normaliser) and
    the k most likely tokens', ties by id."""
    top: tuple = ()
    if k > 0:
        k = min(k, int(np.count_nonzero(np.isfinite(row))))
        ids = np.argpartition(-row, k - 1)[:k] if k < len(row) else np.arange(len(row))
        ids = sorted((int(i) for i in ids), key=lambda i: (-row[i], i))
        top = tuple((i, float(row[i]) - lse) for i in ids)
    return TokenLogprob(token, float(row[token]) - lse, top)


# A prompt's rows go through the output head this many at a time (each row
# is the vocabulary's logits: 0.8 MB for gpt-oss).
SCORE_ROWS = 64


def prompt_logprobs(logits, x: np.ndarray, prompt, k: int, unused) -> list[TokenLogprob]:
    """Each prompt token's log-probability given the tokens before it, from
    the first's successor on (the first has none), as a generated token's:
    x [T, D] the last layer's outputs at the prompt's positions, logits the
    output head ([n, D] -> [n, V])."""
    out = []
    for a in range(0, len(prompt) - 1, SCORE_ROWS):
        rows = logits(x[a:min(a + SCORE_ROWS, len(prompt) - 1)])
        rows[:, unused] = -np.inf
        for j, row in enumerate(rows):
            out.append(token_logprob(row, log_normaliser(row), int(prompt[a + j + 1]), k))
    return out


def entry(tok, token: int, logprob: float) -> dict:
    """A token as chat completions and the Responses API list it: its text
    (a token that is part of a character shows the replacement character),
    its log-probability and its bytes, which join to the exact text."""
    b = tok.token_bytes(token)
    return {"token": b.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(b)}


def chat_entry(tok, lp: TokenLogprob) -> dict:
    return {**entry(tok, lp.token, lp.logprob), "top_logprobs": [entry(tok, i, v) for i, v in lp.top]}


def completion_logprobs(tok, lps: list[TokenLogprob], offsets: list[int]) -> dict:
    """The legacy completions' form: parallel lists, the alternatives as
    {text: logprob} (tokens of the same text share one key), the token
    chosen always among them ("the API will always return the logprob of
    the sampled token, so there may be up to logprobs+1 elements", OpenAI's
    reference)."""
    def text(i: int) -> str:
        return tok.token_bytes(i).decode("utf-8", errors="replace")

    tops = []
    for lp in lps:
        top: dict = {}
        for i, v in lp.top:
            top.setdefault(text(i), v)
        top.setdefault(text(lp.token), lp.logprob)
        tops.append(top)
    return {"tokens": [text(lp.token) for lp in lps], "token_logprobs": [lp.logprob for lp in lps],
            "top_logprobs": tops, "text_offset": offsets}


class ContentLogprobs:
    """A chat reply's content tokens with their log-probabilities, as OpenAI
    lists them (the reasoning, tool calls and the format's markup left out),
    taken as each generated token is fed to the reply (ReplyStream)."""

    def __init__(self, tok, gen):
        self.tok, self.gen, self.n = tok, gen, 0
        self.entries: list[dict] = []     # all of them
        self.new: list[dict] = []         # since the last take()
        self.by_item: dict[str, list[dict]] = {}   # a content item's id -> its own

    def add(self, reply) -> None:
        """After the generation's next token was fed to reply."""
        self.n += 1
        item = reply.token_item
        if item is not None and item.kind == "content":
            for lp in self.gen.token_logprobs[self.n - reply.token_count:self.n]:
                e = chat_entry(self.tok, lp)
                self.entries.append(e)
                self.new.append(e)
                self.by_item.setdefault(item.id, []).append(e)

    def take(self) -> list[dict]:
        out, self.new = self.new, []
        return out


class TextLogprobs:
    """A raw completion's tokens with their log-probabilities and where each
    one's text starts in the completion (its characters so far, from start:
    the echoed prompt's length)."""

    def __init__(self, tok, gen, start: int = 0):
        self.tok, self.gen = tok, gen
        self.lps: list[TokenLogprob] = []
        self.offsets: list[int] = []
        self.chars = start
        self.taken = 0

    def add(self, piece: str) -> None:
        """The generation's next token, whose text completed piece."""
        self.lps.append(self.gen.token_logprobs[len(self.lps)])
        self.offsets.append(self.chars)
        self.chars += len(piece)

    def all(self) -> dict:
        return completion_logprobs(self.tok, self.lps, self.offsets)

    def take(self) -> dict | None:
        """Those added since the last take (None: none)."""
        i, self.taken = self.taken, len(self.lps)
        return completion_logprobs(self.tok, self.lps[i:], self.offsets[i:]) if i < len(self.lps) else None


class Unread:
    """A submitted generation's token log-probabilities not taken yet, of
    the tokens its consumer has taken (for the routes that hand them out as
    they come: ollama's raw generate, llama.cpp's /completion). The worker
    may be a token or more ahead, and past a stop string the consumer
    found: those are not the reply's."""

    def __init__(self, sub):
        self.sub, self.taken = sub, 0

    def take(self) -> list[TokenLogprob]:
        upto = self.sub.taken if self.sub.stopped_at is None else self.sub.stopped_at
        out = self.sub.gen.token_logprobs[self.taken:upto]
        self.taken += len(out)
        return out
