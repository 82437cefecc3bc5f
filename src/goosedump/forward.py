"""The GPT-OSS forward pass.

Dimension letters: T tokens in the batch, D hidden, H query heads, K kv heads,
d head dim, E experts, k experts per token, F expert hidden, V vocabulary.
The residual stream, norms and accumulators are fp32; the KV cache is fp16.
Matrix products and attention run in the native extension; this file is the
orchestration, one loop over layers, written to read like the architecture.
"""
from __future__ import annotations

import math
import os
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from . import _kernels
from .config import ModelConfig
from .experts import ExpertStore
from .gguf import GGMLType, GGUFFile

PREFILL_BATCH = 128
# Precision of activations inside quantized products (csrc/matmul.h): "i16"
# (default, chosen by benchmarks/activation_precision.py: within a factor 2-4
# of fp32's agreement with the reference, at 1.5-2.4x its speed) or "f32".
ACTIVATIONS = os.environ.get("GOOSEDUMP_ACTIVATIONS", "i16")
SWIGLU_ALPHA = 1.702   # gpt-oss's SwiGLU: hard-coded in the architecture, no GGUF key
SWIGLU_LIMIT = 7.0

_FORMATS = {GGMLType.Q8_0: "q8_0", GGMLType.MXFP4: "mxfp4"}


class ContextOverflowError(ValueError):
    pass


@dataclass
class QMatrix:
    """A quantized weight matrix: rows of output features."""
    fmt: str
    raw: np.ndarray   # uint8 (rows, bytes per row), a view into the file
    bias: np.ndarray | None = None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        out = np.empty((x.shape[0], self.raw.shape[0]), np.float32)
        _kernels.matmul(self.fmt, self.raw, x, out, self.bias, acts=ACTIVATIONS)
        return out


def _qmatrix(f: GGUFFile, name: str, bias: str | None = None) -> QMatrix:
    t = f.tensors[name]
    return QMatrix(_FORMATS[GGMLType(t.type)], f.tensor(name),
                   None if bias is None else np.ascontiguousarray(f.tensor(bias)))


