"""The KV cache: fp16 keys and values per layer, the token ids they hold, and
rewinding to a shared prefix (a conversation's next turn prefills only what
is new)."""
from __future__ import annotations

import numpy as np

from .config import ModelConfig

# Tokens per forward batch in a prefill: a sliding layer's ring must hold every
# position a batch's queries can read.
PREFILL_BATCH = 128


def kv_positions(c: ModelConfig, layer: int, n_ctx: int) -> int:
    """Positions a layer's KV cache holds: sliding layers a ring of window +
    PREFILL_BATCH - 1 (every position a batch's queries can read), full
    layers the whole context."""
    return min(n_ctx, c.sliding_window + PREFILL_BATCH - 1) if c.is_sliding(layer) else n_ctx


def kv_bytes(c: ModelConfig, n_ctx: int) -> int:
    """Bytes of the fp16 keys and values an n_ctx-token cache holds."""
    per_pos = c.n_head_kv * (c.head_dim + c.value_dim) * 2
    return sum(per_pos * kv_positions(c, i, n_ctx) for i in range(c.n_layer))


class KVCache:
    """fp16 keys and values per layer. Sliding layers keep a ring of
    window + PREFILL_BATCH - 1 positions (all a batch's queries can read);
    full layers keep the whole context. `n` positions are filled, by the
    token ids in `tokens`."""

    def __init__(self, c: ModelConfig, n_ctx: int):
        self.n_ctx = n_ctx
        # Stored head-major, [kv head, slot, dim], as the attention kernel reads
        # them (each kv head's positions one contiguous run); k[i] and v[i]
        # are position-major views, [slot, kv head, dim], for the Python side.
        self.k_heads, self.v_heads = [], []
        try:
            for i in range(c.n_layer):
                cap = kv_positions(c, i, n_ctx)
                self.k_heads.append(np.zeros((c.n_head_kv, cap, c.head_dim), np.float16))
                self.v_heads.append(np.zeros((c.n_head_kv, cap, c.value_dim), np.float16))
        except MemoryError:
            self.k_heads = self.v_heads = []
            need = kv_bytes(c, n_ctx) / 2**30
            raise MemoryError(f"the KV cache of a {n_ctx}-token context ({need:.1f} GiB) cannot be "
                              "allocated: ask for a smaller context (-c/--ctx)") from None
        self.k = [a.transpose(1, 0, 2) for a in self.k_heads]
        self.v = [a.transpose(1, 0, 2) for a in self.v_heads]
        # their bits as the attention kernel takes them (made once: a view a
        # call cost microseconds a layer at decode, with the caches cold)
        self.k_bits = [a.view(np.uint16) for a in self.k_heads]
        self.v_bits = [a.view(np.uint16) for a in self.v_heads]
        # (layer, window) of the layers whose ring is shorter than the context
        self.rings = [(i, c.sliding_window) for i in range(c.n_layer) if len(self.k[i]) < n_ctx]
        self.n = 0
        self.tokens: list[int] = []
        self._saved: tuple[int, list] | None = None
        self.marked: tuple[int, dict] | None = None     # see Transformer.forward's mark

    def advance(self, tokens) -> None:
        """The positions just written (from n on) hold these tokens."""
        self.n += len(tokens)
        self.tokens.extend(int(t) for t in tokens)

    def reset(self) -> None:
        self.truncate(0)

    def can_rewind(self, p: int, n: int) -> bool:
        """Could a cache filled to n rewind to p (its rings still holding
        what a query at p reads)?"""
        return self._rings_hold(p, n)

    def _rings_hold(self, p: int, n: int) -> bool:
        """Would the rings, filled up to n, still hold every position a query
        at p reads (the window before it)?"""
        return all(max(0, p - w + 1) >= max(0, n - len(self.k[i])) for i, w in self.rings)

    def save_window(self) -> None:
        """Copy the rings as they are now (small: a window per sliding layer),
        so that a later turn can rewind to this point even after decoding has
        wrapped the rings."""
        self._saved = (self.n, [(i, self.k[i].copy(), self.v[i].copy()) for i, _ in self.rings])

    def restore_window(self) -> None:
        """Back to where save_window was called: its rings, and n (a pass
        stopped midway wrote positions past it into some layers)."""
        self._put_back_rings()
        self.n = self._saved[0]
        del self.tokens[self.n:]

    def _put_back_rings(self) -> None:
        for i, k, v in self._saved[1]:
            self.k[i][...] = k
            self.v[i][...] = v

    def _restorable(self, p: int) -> bool:
        return self._saved is not None and p <= self._saved[0] and self._rings_hold(p, self._saved[0])

    def truncate(self, p: int) -> int:
        """Keep the first p positions if the cache can; returns how many it kept
        (p, or 0 when a ring has lost what position p needs)."""
        p = max(0, min(p, self.n))
        if not self._rings_hold(p, self.n):
            if self._restorable(p):
                self._put_back_rings()
            else:
                p = 0
        if self._saved is not None and p < self._saved[0]:
            self._saved = None       # positions after p will be rewritten by other tokens
        self.n = p
        del self.tokens[p:]
        return p

    def shared_prefix(self, prompt, limit: int | None = None) -> int:
        """How many leading tokens of prompt (at most limit) the cache holds."""
        n = min(len(self.tokens), len(prompt) if limit is None else limit)
        cached = np.asarray(self.tokens[:n], dtype=np.int64)
        differ = np.flatnonzero(cached != np.asarray(prompt[:n], dtype=np.int64))
        return int(differ[0]) if len(differ) else n

    def reusable(self, prompt) -> int:
        """The longest cached prefix of prompt that the cache can rewind to,
        always leaving at least one prompt token to run."""
        common = self.shared_prefix(prompt, len(prompt) - 1)
        if self._rings_hold(common, self.n) or self._restorable(common):
            return common
        if self._saved is not None and self._saved[0] < common and self._restorable(self._saved[0]):
            return self._saved[0]                  # the saved point lies within the shared prefix
        return 0

    def reuse(self, prompt) -> int:
        """Keep reusable(prompt) positions; returns how many."""
        return self.truncate(self.reusable(prompt))

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k_heads) + sum(a.nbytes for a in self.v_heads)
