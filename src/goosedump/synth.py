"""Synthetic GPT-OSS GGUF files: the real layout, the real vocabulary, random
weights.

The metadata keys, their types and order, and the tensor names, types, dims
and order follow ggml-org's gpt-oss-20b-mxfp4.gguf (llama.cpp's converter
followed by llama-quantize MXFP4_MOE): `metadata` and `tensors` below list them. Weights
are drawn so that every matrix keeps activations near unit scale, which keeps
a forward pass finite. Tensors are generated and written one expert slice at
a time, so memory stays bounded even for 120b.
"""
from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, replace
from typing import Callable, Iterator

import numpy as np

from . import randblocks
from .gguf import BLOCK_SIZES, GGMLType, ValueType, tensor_nbytes
from .gguf_writer import GGUFWriter
from .recipes import DEFAULT_RECIPE, apply_recipe
from .vocab import N_MERGEABLE, gguf_vocab, harmony_token_bytes

V = ValueType


@dataclass(frozen=True)
class Preset:
    name: str
    size_label: str
    n_layer: int
    n_embd: int = 2880
    n_head: int = 64
    n_head_kv: int = 8
    head_dim: int = 64
    n_expert: int = 32
    n_expert_used: int = 4
    n_ff_expert: int = 2880
    sliding_window: int = 128
    context_length: int = 131072
    rope_base: float = 150000.0
    rope_factor: float = 32.0
    rope_original_context: int = 4096
    rms_eps: float = 1e-5


PRESETS = {
    "tiny": Preset("tiny", "tiny", n_layer=4, n_embd=64, n_head=4, n_head_kv=2, head_dim=16,
                   n_expert=8, n_expert_used=4, n_ff_expert=64, sliding_window=8),
    # The 120b's shape of routing (128 experts, 36 layers) at tiny widths.
    "tiny-120b": Preset("tiny-120b", "tiny", n_layer=36, n_embd=64, n_head=4, n_head_kv=2,
                        head_dim=16, n_expert=128, n_expert_used=4, n_ff_expert=64,
                        sliding_window=8),
    "20b": Preset("20b", "20B", n_layer=24),
    "120b": Preset("120b", "120B", n_layer=36, n_expert=128),
}

FILE_TYPE_MXFP4_MOE = 38
QUANTIZATION_VERSION = 2

# A harmony-format chat template (our own; the GGUF key is what matters for
# the layout). Renders system/developer/user/assistant turns and ends with the
# assistant's start when asked for a generation prompt.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' and message.get('thinking') -%}"
    "<|start|>assistant<|channel|>analysis<|message|>{{ message['thinking'] }}<|end|>"
    "{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "<|start|>assistant<|channel|>final<|message|>{{ message['content'] }}<|end|>"
    "{%- else -%}"
    "<|start|>{{ message['role'] }}<|message|>{{ message['content'] }}<|end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}"
)


# ---- the file's description ------------------------------------------------

@dataclass
class TensorSpec:
    name: str
    dims: tuple[int, ...]         # ggml order, innermost first
    type: GGMLType
    init: str                     # how to draw it: see _chunks
    scale: float = 1.0
    data: np.ndarray | None = None  # given bytes instead of random ones (tests write real weights)


