"""An independent float64 GPT-OSS for any GGUF file: the weights read and
dequantized by gguf-py (GGUFReader, gguf.quants.dequantize; split sets
joined part by part), the forward pass in numpy, written from the
architecture's description (shared/gpt-oss.md) and checked against
transformers (tests/test_np_reference.py). It shares no code with the engine,
so it can judge the engine on files made by other tools (llama-quantize,
llama-gguf-split). Keys and values may be rounded to fp16 as they enter the
cache, as the engine stores them."""
from __future__ import annotations

import glob
import math
import re

import numpy as np
from gguf import GGUFReader
from gguf import quants


class Reference:
    def __init__(self, path: str, fp16_kv: bool = True):
        self.fp16_kv = fp16_kv
        m = re.match(r"^(.*)-\d{5}-of-(\d{5})\.gguf$", path)
        paths = sorted(glob.glob(f"{m[1]}-*-of-{m[2]}.gguf")) if m else [path]
        self.readers = [GGUFReader(p) for p in paths]
        self.tensors = {t.name: t for r in self.readers for t in r.tensors}
        meta = self.readers[0]

        def get(key, default=None):
            f = meta.fields.get(key)
            return default if f is None else f.contents()

        a = "gpt-oss."
        self.n_layer = int(get(a + "block_count"))
        self.n_head, self.n_kv = int(get(a + "attention.head_count")), int(get(a + "attention.head_count_kv"))
        self.d = int(get(a + "attention.key_length"))
        self.k_used = int(get(a + "expert_used_count"))
        self.window = int(get(a + "attention.sliding_window"))
        self.eps = float(get(a + "attention.layer_norm_rms_epsilon"))
        base = float(get(a + "rope.freq_base"))
        factor = float(get(a + "rope.scaling.factor", 1.0)) if get(a + "rope.scaling.type") == "yarn" else 1.0
        orig = int(get(a + "rope.scaling.original_context_length", 4096))
        self.inv_freq, self.attn_scale = _yarn(self.d, base, factor, orig, float(get(a + "rope.scaling.yarn_beta_fast", 32)),
                                               float(get(a + "rope.scaling.yarn_beta_slow", 1)))
        self._cache: dict[str, np.ndarray] = {}

    def w(self, name: str) -> np.ndarray:
        """A tensor in float64, numpy order (outermost first)."""
        if name not in self._cache:
            t = self.tensors[name]
            with np.errstate(over="ignore"):
                x = quants.dequantize(np.asarray(t.data), t.tensor_type)
            self._cache[name] = np.asarray(x, np.float64).reshape(tuple(int(n) for n in reversed(t.shape)))
        return self._cache[name]

    def _norm(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def _rope(self, x, pos):
        ang = pos[:, None] * self.inv_freq[None, :]
        cos, sin = np.cos(ang) * self.attn_scale, np.sin(ang) * self.attn_scale
        h = self.d // 2
        a, b = x[..., :h], x[..., h:]
        c, s = cos[:, None, :], sin[:, None, :]
        return np.concatenate([a * c - b * s, b * c + a * s], -1)

    def logits(self, ids) -> np.ndarray:
        """Logits at every position of ids [T, V]."""
        ids = np.asarray(ids)
        T, H, K, d = len(ids), self.n_head, self.n_kv, self.d
        pos = np.arange(T, dtype=np.float64)
        x = self.w("token_embd.weight")[ids]
        for i in range(self.n_layer):
            b = f"blk.{i}."
            h = self._norm(x, self.w(b + "attn_norm.weight"))
            q = (h @ self.w(b + "attn_q.weight").T + self.w(b + "attn_q.bias")).reshape(T, H, d)
            k = (h @ self.w(b + "attn_k.weight").T + self.w(b + "attn_k.bias")).reshape(T, K, d)
            v = (h @ self.w(b + "attn_v.weight").T + self.w(b + "attn_v.bias")).reshape(T, K, -1)
            q, k = self._rope(q, pos), self._rope(k, pos)
            if self.fp16_kv:
                k, v = k.astype(np.float16).astype(np.float64), v.astype(np.float16).astype(np.float64)
            sinks = self.w(b + "attn_sinks.weight")
            out = np.zeros((T, H, v.shape[-1]))
            for t in range(T):
                lo = max(0, t - self.window + 1) if i % 2 == 0 else 0   # even layers slide
                for hh in range(H):
                    kh = hh // (H // K)
                    s = np.append(k[lo:t + 1, kh] @ q[t, hh] / math.sqrt(d), sinks[hh])
                    e = np.exp(s - s.max())
                    out[t, hh] = (e[:-1] / e.sum()) @ v[lo:t + 1, kh]     # the sink takes weight, adds nothing
            x = x + out.reshape(T, -1) @ self.w(b + "attn_output.weight").T + self.w(b + "attn_output.bias")
            h = self._norm(x, self.w(b + "post_attention_norm.weight"))
            router = h @ self.w(b + "ffn_gate_inp.weight").T + self.w(b + "ffn_gate_inp.bias")
            y = np.zeros_like(x)
            for t in range(T):
                top = np.argsort(-router[t], kind="stable")[:self.k_used]
                wts = np.exp(router[t, top] - router[t, top].max())
                wts /= wts.sum()
                for e, wt in zip(top, wts):
                    g = self.w(b + "ffn_gate_exps.weight")[e] @ h[t] + self.w(b + "ffn_gate_exps.bias")[e]
                    u = self.w(b + "ffn_up_exps.weight")[e] @ h[t] + self.w(b + "ffn_up_exps.bias")[e]
                    g, u = np.minimum(g, 7.0), np.clip(u, -7.0, 7.0)
                    act = g / (1 + np.exp(-1.702 * g)) * (u + 1)
                    y[t] += wt * (self.w(b + "ffn_down_exps.weight")[e] @ act + self.w(b + "ffn_down_exps.bias")[e])
            x = x + y
        return self._norm(x, self.w("output_norm.weight")) @ self.w("output.weight").T


def _yarn(d, base, factor, orig, beta_fast, beta_slow):
    base_freq = base ** (np.arange(0, d, 2, dtype=np.float64) / d)
    if factor <= 1:
        return 1 / base_freq, 1.0

    def corr(rot):
        return d * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))
    low, high = max(corr(beta_fast), 0.0), min(corr(beta_slow), d - 1.0)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2) - low) / (high - low), 0, 1)
    inv = (1 / (factor * base_freq)) * ramp + (1 / base_freq) * (1 - ramp)
    return inv, 0.1 * math.log(factor) + 1.0
