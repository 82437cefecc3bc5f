"""The GPT-OSS forward pass: token ids in, the residual stream after the last
layer out (the output head, goosedump.weights.Head, turns it into logits or
greedy ids).

Dimension letters: T tokens in the batch, D hidden, H query heads, K kv heads,
d head dim, E experts, k experts per token, F expert hidden, V vocabulary.
The residual stream, norms and accumulators are fp32; the KV cache is fp16.
Matrix products and attention run in the native extension; this file is the
orchestration, one loop over layers, written to read like the architecture.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from . import _kernels
from .config import ModelConfig
from .experts import ExpertStore
from .gguf import GGUFFile
from .kvcache import PREFILL_BATCH, KVCache
from .options import Options
from .probe import NO_PROBE, Probe
from .weights import Layer, add_rms_norm, expert_ffn, load_head, load_layers, qmatrix, rms_norm

# (cache, first position, first row, end row) of each sequence in a batch
Spans = Sequence[tuple[KVCache, int, int, int]]
# Tokens per call of the experts' kernel when experts are in memory (it holds
# every group's intermediates, ~45 KiB per token, at once).
MOE_CHUNK = 512
# Prefetch may evict cached experts for a batch of at most this many tokens (decode).
PREFETCH_EVICT_TOKENS = 8


class Stopped(Exception):
    """A forward pass stopped between layers (its caller's stop said so)."""


def yarn_rope(c: ModelConfig) -> tuple[np.ndarray, float]:
    """Inverse frequencies per rotary pair and the cos/sin scale (YaRN)."""
    d = c.head_dim
    base_freq = np.float32(c.rope_base) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d))
    extrapolation = (1.0 / base_freq).astype(np.float32)
    if c.rope_scaling_factor <= 1.0:
        return extrapolation, 1.0
    interpolation = (1.0 / (np.float32(c.rope_scaling_factor) * base_freq)).astype(np.float32)

    def corr(rotations: float) -> float:
        return d * math.log(c.rope_original_context / (rotations * 2 * math.pi)) / (2 * math.log(c.rope_base))

    low = max(corr(c.yarn_beta_fast), 0.0)          # no rounding (llama.cpp rounds: a known drift)
    high = min(corr(c.yarn_beta_slow), d - 1.0)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    keep = (1 - ramp).astype(np.float32)            # 1: original frequency, 0: interpolated
    inv_freq = interpolation * (1 - keep) + extrapolation * keep
    return inv_freq.astype(np.float32), 0.1 * math.log(c.rope_scaling_factor) + 1.0


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """NeoX style, in place (native): each head's first half pairs with its
    second half. x [T, heads, d] contiguous float32, cos/sin [T, d/2]."""
    _kernels.rope(x, cos, sin)
    return x