def metadata(p: Preset, vocab=None) -> list[tuple[str, ValueType, object, ValueType | None]]:
    """(key, type, value, element type) in the order of ggml-org's 20b file."""
    tokens, types, merges = gguf_vocab() if vocab is None else vocab
    index = {t: i for i, t in enumerate(tokens) if t.startswith("<|")}
    a = "gpt-oss."
    return [
        ("general.architecture", V.STRING, "gpt-oss", None),
        ("general.type", V.STRING, "model", None),
        ("general.name", V.STRING, f"Gpt Oss {p.size_label} (synthetic)", None),
        ("general.basename", V.STRING, "gpt-oss", None),
        ("general.size_label", V.STRING, p.size_label, None),
        ("general.license", V.STRING, "apache-2.0", None),
        ("general.tags", V.ARRAY, ["goosedump", "synthetic"], V.STRING),
        (a + "block_count", V.UINT32, p.n_layer, None),
        (a + "context_length", V.UINT32, p.context_length, None),
        (a + "embedding_length", V.UINT32, p.n_embd, None),
        (a + "feed_forward_length", V.UINT32, p.n_ff_expert, None),
        (a + "attention.head_count", V.UINT32, p.n_head, None),
        (a + "attention.head_count_kv", V.UINT32, p.n_head_kv, None),
        (a + "rope.freq_base", V.FLOAT32, p.rope_base, None),
        (a + "attention.layer_norm_rms_epsilon", V.FLOAT32, p.rms_eps, None),
        (a + "expert_count", V.UINT32, p.n_expert, None),
        (a + "expert_used_count", V.UINT32, p.n_expert_used, None),
        (a + "attention.key_length", V.UINT32, p.head_dim, None),
        (a + "attention.value_length", V.UINT32, p.head_dim, None),
        (a + "attention.sliding_window", V.UINT32, p.sliding_window, None),
        (a + "expert_feed_forward_length", V.UINT32, p.n_ff_expert, None),
        (a + "rope.scaling.type", V.STRING, "yarn", None),
        (a + "rope.scaling.factor", V.FLOAT32, p.rope_factor, None),
        (a + "rope.scaling.original_context_length", V.UINT32, p.rope_original_context, None),
        ("tokenizer.ggml.model", V.STRING, "gpt2", None),
        ("tokenizer.ggml.pre", V.STRING, "gpt-4o", None),
        ("tokenizer.ggml.tokens", V.ARRAY, tokens, V.STRING),
        ("tokenizer.ggml.token_type", V.ARRAY, types, V.INT32),
        ("tokenizer.ggml.merges", V.ARRAY, merges, V.STRING),
        ("tokenizer.ggml.bos_token_id", V.UINT32, index["<|startoftext|>"], None),
        ("tokenizer.ggml.eos_token_id", V.UINT32, index["<|return|>"], None),
        ("tokenizer.ggml.padding_token_id", V.UINT32, index["<|endoftext|>"], None),
        ("tokenizer.chat_template", V.STRING, CHAT_TEMPLATE, None),
        ("general.quantization_version", V.UINT32, QUANTIZATION_VERSION, None),
        ("general.file_type", V.UINT32, FILE_TYPE_MXFP4_MOE, None),
    ]


ROUTINGS = ("uniform", "skewed")


def tensors(p: Preset, n_vocab: int, routing: str = "uniform") -> list[TensorSpec]:
    """All tensors, in the order llama-quantize writes them (non-layer tensors
    first, then by layer number, then by name). routing="skewed" gives each
    layer's router Zipf-like biases (over a random order of its experts) and
    weaker weights, so a few experts take most selections and keep taking
    them token after token, as in trained MoE models; "uniform" routes close
    to uniformly."""
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
    skewed = routing == "skewed"
    D, E, F = p.n_embd, p.n_expert, p.n_ff_expert
    q, kv = p.n_head * p.head_dim, p.n_head_kv * p.head_dim
    Q8, MX, F32 = GGMLType.Q8_0, GGMLType.MXFP4, GGMLType.F32
    out = [
        TensorSpec("output.weight", (D, n_vocab), Q8, "matrix", D ** -0.5),
        TensorSpec("output_norm.weight", (D,), F32, "norm"),
        TensorSpec("token_embd.weight", (D, n_vocab), Q8, "matrix", 1.0),
    ]
    for i in range(p.n_layer):
        layer = [
            TensorSpec("attn_k.bias", (kv,), F32, "bias"),
            TensorSpec("attn_k.weight", (D, kv), Q8, "matrix", D ** -0.5),
            TensorSpec("attn_norm.weight", (D,), F32, "norm"),
            TensorSpec("attn_output.bias", (D,), F32, "bias"),
            TensorSpec("attn_output.weight", (q, D), Q8, "matrix", 0.5 * q ** -0.5),
            TensorSpec("attn_q.bias", (q,), F32, "bias"),
            TensorSpec("attn_q.weight", (D, q), Q8, "matrix", D ** -0.5),
            TensorSpec("attn_sinks.weight", (p.n_head,), F32, "normal", 1.0),
            TensorSpec("attn_v.bias", (kv,), F32, "bias"),
            TensorSpec("attn_v.weight", (D, kv), Q8, "matrix", D ** -0.5),
            TensorSpec("ffn_down_exps.bias", (D, E), F32, "bias"),
            TensorSpec("ffn_down_exps.weight", (F, D, E), MX, "experts", 0.5 * F ** -0.5),
            TensorSpec("ffn_gate_exps.bias", (F, E), F32, "bias"),
            TensorSpec("ffn_gate_exps.weight", (D, F, E), MX, "experts", D ** -0.5),
            TensorSpec("ffn_gate_inp.bias", (E,), F32, "zipf" if skewed else "bias", 1.0),
            TensorSpec("ffn_gate_inp.weight", (D, E), F32, "normal", (0.7 if skewed else 1.0) * D ** -0.5),
            TensorSpec("ffn_up_exps.bias", (F, E), F32, "bias"),
            TensorSpec("ffn_up_exps.weight", (D, F, E), MX, "experts", D ** -0.5),
            TensorSpec("post_attention_norm.weight", (D,), F32, "norm"),
        ]
        out += [replace(t, name=f"blk.{i}.{t.name}") for t in layer]
    return out


