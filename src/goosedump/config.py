"""The model config, built only from a GGUF file's metadata, and the check of
every tensor against it. Nothing here knows 20b from 120b: both, and the tiny
test models, are described by their own keys.
"""
from __future__ import annotations

import dataclasses

import math
from dataclasses import dataclass

from .gguf import GGMLType, GGUFError, GGUFFile, StringArray, ValueType, type_name

ARCH = "gpt-oss"

_INT_TYPES = {ValueType.UINT8, ValueType.INT8, ValueType.UINT16, ValueType.INT16, ValueType.UINT32,
              ValueType.INT32, ValueType.UINT64, ValueType.INT64}
_FLOAT_TYPES = {ValueType.FLOAT32, ValueType.FLOAT64}


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters of a GPT-OSS model. Dimension letters used in shape
    comments elsewhere: D hidden, H query heads, K kv heads, d head dim,
    E experts, F expert hidden, V vocabulary, T tokens."""
    n_layer: int
    n_embd: int                 # D
    n_head: int                 # H
    n_head_kv: int              # K
    head_dim: int               # d (keys and queries)
    value_dim: int
    n_expert: int               # E
    n_expert_used: int
    n_ff_expert: int            # F
    n_vocab: int                # V
    context_length: int
    sliding_window: int         # even layers attend to this many positions
    rms_eps: float
    rope_base: float
    rope_scaling_factor: float  # YaRN; 1.0 means no scaling
    rope_original_context: int
    yarn_beta_fast: float
    yarn_beta_slow: float
    name: str = ""

    @property
    def n_gqa(self) -> int:
        """Query heads per kv head."""
        return self.n_head // self.n_head_kv

    def is_sliding(self, layer: int) -> bool:
        # No per-layer key exists: even layers slide, odd layers attend to all.
        return layer % 2 == 0


def _key(f: GGUFFile, key: str, kind: str, default=None):
    """Read a required (default None) or optional metadata key of a kind:
    'int', 'float' or 'str'. Errors name the file, the key and what was found."""
    field = f.fields.get(key)
    if field is None:
        if default is not None:
            return default
        raise GGUFError(f"{f.path}: missing metadata key '{key}' (expected {kind})")
    ok = {"int": _INT_TYPES, "float": _FLOAT_TYPES | _INT_TYPES, "str": {ValueType.STRING}}[kind]
    if field.type not in ok:
        raise GGUFError(f"{f.path}: metadata key '{key}' has type {field.type.name}, expected {kind}")
    if kind == "int":
        return int(field.value)
    if kind == "float":
        return float(field.value)
    return field.value


def _positive(f: GGUFFile, key: str, value: int) -> int:
    if value <= 0:
        raise GGUFError(f"{f.path}: metadata key '{key}' must be positive, got {value}")
    return value


def read_config(f: GGUFFile) -> ModelConfig:
    arch = _key(f, "general.architecture", "str")
    if arch != ARCH:
        raise GGUFError(f"{f.path}: wrong architecture: general.architecture is '{arch}', "
                        f"expected '{ARCH}'")
    p = ARCH + "."

    def pos_int(k: str) -> int:
        return _positive(f, p + k, _key(f, p + k, "int"))

    n_head = pos_int("attention.head_count")
    head_dim = pos_int("attention.key_length")
    tokens = f.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise GGUFError(f"{f.path}: missing metadata key 'tokenizer.ggml.tokens' (expected an "
                        f"array of strings)")
    if not isinstance(tokens.value, StringArray):
        raise GGUFError(f"{f.path}: metadata key 'tokenizer.ggml.tokens' has type "
                        f"{tokens.type.name}, expected an array of strings")

    scaling = _key(f, p + "rope.scaling.type", "str", default="none")
    if scaling not in ("yarn", "none"):
        raise GGUFError(f"{f.path}: metadata key '{p}rope.scaling.type' is '{scaling}', expected "
                        f"'yarn' (or absent)")
    factor = _key(f, p + "rope.scaling.factor", "float", default=1.0) if scaling == "yarn" else 1.0
    context = pos_int("context_length")
    cfg = ModelConfig(
        n_layer=pos_int("block_count"),
        n_embd=pos_int("embedding_length"),
        n_head=n_head,
        n_head_kv=pos_int("attention.head_count_kv"),
        head_dim=head_dim,
        value_dim=_positive(f, p + "attention.value_length",
                            _key(f, p + "attention.value_length", "int", default=head_dim)),
        n_expert=pos_int("expert_count"),
        n_expert_used=pos_int("expert_used_count"),
        n_ff_expert=pos_int("expert_feed_forward_length"),
        n_vocab=len(tokens.value),
        context_length=context,
        sliding_window=pos_int("attention.sliding_window"),
        rms_eps=_key(f, p + "attention.layer_norm_rms_epsilon", "float"),
        rope_base=_key(f, p + "rope.freq_base", "float"),
        rope_scaling_factor=factor,
        rope_original_context=(_key(f, p + "rope.scaling.original_context_length", "int")
                               if scaling == "yarn" else context),
        # Older converters wrote no beta keys; these are YaRN's defaults.
        yarn_beta_fast=_key(f, p + "rope.scaling.yarn_beta_fast", "float", default=32.0),
        yarn_beta_slow=_key(f, p + "rope.scaling.yarn_beta_slow", "float", default=1.0),
        name=_key(f, "general.name", "str", default=""),
    )
    _check_consistency(f, cfg)
    return cfg


def _check_consistency(f: GGUFFile, c: ModelConfig) -> None:
    p = ARCH + "."

    def bad(what: str) -> GGUFError:
        return GGUFError(f"{f.path}: inconsistent hyperparameters: {what}")

    if c.n_head % c.n_head_kv:
        raise bad(f"{p}attention.head_count ({c.n_head}) is not a multiple of "
                  f"{p}attention.head_count_kv ({c.n_head_kv})")
    if c.n_expert_used > c.n_expert:
        raise bad(f"{p}expert_used_count ({c.n_expert_used}) exceeds {p}expert_count ({c.n_expert})")
    if c.head_dim % 2:
        raise bad(f"{p}attention.key_length ({c.head_dim}) must be even for rotary embeddings")
    for key, v in (("embedding_length", c.n_embd), ("expert_feed_forward_length", c.n_ff_expert)):
        if v % 32:
            raise bad(f"{p}{key} ({v}) must be a multiple of 32, the quantization block size")
    if c.n_head * c.value_dim % 32:
        raise bad(f"{p}attention.head_count x value_length ({c.n_head * c.value_dim}) must be a "
                  f"multiple of 32, the quantization block size")
    if not (c.rms_eps > 0 and math.isfinite(c.rms_eps)):
        raise bad(f"{p}attention.layer_norm_rms_epsilon must be positive, got {c.rms_eps}")
    if not (c.rope_base > 1 and math.isfinite(c.rope_base)):
        raise bad(f"{p}rope.freq_base must be greater than 1, got {c.rope_base}")
    if not (c.rope_scaling_factor >= 1 and math.isfinite(c.rope_scaling_factor)):
        raise bad(f"{p}rope.scaling.factor must be at least 1, got {c.rope_scaling_factor}")
    if c.rope_original_context <= 0:
        raise bad(f"{p}rope.scaling.original_context_length must be positive, got "
                  f"{c.rope_original_context}")
    if not 0 < c.yarn_beta_slow < c.yarn_beta_fast:
        raise bad(f"YaRN betas must satisfy 0 < beta_slow ({c.yarn_beta_slow}) < beta_fast "
                  f"({c.yarn_beta_fast})")


# Allowed ggml types per tensor role: what the engine computes with. Every
# matrix (the embedding, attention, the output head, the experts) may be any
# format the kernels take; vectors (norms, biases, sinks, the router) are
# floats, converted to F32 at load; the experts' biases ride in the expert
# cache's slots as they are, so they must be F32 (as every converter writes
# them).
MATRIX_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0,
                GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K,
                GGMLType.Q6_K, GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.MXFP4)
EXPERT_TYPES = MATRIX_TYPES
VECTOR_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
EXPERT_BIAS_TYPES = (GGMLType.F32,)


def expected_tensors(c: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[GGMLType, ...]]]:
    """Every tensor a GPT-OSS file holds: name -> (ggml dims, innermost first; allowed types)."""
    D, V, E, F = c.n_embd, c.n_vocab, c.n_expert, c.n_ff_expert
    q, kv, o = c.n_head * c.head_dim, c.n_head_kv * c.head_dim, c.n_head * c.value_dim
    vdim = c.n_head_kv * c.value_dim
    t: dict[str, tuple[tuple[int, ...], tuple[GGMLType, ...]]] = {
        "token_embd.weight": ((D, V), MATRIX_TYPES),
        "output_norm.weight": ((D,), VECTOR_TYPES),
        "output.weight": ((D, V), MATRIX_TYPES),
    }
    for i in range(c.n_layer):
        b = f"blk.{i}."
        t |= {
            b + "attn_norm.weight": ((D,), VECTOR_TYPES),
            b + "attn_q.weight": ((D, q), MATRIX_TYPES),
            b + "attn_q.bias": ((q,), VECTOR_TYPES),
            b + "attn_k.weight": ((D, kv), MATRIX_TYPES),
            b + "attn_k.bias": ((kv,), VECTOR_TYPES),
            b + "attn_v.weight": ((D, vdim), MATRIX_TYPES),
            b + "attn_v.bias": ((vdim,), VECTOR_TYPES),
            b + "attn_output.weight": ((o, D), MATRIX_TYPES),
            b + "attn_output.bias": ((D,), VECTOR_TYPES),
            b + "attn_sinks.weight": ((c.n_head,), VECTOR_TYPES),
            b + "post_attention_norm.weight": ((D,), VECTOR_TYPES),
            b + "ffn_gate_inp.weight": ((D, E), VECTOR_TYPES),
            b + "ffn_gate_inp.bias": ((E,), VECTOR_TYPES),
            b + "ffn_gate_exps.weight": ((D, F, E), EXPERT_TYPES),
            b + "ffn_gate_exps.bias": ((F, E), EXPERT_BIAS_TYPES),
            b + "ffn_up_exps.weight": ((D, F, E), EXPERT_TYPES),
            b + "ffn_up_exps.bias": ((F, E), EXPERT_BIAS_TYPES),
            b + "ffn_down_exps.weight": ((F, D, E), EXPERT_TYPES),
            b + "ffn_down_exps.bias": ((D, E), EXPERT_BIAS_TYPES),
        }
    return t


def check_tensors(f: GGUFFile, c: ModelConfig) -> None:
    """Every expected tensor present with an allowed type and the exact shape;
    no tensor the architecture does not have."""
    per_layer = len(expected_tensors(dataclasses.replace(c, n_layer=1))) - 3    # less the 3 outside the layers
    if c.n_layer * per_layer > len(f.tensors):        # before a loop over billions of layers
        raise GGUFError(f"{f.path}: gpt-oss.block_count is {c.n_layer}, but the file holds {len(f.tensors)} tensors "
                        f"(a layer has {per_layer})")
    expected = expected_tensors(c)
    for name, (dims, types) in expected.items():
        t = f.tensors.get(name)
        if t is None:
            if name.endswith("ffn_gate_exps.weight") and name.replace("gate", "gate_up") in f.tensors:
                raise GGUFError(f"{f.path}: tensor '{name.replace('gate', 'gate_up')}': fused gate/up "
                                f"expert tensors are not supported; use a file with separate "
                                f"ffn_gate_exps and ffn_up_exps (as llama.cpp's converter writes)")
            raise GGUFError(f"{f.path}: missing tensor '{name}' (expected "
                            f"{'/'.join(x.name for x in types)} {list(dims)})")
        if t.type not in types:
            what = "is a type goosedump does not run" if t.type not in MATRIX_TYPES else "cannot hold this tensor"
            raise GGUFError(f"{f.path}: tensor '{name}' has type {type_name(t.type)}, which {what}; supported for "
                            f"this tensor: {', '.join(x.name for x in types)}")
        if t.dims != dims:
            raise GGUFError(f"{f.path}: tensor '{name}' has wrong shape {list(t.dims)}, expected "
                            f"{list(dims)} (ggml order, innermost first)")
    for name in f.tensors:
        if name not in expected:
            raise GGUFError(f"{f.path}: unexpected tensor '{name}' for a {c.n_layer}-layer "
                            f"{ARCH} model")