@dataclass
class Experts:
    """One layer's experts: the stacked tensors, each expert a contiguous slice."""
    fmt: str
    gate: np.ndarray       # (E, F, bytes per row of D)
    gate_bias: np.ndarray  # (E, F)
    up: np.ndarray
    up_bias: np.ndarray
    down: np.ndarray       # (E, D, bytes per row of F)
    down_bias: np.ndarray  # (E, D)

    def __call__(self, h: np.ndarray, chosen: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """sum_j weights[t, j] * expert_{chosen[t, j]}(h[t]) -> [T, D]. Native:
        tokens grouped by expert, all gate/up rows in one parallel pass, the
        SwiGLU (gate clamped above at 7, up to [-7, 7], g sigmoid(1.702 g)
        (u + 1)), then all down rows."""
        out = np.empty_like(h)
        _kernels.moe(self.fmt, self.gate, self.gate_bias, self.up, self.up_bias, self.down, self.down_bias,
                     h, chosen, weights, out, SWIGLU_ALPHA, SWIGLU_LIMIT, acts=ACTIVATIONS)
        return out


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w per row (native: numpy's five passes cost
    more than the arithmetic at decode's one row)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(x)
    _kernels.rms_norm(x, w, eps, out)
    return out


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


@dataclass
class Layer:
    attn_norm: np.ndarray
    attn_q: QMatrix
    attn_k: QMatrix
    attn_v: QMatrix
    attn_output: QMatrix
    attn_sinks: np.ndarray
    post_attention_norm: np.ndarray
    ffn_gate_inp: np.ndarray       # router (E, D), F32
    ffn_gate_inp_bias: np.ndarray  # (E,)
    experts: Experts
    window: int                    # 0: full attention


def kv_positions(c: ModelConfig, layer: int, n_ctx: int) -> int:
    """Positions a layer's KV cache holds: sliding layers a ring of window +
    PREFILL_BATCH - 1 (every position a batch's queries can read), full
    layers the whole context."""
    return min(n_ctx, c.sliding_window + PREFILL_BATCH - 1) if c.is_sliding(layer) else n_ctx


def route(L: "Layer", h: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """A layer's router on h [T, D]: the top-k experts by logit (ties: lowest
    index) [T, k], descending, and the softmax over those k [T, k]. Native, one
    token at a time in a fixed order: a token's experts must not depend on how
    many tokens share its batch (a cached prefix, prefill versus decode: same
    logits, bit for bit)."""
    top = np.empty((h.shape[0], k), np.int64)
    weights = np.empty((h.shape[0], k), np.float32)
    _kernels.route(L.ffn_gate_inp, L.ffn_gate_inp_bias, np.ascontiguousarray(h, dtype=np.float32), top, weights)
    return top, weights


class KVCache:
    """fp16 keys and values per layer. Sliding layers keep a ring of
    window + PREFILL_BATCH - 1 positions (all a batch's queries can read);
    full layers keep the whole context. `n` positions are filled, by the
    token ids in `tokens`."""

    def __init__(self, c: ModelConfig, n_ctx: int):
        self.n_ctx = n_ctx
        self.k, self.v = [], []
        for i in range(c.n_layer):
            cap = kv_positions(c, i, n_ctx)
            self.k.append(np.zeros((cap, c.n_head_kv, c.head_dim), np.float16))
            self.v.append(np.zeros((cap, c.n_head_kv, c.value_dim), np.float16))
        # (layer, window) of the layers whose ring is shorter than the context
        self.rings = [(i, c.sliding_window) for i in range(c.n_layer) if len(self.k[i]) < n_ctx]
        self.n = 0
        self.tokens: list[int] = []
        self._saved: tuple[int, list] | None = None

    def reset(self) -> None:
        self.truncate(0)

    def _rings_hold(self, p: int, n: int) -> bool:
        """Would the rings, filled up to n, still hold every position a query
        at p reads (the window before it)?"""
        return all(max(0, p - w + 1) >= max(0, n - len(self.k[i])) for i, w in self.rings)

    def save_window(self) -> None:
        """Copy the rings as they are now (small: a window per sliding layer),
        so that a later turn can rewind to this point even after decoding has
        wrapped the rings."""
        self._saved = (self.n, [(i, self.k[i].copy(), self.v[i].copy()) for i, _ in self.rings])

    def _restorable(self, p: int) -> bool:
        return self._saved is not None and p <= self._saved[0] and self._rings_hold(p, self._saved[0])

    def truncate(self, p: int) -> int:
        """Keep the first p positions if the cache can; returns how many it kept
        (p, or 0 when a ring has lost what position p needs)."""
        p = max(0, min(p, self.n))
        if not self._rings_hold(p, self.n):
            if self._restorable(p):
                for i, k, v in self._saved[1]:
                    self.k[i][...] = k
                    self.v[i][...] = v
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

    def reuse(self, prompt) -> int:
        """Keep the longest cached prefix of prompt that the cache can rewind
        to, always leaving at least one prompt token to run; returns its length."""
        common = self.shared_prefix(prompt, len(prompt) - 1)
        if self._rings_hold(common, self.n) or self._restorable(common):
            return self.truncate(common)
        if self._saved is not None and self._saved[0] < common and self._restorable(self._saved[0]):
            return self.truncate(self._saved[0])   # the saved point lies within the shared prefix
        return self.truncate(0)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)


class Transformer:
    def __init__(self, f: GGUFFile, c: ModelConfig, store: ExpertStore | None = None):
        self.config = c
        self.store = store   # None or in place: experts straight from the map
        # Prefetch: while layer i computes, read the experts that layer i+1's
        # router picks from layer i's hidden state (the next layer's own
        # choice is only known once it runs; its predecessor's picks say
        # little, the router applied one layer early says much more).
        self.prefetch = True
        self.token_embd = _qmatrix(f, "token_embd.weight")
        self.output_norm = np.ascontiguousarray(f.tensor("output_norm.weight"))
        self.output = _qmatrix(f, "output.weight")
        self.layers = []
        for i in range(c.n_layer):
            b = f"blk.{i}."

            def vec(name: str) -> np.ndarray:
                return np.ascontiguousarray(f.tensor(b + name))

            exp_fmt = _FORMATS[GGMLType(f.tensors[b + "ffn_gate_exps.weight"].type)]
            self.layers.append(Layer(
                attn_norm=vec("attn_norm.weight"),
                attn_q=_qmatrix(f, b + "attn_q.weight", b + "attn_q.bias"),
                attn_k=_qmatrix(f, b + "attn_k.weight", b + "attn_k.bias"),
                attn_v=_qmatrix(f, b + "attn_v.weight", b + "attn_v.bias"),
                attn_output=_qmatrix(f, b + "attn_output.weight", b + "attn_output.bias"),
                attn_sinks=vec("attn_sinks.weight"),
                post_attention_norm=vec("post_attention_norm.weight"),
                ffn_gate_inp=vec("ffn_gate_inp.weight"),
                ffn_gate_inp_bias=vec("ffn_gate_inp.bias"),
                experts=Experts(exp_fmt, f.tensor(b + "ffn_gate_exps.weight"), vec("ffn_gate_exps.bias"),
                                f.tensor(b + "ffn_up_exps.weight"), vec("ffn_up_exps.bias"),
                                f.tensor(b + "ffn_down_exps.weight"), vec("ffn_down_exps.bias")),
                window=c.sliding_window if c.is_sliding(i) else 0,
            ))
        self.inv_freq, self.rope_scale = yarn_rope(c)
        # When a list, (first position, layer, chosen experts [T, k]) is added
        # for every batch and layer, in the order the experts are asked for.
        self.routing: list[tuple[int, int, np.ndarray]] | None = None
        self._pos0 = 0
        # When a dict, seconds spent per part of the pass are added to it
        # ("attn_proj", "attention", "router", "experts", "output_head").
        self.timings: defaultdict[str, float] | None = None

    # -- pieces ----------------------------------------------------------------
    def rope_tables(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        angles = positions.astype(np.float32)[:, None] * self.inv_freq[None, :]   # [T, d/2]
        return ((np.cos(angles) * np.float32(self.rope_scale)).astype(np.float32),
                (np.sin(angles) * np.float32(self.rope_scale)).astype(np.float32))

    def attention(self, L: Layer, i: int, h: np.ndarray, seqs: list[tuple[KVCache, int, int, int]],
                  cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """h [T, D] holds the rows of one or more sequences: seqs lists
        (cache, first position, first row, end row) of each."""
        c = self.config
        T = h.shape[0]
        t0 = time.perf_counter()
        q = L.attn_q(h).reshape(T, c.n_head, c.head_dim)            # [T, H, d]
        k = L.attn_k(h).reshape(T, c.n_head_kv, c.head_dim)         # [T, K, d]
        v = L.attn_v(h).reshape(T, c.n_head_kv, c.value_dim)        # [T, K, dv]
        t1 = time.perf_counter()
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        out = np.empty((T, c.n_head, c.value_dim), np.float32)
        for cache, pos0, r0, r1 in seqs:
            kc, vc = cache.k[i], cache.v[i]
            slots = np.arange(pos0, pos0 + r1 - r0) % kc.shape[0]
            kc[slots] = k[r0:r1]                                    # the cache is fp16
            vc[slots] = v[r0:r1]
            # softmax over [scores..., sink]; even layers see only the last `window` positions
            _kernels.attention(q[r0:r1], kc.view(np.uint16), vc.view(np.uint16), L.attn_sinks, pos0, L.window,
                               1.0 / math.sqrt(c.head_dim), out[r0:r1])
        t2 = time.perf_counter()
        o = L.attn_output(out.reshape(T, c.n_head * c.value_dim))    # [T, D]
        if self.timings is not None:
            self.timings["attn_proj"] += (t1 - t0) + (time.perf_counter() - t2)
            self.timings["attention"] += t2 - t1
        return o

    def moe(self, L: Layer, i: int, h: np.ndarray) -> np.ndarray:
        c = self.config
        t0 = time.perf_counter()
        # top-k by logit, then softmax over those k only
        top, w = route(L, h, c.n_expert_used)                                   # [T, k], [T, k]
        if self.routing is not None and self._pos0 >= 0:
            self.routing.append((self._pos0, i, top))
        t1 = time.perf_counter()
        # experts grouped by the tokens routed to them: one matrix pass per expert
        if self.store is None or self.store.in_place:
            y = L.experts(h, top, w)
        else:
            y = self.streamed_experts(L, i, h, top, w)
        if self.timings is not None:
            self.timings["router"] += t1 - t0
            self.timings["experts"] += time.perf_counter() - t1
        return y

    def routing_trace(self) -> list[tuple[int, int, tuple[int, ...]]]:
        """The recorded routing as (token position, layer, experts) rows."""
        return [(pos0 + t, layer, tuple(int(e) for e in top[t]))
                for pos0, layer, top in (self.routing or []) for t in range(len(top))]

    def streamed_experts(self, L: Layer, i: int, h: np.ndarray, top: np.ndarray, w: np.ndarray) -> np.ndarray:
        """The experts through the store: each computed as soon as its read
        completes, then released; outputs summed in expert order, so the
        result does not depend on which read finished first."""
        parts: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        c = self.config
        for n, (e, v) in enumerate(self.store.fetch(i, np.unique(top))):
            if n == 0 and self.prefetch and i + 1 < c.n_layer:
                guess, _ = route(self.layers[i + 1], h, c.n_expert_used)
                self.store.prefetch(i + 1, np.unique(guess))
            try:
                tok, slot = np.nonzero(top == e)
                y = np.empty((len(tok), h.shape[1]), np.float32)
                _kernels.moe(L.experts.fmt, v.gate[None], v.gate_bias[None], v.up[None], v.up_bias[None],
                             v.down[None], v.down_bias[None], np.ascontiguousarray(h[tok]),
                             np.zeros((len(tok), 1), np.int64), np.ascontiguousarray(w[tok, slot][:, None]),
                             y, SWIGLU_ALPHA, SWIGLU_LIMIT, acts=ACTIVATIONS)
                parts[e] = (tok, y)
            finally:
                self.store.release(i, e)
        out = np.zeros_like(h)
        for e in sorted(parts):
            tok, y = parts[e]
            out[tok] += y    # a token picks an expert at most once: no repeated indices
        return out

    # -- the whole model -------------------------------------------------------
    def forward(self, tokens: np.ndarray, cache: KVCache, logits: str = "last"):
        """Run tokens (appended at cache.n) through the model in batches of
        PREFILL_BATCH. logits: "last" -> [V] for the last token, "all" ->
        [T, V], "argmax" -> (id, value) of the last token, "none" -> None."""
        c = self.config
        tokens = np.asarray(tokens, dtype=np.int64)
        if cache.n + len(tokens) > cache.n_ctx:
            raise ContextOverflowError(f"{cache.n} cached + {len(tokens)} new tokens exceed the context "
                                       f"of {cache.n_ctx}")
        if len(tokens) and (tokens.min() < 0 or tokens.max() >= c.n_vocab):
            bad = int(tokens[(tokens < 0) | (tokens >= c.n_vocab)][0])
            raise ValueError(f"token id {bad} is outside the vocabulary (0..{c.n_vocab - 1})")
        all_logits = []
        x = None
        for start in range(0, len(tokens), PREFILL_BATCH):
            batch = tokens[start:start + PREFILL_BATCH]
            x = self.forward_batch(batch, cache)
            if logits == "all":
                all_logits.append(self.output(rms_norm(x, self.output_norm, c.rms_eps)))
        if logits == "all":
            return np.concatenate(all_logits) if all_logits else np.empty((0, c.n_vocab), np.float32)
        if logits == "none" or x is None:
            return None
        t0 = time.perf_counter()
        h = np.ascontiguousarray(rms_norm(x[-1:], self.output_norm, c.rms_eps))
        if logits == "argmax":
            out = _kernels.matvec_argmax(self.output.fmt, self.output.raw, h[0], acts=ACTIVATIONS)
        else:
            out = self.output(h)[0]
        if self.timings is not None:
            self.timings["output_head"] += time.perf_counter() - t0
        return out

    def forward_batch(self, tokens: np.ndarray, cache: KVCache) -> np.ndarray:
        """One batch of one sequence: returns the residual stream after the
        last layer [T, D]."""
        T, pos0 = len(tokens), cache.n
        self._pos0 = pos0
        x = self._layers(tokens, np.arange(pos0, pos0 + T), [(cache, pos0, 0, T)])
        cache.n += T
        cache.tokens.extend(int(t) for t in tokens)
        return x

    def forward_multi(self, tokens: np.ndarray, caches: list[KVCache], logits: str = "last"):
        """One decode step of several sequences at once, token b continuing
        caches[b]: the weights, and the experts the tokens share, are read
        once for all. Returns logits [B, V] ("last") or argmax ids [B]
        ("argmax"); each row equals what forward() gives that sequence alone."""
        c = self.config
        tokens = np.asarray(tokens, dtype=np.int64)
        for cache in caches:
            if cache.n + 1 > cache.n_ctx:
                raise ContextOverflowError(f"{cache.n} cached + 1 new token exceed the context of {cache.n_ctx}")
        positions = np.array([cache.n for cache in caches])
        self._pos0 = -1          # rows of different sequences: not one routing trace
        x = self._layers(tokens, positions, [(cache, int(p), b, b + 1) for b, (cache, p) in
                                             enumerate(zip(caches, positions))])
        for cache, t in zip(caches, tokens):
            cache.n += 1
            cache.tokens.append(int(t))
        h = np.ascontiguousarray(rms_norm(x, self.output_norm, c.rms_eps))
        out = self.output(h)                                         # [B, V]
        return out.argmax(axis=-1) if logits == "argmax" else out

    def _layers(self, tokens: np.ndarray, positions: np.ndarray, seqs) -> np.ndarray:
        c = self.config
        x = np.empty((len(tokens), c.n_embd), np.float32)
        _kernels.get_rows(self.token_embd.fmt, self.token_embd.raw, tokens, x)  # embeddings
        cos, sin = self.rope_tables(positions)
        for i, L in enumerate(self.layers):
            h = rms_norm(x, L.attn_norm, c.rms_eps)
            x = x + self.attention(L, i, h, seqs, cos, sin)
            h = np.ascontiguousarray(rms_norm(x, L.post_attention_norm, c.rms_eps))
            x = x + self.moe(L, i, h)
        return x