# ---- random data -------------------------------------------------------------

_CHUNK = 1 << 24  # bytes per generated chunk for tensors without an expert axis


def _rng(seed: int, name: str, part: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode()), part])


def _chunks(t: TensorSpec, seed: int) -> Iterator[np.ndarray]:
    if t.data is not None:
        yield t.data
        return
    if t.init not in ("matrix", "experts"):   # vectors: F32
        n = int(np.prod(t.dims))
        rng = _rng(seed, t.name, 0)
        if t.init == "norm":
            yield (1.0 + 0.05 * rng.standard_normal(n)).astype("<f4")
        elif t.init == "bias":
            yield (0.02 * rng.standard_normal(n)).astype("<f4")
        elif t.init == "zipf":   # logit bias log(1/rank)^scale over a random order of the experts
            ranks = rng.permutation(n) + 1
            yield (-t.scale * np.log(ranks)).astype("<f4")
        else:
            yield (t.scale * rng.standard_normal(n)).astype("<f4")
        return
    values, size = BLOCK_SIZES[GGMLType(t.type)]
    if t.init == "experts":  # one expert at a time
        per_expert = t.dims[0] * t.dims[1] // values
        for e in range(t.dims[2]):
            yield randblocks.blocks(t.type, _rng(seed, t.name, e), per_expert, t.scale)
        return
    n_blocks = tensor_nbytes(t.type, t.dims) // size
    step = _CHUNK // size
    for part, start in enumerate(range(0, n_blocks, step)):
        yield randblocks.blocks(t.type, _rng(seed, t.name, part), min(step, n_blocks - start), t.scale)


def planned_bytes(preset: Preset | str, recipe: str = DEFAULT_RECIPE, routing: str = "uniform") -> int:
    """About the bytes write_model writes (the tensors' data; headers add a
    few MB), for checking the disk before writing."""
    p = PRESETS[preset] if isinstance(preset, str) else preset
    kv = metadata(p, None)
    n_vocab = len(kv[[k for k, *_ in kv].index("tokenizer.ggml.tokens")][2])
    specs = tensors(p, n_vocab, routing)
    apply_recipe(specs, recipe)
    return sum(tensor_nbytes(t.type, t.dims) for t in specs)


