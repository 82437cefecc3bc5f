"""Tiny GPT-OSS models in transformers (the reference) and the same weights
in a GGUF file in the real layout, in any recipe (goosedump.recipes).

Every weight goes through gguf-py: normal weights quantized by
gguf.quants.quantize where gguf-py can (F16, BF16, Q4_0..Q8_0, MXFP4), random
codes (goosedump.randblocks) where it cannot (the K-quants, IQ4), then
gguf.quants.dequantize; so the transformers model holds exactly the values
the GGUF holds, and what remains between the two is the engine's arithmetic."""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf import quants

from goosedump import randblocks, synth
from goosedump.gguf import BLOCK_SIZES, GGMLType
from goosedump.recipes import tensor_type

# what gguf-py can quantize
QUANTIZABLE = {GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1,
               GGMLType.Q8_0, GGMLType.MXFP4}


@dataclass(frozen=True)
class RefConfig:
    n_layer: int = 4
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_expert: int = 8
    n_expert_used: int = 4
    n_ff: int = 64
    window: int = 8
    rope_base: float = 150000.0
    rope_factor: float = 32.0
    rope_original_context: int = 4096
    context_length: int = 131072


def _q(w: np.ndarray, qtype) -> tuple[np.ndarray, np.ndarray]:
    """(raw GGUF bytes, the float values they hold) for a [rows, cols] matrix."""
    raw = quants.quantize(np.ascontiguousarray(w, dtype=np.float32), qtype)
    with np.errstate(over="ignore"):
        return raw, quants.dequantize(raw, qtype).astype(np.float32)


