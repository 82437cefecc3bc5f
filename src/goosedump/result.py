"""What a generation ends with: its stop reason, tokens, timings and counters."""
from __future__ import annotations

import time
from dataclasses import dataclass

# Stop reasons, as the result and the CLI's --json report them.
STOP_EOS = "eos"                  # an end-of-generation token (<|return|>, <|call|>, <|endoftext|>)
STOP_MAX_TOKENS = "max_tokens"
STOP_REPETITION = "repetition"    # a repetition loop
STOP_TIME_BUDGET = "time_budget"
STOP_CANCELLED = "cancelled"      # the consumer stopped it (a client gone, Ctrl-C)

# A repetition loop: the last tokens repeat a cycle of period 1..32 at least
# 4 times and over at least 16 tokens, looked for in the last 128.
LOOP_MAX_PERIOD, LOOP_MIN_REPEATS, LOOP_MIN_TOKENS, LOOP_WINDOW = 32, 4, 16, 128


class ContextOverflowError(ValueError):
    """A prompt plus max_tokens that does not fit the context."""

    def __init__(self, n_prompt: int, max_tokens: int, n_ctx: int):
        self.n_prompt, self.max_tokens, self.n_ctx = n_prompt, max_tokens, n_ctx
        super().__init__(f"the prompt ({n_prompt} tokens) plus max_tokens ({max_tokens}) exceeds the context of "
                         f"{n_ctx} tokens: raise the context (--ctx) or lower max_tokens (--max-tokens)")


def repetition_loop(tokens: list[int]) -> bool:
    """True when the tail of tokens is a loop (see LOOP_*)."""
    tail = tokens[-LOOP_WINDOW:]
    n = len(tail)
    for period in range(1, min(LOOP_MAX_PERIOD, n // LOOP_MIN_REPEATS) + 1):
        run = period  # the last `run` tokens have this period
        while run < n and tail[n - 1 - run] == tail[n - 1 - run + period]:
            run += 1
        if run >= max(LOOP_MIN_TOKENS, LOOP_MIN_REPEATS * period):
            return True
    return False


def stop_after(generated: list[int], max_tokens: int, deadline: float | None, cancelled: str | None,
               loops: bool = True) -> str | None:
    """Why generation stops after the token just added to generated, if it
    does (an end-of-generation token is checked before it is added): the
    consumer's cancel, max_tokens, a repetition loop (unless loops is False),
    the time budget's deadline (a time.perf_counter() value)."""
    if cancelled is not None:
        return cancelled
    if len(generated) >= max_tokens:
        return STOP_MAX_TOKENS
    if loops and repetition_loop(generated):
        return STOP_REPETITION
    if deadline is not None and time.perf_counter() >= deadline:
        return STOP_TIME_BUDGET
    return None


@dataclass
class GenerationResult:
    text: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    stop_reason: str
    prefill_seconds: float
    decode_seconds: float
    decode_steps: int = 0             # forward passes after the prefill
    eos_token_id: int | None = None   # the end-of-generation token, when that was the stop
    profile: dict | None = None       # with profile=True: seconds per part, per phase
    expert_cache: dict | None = None  # the expert store's counters while this generation ran
    cached_tokens: int = 0            # prompt tokens whose KV cache was reused, not recomputed
    routing: list | None = None       # with record_routing (or profile): (position, layer, experts) rows
    logprobs: list | None = None      # with logprobs: a goosedump.logprobs.TokenLogprob per generated token
    prompt_logprobs: list | None = None   # with prompt_logprobs: one per prompt token after the first

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def generated_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def prefill_tokens_per_s(self) -> float:
        n = self.prompt_tokens - self.cached_tokens   # those the prefill computed
        return n / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        # the first generated token comes from the prefill's logits
        n = self.decode_steps
        return n / self.decode_seconds if n > 0 and self.decode_seconds > 0 else 0.0

    def to_dict(self) -> dict:
        d = {
            "prompt_token_ids": self.prompt_token_ids, "token_ids": self.token_ids, "text": self.text,
            "stop_reason": self.stop_reason, "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens, "cached_tokens": self.cached_tokens,
            "prefill_seconds": self.prefill_seconds,
            "decode_seconds": self.decode_seconds, "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
        }
        if self.profile is not None:
            d["profile"] = self.profile
        if self.expert_cache is not None:
            d["expert_cache"] = self.expert_cache
        for key, lps in (("logprobs", self.logprobs), ("prompt_logprobs", self.prompt_logprobs)):
            if lps is not None:
                d[key] = [{"token": lp.token, "logprob": lp.logprob, "top": [list(t) for t in lp.top]} for lp in lps]
        return d