def route(L: Layer, h: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """A layer's router on h [T, D]: the top-k experts by logit (ties: lowest
    index) [T, k], descending, and the softmax over those k [T, k]. Native, one
    token at a time in a fixed order: a token's experts must not depend on how
    many tokens share its batch (a cached prefix, prefill versus decode: same
    logits, bit for bit)."""
    top = np.empty((h.shape[0], k), np.int64)
    weights = np.empty((h.shape[0], k), np.float32)
    _kernels.route(L.ffn_gate_inp, L.ffn_gate_inp_bias, np.ascontiguousarray(h, dtype=np.float32), top, weights)
    return top, weights


class Transformer:
    def __init__(self, f: GGUFFile, c: ModelConfig, store: ExpertStore | None = None,
                 options: Options = Options()):
        self.config = c
        self.store = store   # None or in place: experts straight from the map
        self.options = options
        self.token_embd = qmatrix(f, "token_embd.weight", acts=options.activations)
        self.layers = load_layers(f, c, options.activations)
        self.head = load_head(f, c, options.activations)
        self.inv_freq, self.rope_scale = yarn_rope(c)

    # -- the whole model -------------------------------------------------------
    def forward(self, tokens: np.ndarray, cache: KVCache, probe: Probe = NO_PROBE,
                last_only: bool = False, mark: int | None = None, stop=None) -> np.ndarray:
        """Run tokens (appended at cache.n) through the model; the residual
        stream after the last layer [T, D], or only the last token's [1, D] (a
        long prompt need not keep them all). Layer by layer over up to
        `options.prefill_tokens` tokens at once (see _pass). mark: a position
        inside the tokens whose sliding layers' rings are copied as they are
        there (cache.marked = (mark, {layer: (k, v)})), so that the state at
        the mark can be kept without a second pass. stop: asked before each
        layer; when it answers true, Stopped is raised, the cache filled to
        the start of the pass it stopped in, its rings as they were there
        (saved at each pass's start). Token ids and the context are checked
        by the caller (goosedump.generate.check_prompt)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        out = []
        step = max(1, self.options.prefill_tokens)
        cache.marked = None
        for start in range(0, len(tokens), step):
            if stop is not None:
                cache.save_window()       # (a stop within the pass puts the rings back as they are now)
            try:
                x = self._pass(tokens[start:start + step], cache, probe, mark, stop)
            except Stopped:
                cache.restore_window()
                raise
            out.append(x[-1:] if last_only else x)
        if last_only:
            out = out[-1:]
        return np.concatenate(out) if out else np.empty((0, self.config.n_embd), np.float32)

    def _pass(self, tokens: np.ndarray, cache: KVCache, probe: Probe, mark: int | None = None,
              stop=None) -> np.ndarray:
        """A prompt's tokens through every layer, layer by layer: attention in
        batches of PREFILL_BATCH (each batch's keys and values enter the cache
        before the next batch reads them), then the experts over all the
        tokens at once, so that a streamed expert is read once per layer for
        the whole prompt, not once per batch. A token's numbers are the same
        as batch by batch: the kernels are batch-invariant."""
        T, pos0 = len(tokens), cache.n
        cuts = set(range(0, T, PREFILL_BATCH)) | {T}
        at = None if mark is None or not pos0 < mark <= pos0 + T else mark - pos0
        if at is not None:
            cuts.add(at)            # a batch ends at the mark: the rings are as they are there
        cuts = sorted(cuts)
        batches = [(a, b, [(cache, pos0 + a, 0, b - a)]) for a, b in zip(cuts, cuts[1:])]
        after = None
        if at is not None:
            rings = {i for i, _ in cache.rings}
            cache.marked = (mark, {})

            def after(i: int, end: int) -> None:
                if end == at and i in rings:
                    cache.marked[1][i] = (cache.k[i].copy(), cache.v[i].copy())
        x = self._layers(tokens, np.arange(pos0, pos0 + T), batches, [(pos0, 0, T)], probe, after, stop)
        cache.advance(tokens)
        return x

    def forward_multi(self, tokens: np.ndarray, caches: list[KVCache], probe: Probe = NO_PROBE) -> np.ndarray:
        """One decode step of several sequences at once, token b continuing
        caches[b]: the weights, and the experts the tokens share, are read
        once for all. Returns [B, D]; each row equals what forward() gives
        that sequence alone."""
        tokens = np.asarray(tokens, dtype=np.int64)
        positions = np.array([cache.n for cache in caches])
        seqs = [(cache, int(p), b, b + 1) for b, (cache, p) in enumerate(zip(caches, positions))]
        x = self._layers(tokens, positions, [(0, len(tokens), seqs)], [(p, b, b + 1) for _, p, b, _ in seqs], probe)
        for cache, t in zip(caches, tokens):
            cache.advance([t])
        return x

    def _layers(self, tokens: np.ndarray, positions: np.ndarray, batches, spans, probe: Probe,
                after=None, stop=None) -> np.ndarray:
        """The layer loop. batches: (first row, end row, seqs) of the
        attention calls, each after the one before it (seqs' rows relative to
        the batch); the experts take every row at once; spans: (first
        position, first row, end row) of each sequence, for the probe;
        after(layer, end row): called after each attention batch; stop: see
        forward."""
        c = self.config
        x = np.empty((len(tokens), c.n_embd), np.float32)
        _kernels.get_rows(self.token_embd.fmt, self.token_embd.raw, tokens, x)  # embeddings
        cos, sin = self.rope_tables(positions)
        h = rms_norm(x, self.layers[0].attn_norm, c.rms_eps)
        for i, L in enumerate(self.layers):
            if stop is not None and stop():
                raise Stopped(f"stopped before layer {i}")
            if len(batches) == 1:
                a = self.attention(L, i, h, batches[0][2], cos, sin, probe)
                if after is not None:
                    after(i, batches[0][1])
            else:
                a = np.empty_like(x)
                for r0, r1, seqs in batches:
                    a[r0:r1] = self.attention(L, i, h[r0:r1], seqs, cos[r0:r1], sin[r0:r1], probe)
                    if after is not None:
                        after(i, r1)
            # the residual stream x gains each block's output in place, and the
            # next norm is taken in the same call (x + a, then the norm: the same bits)
            h = add_rms_norm(x, a, L.post_attention_norm, c.rms_eps)
            m = self.moe(L, i, h, spans, probe)
            if i + 1 < len(self.layers):
                h = add_rms_norm(x, m, self.layers[i + 1].attn_norm, c.rms_eps)
            else:
                x += m
        return x

    # -- pieces ----------------------------------------------------------------
    def rope_tables(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        angles = positions.astype(np.float32)[:, None] * self.inv_freq[None, :]   # [T, d/2]
        return ((np.cos(angles) * np.float32(self.rope_scale)).astype(np.float32),
                (np.sin(angles) * np.float32(self.rope_scale)).astype(np.float32))

    def attention(self, L: Layer, i: int, h: np.ndarray, seqs: Spans, cos: np.ndarray, sin: np.ndarray,
                  probe: Probe) -> np.ndarray:
        """h [T, D] holds the rows of one or more sequences (seqs)."""
        c = self.config
        T = h.shape[0]
        with probe.timer("attn_proj"):
            q = L.attn_q(h).reshape(T, c.n_head, c.head_dim)            # [T, H, d]
            k = L.attn_k(h).reshape(T, c.n_head_kv, c.head_dim)         # [T, K, d]
            v = L.attn_v(h).reshape(T, c.n_head_kv, c.value_dim)        # [T, K, dv]
        with probe.timer("attention"):
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)
            out = np.empty((T, c.n_head, c.value_dim), np.float32)
            for cache, pos0, r0, r1 in seqs:
                # the new keys and values into the fp16 cache (slot: position modulo its size),
                # then softmax over [scores..., sink]; even layers see only the last `window` positions
                _kernels.attention(q[r0:r1], cache.k_bits[i], cache.v_bits[i], L.attn_sinks, pos0, L.window,
                                   1.0 / math.sqrt(c.head_dim), out[r0:r1], new_k=k[r0:r1], new_v=v[r0:r1])
        with probe.timer("attn_proj"):
            return L.attn_output(out.reshape(T, c.n_head * c.value_dim))    # [T, D]

    def moe(self, L: Layer, i: int, h: np.ndarray, spans, probe: Probe) -> np.ndarray:
        c = self.config
        with probe.timer("router"):
            # top-k by logit, then softmax over those k only
            top, w = route(L, h, c.n_expert_used)                               # [T, k], [T, k]
        probe.on_route(i, top, spans)
        with probe.timer("experts"):
            # experts grouped by the tokens routed to them: one matrix pass per expert
            if self.store is None or self.store.in_place:
                if len(h) <= MOE_CHUNK:
                    return L.experts(h, top, w)
                # (in chunks: the kernel holds every group's intermediates at once)
                return np.concatenate([L.experts(h[s:s + MOE_CHUNK], top[s:s + MOE_CHUNK], w[s:s + MOE_CHUNK])
                                       for s in range(0, len(h), MOE_CHUNK)])
            return self.streamed_experts(L, i, h, top, w)

    def streamed_experts(self, L: Layer, i: int, h: np.ndarray, top: np.ndarray, w: np.ndarray) -> np.ndarray:
        """The experts through the store: each computed as soon as its read
        completes, then released; outputs summed in expert order, so the
        result does not depend on which read finished first."""
        parts: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        c = self.config
        for n, (e, v) in enumerate(self.store.fetch(i, np.unique(top))):
            # Prefetch: while layer i computes, read the experts that layer
            # i+1's router picks from layer i's hidden state (the next
            # layer's own choice is only known once it runs; its
            # predecessor's picks say little, the router applied one layer
            # early says much more).
            if n == 0 and self.options.prefetch and i + 1 < c.n_layer:
                guess, _ = route(self.layers[i + 1], h, c.n_expert_used)
                # a prompt's next layer wants most experts: read ahead into free
                # slots only, never evicting what this layer's reads may still need
                self.store.prefetch(i + 1, np.unique(guess), evict=len(h) <= PREFETCH_EVICT_TOKENS)
            try:
                tok, slot = np.nonzero(top == e)
                y = expert_ffn(L.experts.fmts, v.gate[None], v.gate_bias[None], v.up[None], v.up_bias[None],
                               v.down[None], v.down_bias[None], np.ascontiguousarray(h[tok]),
                               np.zeros((len(tok), 1), np.int64), np.ascontiguousarray(w[tok, slot][:, None]),
                               self.options.activations)
                parts[e] = (tok, y)
            finally:
                self.store.release(i, e)
        out = np.zeros_like(h)
        for e in sorted(parts):
            tok, y = parts[e]
            out[tok] += y    # a token picks an expert at most once: no repeated indices
        return out