def write_model(out_path: str | os.PathLike, preset: Preset | str, seed: int = 0,
                progress: bool = False, vocab=None,
                edit: Callable[[list, list], None] | None = None, routing: str = "uniform",
                recipe: str = DEFAULT_RECIPE, split_max_size: int | None = None,
                paths_out: list | None = None) -> int:
    """Write a synthetic model. `recipe` picks each tensor's type as the
    published files do (goosedump.recipes); `split_max_size` (bytes of tensor
    data per file) writes a split set NAME-00001-of-0000N.gguf, ... as
    llama-gguf-split does, named after out_path. `vocab` (tokens, types,
    merges) replaces the real vocabulary (tests use small ones);
    `edit(kv, tensors)` may change the description before anything is
    written (tests use it to craft bad files). Returns the number of bytes
    written (all parts); paths_out, if given, receives the files' paths."""
    p = PRESETS[preset] if isinstance(preset, str) else preset
    kv = metadata(p, vocab)
    n_vocab = len(kv[[k for k, *_ in kv].index("tokenizer.ggml.tokens")][2])
    specs = tensors(p, n_vocab, routing)
    file_type = apply_recipe(specs, recipe)
    kv = [(k, vt, file_type if k == "general.file_type" else v, et) for k, vt, v, et in kv]
    if edit is not None:
        edit(kv, specs)
    parts = split_specs(specs, split_max_size) if split_max_size else [specs]
    paths = [os.fspath(out_path)] if len(parts) == 1 else split_paths(os.fspath(out_path), len(parts))
    if paths_out is not None:
        paths_out.extend(paths)
    total = sum(tensor_nbytes(t.type, t.dims) for t in specs)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024,
                   desc=f"synth {p.name} {recipe}", dynamic_ncols=True)
    written = 0
    try:
        for k, (path, part) in enumerate(zip(paths, parts)):
            part_kv = kv if k == 0 else []
            if len(parts) > 1:    # the split keys, after the model's (llama-gguf-split's order)
                part_kv = part_kv + [("split.no", V.UINT16, k, None), ("split.count", V.UINT16, len(parts), None),
                                     ("split.tensors.count", V.INT32, len(specs), None)]
            written += _write_file(path, part_kv, part, seed, bar)
    finally:
        if bar is not None:
            bar.close()
    return written


def _write_file(path: str, kv: list, specs: list[TensorSpec], seed: int, bar) -> int:
    tmp = f"{path}.partial" if os.path.basename(path) != "null" else None
    target = tmp or path
    try:
        with open(target, "wb") as f:
            w = GGUFWriter(f)
            for key, vtype, value, etype in kv:
                w.add(key, vtype, value, etype)
            for t in specs:
                w.add_tensor(t.name, t.dims, t.type)
            w.write_header()
            for t in specs:
                def counted(chunks):
                    for c in chunks:
                        if bar is not None:
                            bar.update(c.nbytes)
                        yield c
                w.write_tensor(t.name, counted(_chunks(t, seed)))
            w.finish()
            written = w.bytes_written
        if tmp:
            os.replace(tmp, path)
    finally:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)
    return written


def split_specs(specs: list[TensorSpec], max_bytes: int) -> list[list[TensorSpec]]:
    """Tensors in order, a new part whenever the next would take a part's
    tensor data past max_bytes (llama-gguf-split --split-max-size; a tensor
    larger than that gets a part of its own)."""
    parts: list[list[TensorSpec]] = [[]]
    size = 0
    for t in specs:
        n = -(-tensor_nbytes(t.type, t.dims) // 32) * 32
        if parts[-1] and size + n > max_bytes:
            parts.append([])
            size = 0
        parts[-1].append(t)
        size += n
    return parts


def split_paths(out_path: str, count: int) -> list[str]:
    """The parts' names: out_path without .gguf (and without a -0000K-of-0000N
    of its own), then -00001-of-0000N.gguf ... (llama-gguf-split's names)."""
    from .gguf_split import SPLIT_NAME, part_path
    m = SPLIT_NAME.match(out_path)
    prefix = m["prefix"] if m else out_path.removesuffix(".gguf")
    return [part_path(prefix, k + 1, count) for k in range(count)]


def small_vocab(n_words: int = 512):
    """A real-format vocabulary cut down to the 256 single bytes, the first
    merges of o200k and the harmony specials: for fast tests of file handling
    (not of tokenization)."""
    tb = harmony_token_bytes()
    mergeable = tb[:n_words]
    specials = tb[N_MERGEABLE:N_MERGEABLE + 21]
    from .vocab import hf_merges, to_gpt2_string
    tokens = [to_gpt2_string(b) for b in mergeable] + [s.decode() for s in specials]
    types = np.array([1] * len(mergeable) + [3] * len(specials), dtype=np.int32)
    return tokens, types, hf_merges(mergeable + specials, len(mergeable))