def build(cfg: RefConfig, vocab, path: str | os.PathLike, seed: int = 0, recipe: str = "mxfp4",
          split_max_size: int | None = None):
    """Write the GGUF to path (a split set named after it, with
    split_max_size) and return the transformers model (fp32, eval)."""
    from transformers import GptOssConfig, GptOssForCausalLM

    tokens, _, _ = vocab
    V = len(tokens)
    hf_cfg = GptOssConfig(
        vocab_size=V, hidden_size=cfg.n_embd, intermediate_size=cfg.n_ff, num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_head_kv, head_dim=cfg.head_dim,
        num_local_experts=cfg.n_expert, num_experts_per_tok=cfg.n_expert_used, sliding_window=cfg.window,
        max_position_embeddings=cfg.context_length, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "yarn", "rope_theta": cfg.rope_base, "factor": cfg.rope_factor,
                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": cfg.rope_original_context},
        attn_implementation="eager", tie_word_embeddings=False)
    model = GptOssForCausalLM(hf_cfg).float().eval()
    rng = np.random.default_rng(seed)
    D, F, E, H = cfg.n_embd, cfg.n_ff, cfg.n_expert, cfg.n_head

    def normal(shape, std):
        return (std * rng.standard_normal(shape)).astype(np.float32)

    data: dict[str, np.ndarray] = {}   # GGUF tensor name -> raw bytes or float32 values

    def set_(param, value):
        with torch.no_grad():
            param.copy_(torch.from_numpy(np.ascontiguousarray(value)))

    n_gqa = cfg.n_head // cfg.n_head_kv

    def kind(name: str, dims) -> GGMLType:
        return tensor_type(recipe, name, dims, cfg.n_layer, E, n_gqa)

    def matrix(t: GGMLType, rows: int, cols: int, std: float):
        """(raw, values) of a [rows, cols] matrix of type t."""
        if t in QUANTIZABLE:
            return _q(normal((rows, cols), std), QT(int(t)))
        raw = randblocks.blocks(t, rng, rows * cols // BLOCK_SIZES[t][0], std).reshape(rows, -1)
        with np.errstate(over="ignore"):
            return raw, quants.dequantize(raw.reshape(-1), QT(int(t))).reshape(rows, cols).astype(np.float32)

    def q8(param, name, std):
        rows, cols = param.shape
        raw, deq = matrix(kind(name, (cols, rows)), rows, cols, std)
        set_(param, deq)
        data[name] = raw

    def f32(param, name, value):
        set_(param, value)
        data[name] = np.ascontiguousarray(value, dtype=np.float32)

    m = model.model
    q8(m.embed_tokens.weight, "token_embd.weight", 1.0)
    # logits with a spread like a trained model's (std ~10), so greedy choices have clear margins
    q8(model.lm_head.weight, "output.weight", 10 * D ** -0.5)
    f32(m.norm.weight, "output_norm.weight", 1 + normal((D,), 0.1))
    for i, layer in enumerate(m.layers):
        b = f"blk.{i}."
        a = layer.self_attn
        f32(layer.input_layernorm.weight, b + "attn_norm.weight", 1 + normal((D,), 0.1))
        f32(layer.post_attention_layernorm.weight, b + "post_attention_norm.weight", 1 + normal((D,), 0.1))
        for proj, name, std in ((a.q_proj, "attn_q", D ** -0.5), (a.k_proj, "attn_k", D ** -0.5),
                                (a.v_proj, "attn_v", D ** -0.5),
                                (a.o_proj, "attn_output", 0.5 * (H * cfg.head_dim) ** -0.5)):
            q8(proj.weight, b + name + ".weight", std)
            f32(proj.bias, b + name + ".bias", normal(tuple(proj.bias.shape), 0.1))
        f32(a.sinks, b + "attn_sinks.weight", normal((H,), 1.0))
        r = layer.mlp.router
        f32(r.weight, b + "ffn_gate_inp.weight", normal((E, D), D ** -0.5))
        f32(r.bias, b + "ffn_gate_inp.bias", normal((E,), 0.5))
        ex = layer.mlp.experts
        gate_raw, up_raw, down_raw = [], [], []
        gate_up = np.empty((E, D, 2 * F), np.float32)
        down = np.empty((E, F, D), np.float32)
        tg, tu = kind(b + "ffn_gate_exps.weight", (D, F, E)), kind(b + "ffn_up_exps.weight", (D, F, E))
        td = kind(b + "ffn_down_exps.weight", (F, D, E))
        for e in range(E):
            graw, g = matrix(tg, F, D, D ** -0.5)      # rows: output features
            uraw, u = matrix(tu, F, D, D ** -0.5)
            draw, dn = matrix(td, D, F, 0.5 * F ** -0.5)
            gate_up[e, :, 0::2], gate_up[e, :, 1::2] = g.T, u.T      # transformers interleaves gate/up
            down[e] = dn.T
            gate_raw.append(graw)
            up_raw.append(uraw)
            down_raw.append(draw)
        set_(ex.gate_up_proj, gate_up)
        set_(ex.down_proj, down)
        gb, ub, db = normal((E, F), 0.1), normal((E, F), 0.1), normal((E, D), 0.1)
        gub = np.empty((E, 2 * F), np.float32)
        gub[:, 0::2], gub[:, 1::2] = gb, ub
        set_(ex.gate_up_proj_bias, gub)
        set_(ex.down_proj_bias, db)
        data[b + "ffn_gate_exps.weight"] = np.stack(gate_raw)
        data[b + "ffn_up_exps.weight"] = np.stack(up_raw)
        data[b + "ffn_down_exps.weight"] = np.stack(down_raw)
        data[b + "ffn_gate_exps.bias"], data[b + "ffn_up_exps.bias"] = gb, ub
        data[b + "ffn_down_exps.bias"] = db

    preset = synth.Preset("reference", "test", n_layer=cfg.n_layer, n_embd=D, n_head=H, n_head_kv=cfg.n_head_kv,
                          head_dim=cfg.head_dim, n_expert=E, n_expert_used=cfg.n_expert_used, n_ff_expert=F,
                          sliding_window=cfg.window, context_length=cfg.context_length, rope_base=cfg.rope_base,
                          rope_factor=cfg.rope_factor, rope_original_context=cfg.rope_original_context)

    def edit(kv, specs):
        for t in specs:
            t.data = data.pop(t.name)
        assert not data, f"tensors not in the layout: {sorted(data)}"

    synth.write_model(path, preset, vocab=vocab, edit=edit, recipe=recipe, split_max_size=split_max_size)
    return model
