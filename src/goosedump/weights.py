"""The weights as the forward pass uses them: zero-copy views into the GGUF
file, named after its tensors (loading is a walk over the names, not a
mapping table), and the output head.

Dimension letters: T tokens, D hidden, E experts, F expert hidden, V vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _kernels
from .config import ModelConfig
from .gguf import GGMLType, GGUFFile

SWIGLU_ALPHA = 1.702   # gpt-oss's SwiGLU: hard-coded in the architecture, no GGUF key
SWIGLU_LIMIT = 7.0

# Every ggml type the kernels take, by the name the native side knows it by
# (csrc/formats.h; goosedump.config says which roles may use which).
FORMATS = {GGMLType.F32: "f32", GGMLType.F16: "f16", GGMLType.BF16: "bf16", GGMLType.Q4_0: "q4_0",
           GGMLType.Q4_1: "q4_1", GGMLType.Q5_0: "q5_0", GGMLType.Q5_1: "q5_1", GGMLType.Q8_0: "q8_0",
           GGMLType.Q2_K: "q2_k", GGMLType.Q3_K: "q3_k", GGMLType.Q4_K: "q4_k", GGMLType.Q5_K: "q5_k",
           GGMLType.Q6_K: "q6_k", GGMLType.IQ4_NL: "iq4_nl", GGMLType.IQ4_XS: "iq4_xs", GGMLType.MXFP4: "mxfp4"}


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w per row (native: numpy's five passes cost
    more than the arithmetic at decode's one row)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(x)
    _kernels.rms_norm(x, w, eps, out)
    return out


def add_rms_norm(x: np.ndarray, add: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x += add in place (x: float32, contiguous), then rms_norm(x, w, eps):
    the residual stream's step and the next norm in one native call."""
    out = np.empty_like(x)
    _kernels.add_rms_norm(x, np.ascontiguousarray(add, dtype=np.float32), w, eps, out)
    return out


@dataclass
class QMatrix:
    """A quantized weight matrix: rows of output features."""
    fmt: str
    raw: np.ndarray   # uint8 (rows, bytes per row), a view into the file
    bias: np.ndarray | None = None
    acts: str = "i16"

    def __call__(self, x: np.ndarray) -> np.ndarray:
        out = np.empty((x.shape[0], self.raw.shape[0]), np.float32)
        _kernels.matmul(self.fmt, self.raw, x, out, self.bias, acts=self.acts)
        return out


def expert_ffn(fmts: tuple[str, str, str], gate, gate_bias, up, up_bias, down, down_bias, h: np.ndarray,
               chosen: np.ndarray, weights: np.ndarray, acts: str) -> np.ndarray:
    """sum_j weights[t, j] * expert_{chosen[t, j]}(h[t]) -> [T, D], over stacked
    expert tensors (E, rows, bytes per row) in the formats (gate, up, down).
    Native: tokens grouped by expert, all gate/up rows in one parallel pass,
    the SwiGLU (gate clamped above at 7, up to [-7, 7], g sigmoid(1.702 g)
    (u + 1)), then all down rows."""
    out = np.empty_like(h)
    _kernels.moe(fmts[0], gate, gate_bias, fmts[1], up, up_bias, fmts[2], down, down_bias, h, chosen, weights,
                 out, SWIGLU_ALPHA, SWIGLU_LIMIT, acts=acts)
    return out


@dataclass
class Experts:
    """One layer's experts: the stacked tensors, each expert a contiguous
    slice; gate, up and down each in its own format (llama-quantize gives
    ffn_down more bits on some layers)."""
    fmts: tuple[str, str, str]
    gate: np.ndarray       # (E, F, bytes per row of D)
    gate_bias: np.ndarray  # (E, F)
    up: np.ndarray
    up_bias: np.ndarray
    down: np.ndarray       # (E, D, bytes per row of F)
    down_bias: np.ndarray  # (E, D)
    acts: str = "i16"

    def __call__(self, h: np.ndarray, chosen: np.ndarray, weights: np.ndarray) -> np.ndarray:
        return expert_ffn(self.fmts, self.gate, self.gate_bias, self.up, self.up_bias, self.down, self.down_bias,
                          h, chosen, weights, self.acts)


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


@dataclass
class Head:
    """The output head: the final RMS norm, then the output matrix. `logits`
    gives [T, V]; `argmax` the greedy token of each row without keeping the
    logits (one row: the fused native argmax, several: the logits' argmax;
    the same ids, since each row's dot products are the same bits either
    way, and ties go to the lowest id in both)."""
    norm: np.ndarray
    output: QMatrix
    eps: float

    def logits(self, x: np.ndarray) -> np.ndarray:
        return self.output(rms_norm(x, self.norm, self.eps))                    # [T, V]

    def argmax(self, x: np.ndarray) -> np.ndarray:
        h = rms_norm(x, self.norm, self.eps)
        if len(h) == 1:
            token, _ = _kernels.matvec_argmax(self.output.fmt, self.output.raw, h[0], acts=self.output.acts)
            return np.array([token], np.int64)
        return self.output(h).argmax(axis=-1)                                  # [T]


def qmatrix(f: GGUFFile, name: str, bias: str | None = None, acts: str = "i16") -> QMatrix:
    t = f.tensors[name]
    return QMatrix(FORMATS[GGMLType(t.type)], f.rows(name), None if bias is None else f.floats(bias), acts)


def load_layers(f: GGUFFile, c: ModelConfig, acts: str) -> list[Layer]:
    layers = []
    for i in range(c.n_layer):
        b = f"blk.{i}."

        def vec(name: str) -> np.ndarray:
            return f.floats(b + name)

        exp_fmts = tuple(FORMATS[GGMLType(f.tensors[b + f"ffn_{m}_exps.weight"].type)] for m in ("gate", "up", "down"))
        layers.append(Layer(
            attn_norm=vec("attn_norm.weight"),
            attn_q=qmatrix(f, b + "attn_q.weight", b + "attn_q.bias", acts),
            attn_k=qmatrix(f, b + "attn_k.weight", b + "attn_k.bias", acts),
            attn_v=qmatrix(f, b + "attn_v.weight", b + "attn_v.bias", acts),
            attn_output=qmatrix(f, b + "attn_output.weight", b + "attn_output.bias", acts),
            attn_sinks=vec("attn_sinks.weight"),
            post_attention_norm=vec("post_attention_norm.weight"),
            ffn_gate_inp=vec("ffn_gate_inp.weight"),
            ffn_gate_inp_bias=vec("ffn_gate_inp.bias"),
            experts=Experts(exp_fmts, f.rows(b + "ffn_gate_exps.weight"), vec("ffn_gate_exps.bias"),
                            f.rows(b + "ffn_up_exps.weight"), vec("ffn_up_exps.bias"),
                            f.rows(b + "ffn_down_exps.weight"), vec("ffn_down_exps.bias"), acts),
            window=c.sliding_window if c.is_sliding(i) else 0,
        ))
    return layers


def load_head(f: GGUFFile, c: ModelConfig, acts: str) -> Head:
    return Head(f.floats("output_norm.weight"), qmatrix(f, "output.weight", acts=acts), c.rms_eps)
