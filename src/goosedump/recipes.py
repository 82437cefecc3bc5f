"""The recipes of the gpt-oss GGUF files users download: which ggml type each
tensor has. Synthetic models are written in them (goosedump synth --recipe),
so tests and benchmarks meet the files people have.

The quantized recipes follow llama-quantize's choice per tensor
(llama_tensor_get_type and tensor_type_fallback in llama.cpp's
src/llama-quant.cpp), ported here for the ftypes gpt-oss files are published
in: the output head Q6_K (Q8_0 where its rows do not split into 256-value
super-blocks), more bits for attn_v and ffn_down on a third of the layers,
and a 32-value fallback wherever a row length is not a multiple of 256. For
gpt-oss (rows of 2880) that leaves K-quants only in attn_output (rows of
4096): Q4_K_M is mostly Q5_0. The published K-quant files (unsloth,
bartowski) keep the experts MXFP4, as `--tensor-type
'ffn_(gate|up|down)_exps=mxfp4'` does; the legacy-quant recipes are what
`llama-quantize --allow-requantize` makes of an MXFP4 file, experts
requantized too. Norms, biases, sinks and the router stay F32 everywhere.
"""
from __future__ import annotations

from .gguf import BLOCK_SIZES, GGMLType

Q = GGMLType

# name -> (llama ftype's default type, general.file_type, experts: "mxfp4" kept or "requantized", who ships it)
RECIPES = {
    "mxfp4": (Q.MXFP4, 38, "mxfp4", "ggml-org, lmstudio-community *-mxfp4.gguf (llama-quantize MXFP4_MOE)"),
    "f16": (Q.F16, 1, "mxfp4", "unsloth *-F16.gguf (convert_hf_to_gguf --outtype f16: experts stay MXFP4)"),
    "bf16": (Q.BF16, 32, "mxfp4", "convert_hf_to_gguf --outtype bf16 (experts stay MXFP4)"),
    "q8_0": (Q.Q8_0, 7, "requantized", "llama-quantize --allow-requantize Q8_0: every matrix Q8_0"),
    "q6_k": (Q.Q6_K, 18, "mxfp4", "unsloth, bartowski Q6_K (experts kept MXFP4)"),
    "q5_k_m": (Q.Q5_K, 17, "mxfp4", "unsloth, bartowski Q5_K_M (experts kept MXFP4)"),
    "q4_k_m": (Q.Q4_K, 15, "mxfp4", "unsloth, bartowski Q4_K_M (experts kept MXFP4)"),
    "q3_k_m": (Q.Q3_K, 12, "mxfp4", "unsloth, bartowski Q3_K_M (experts kept MXFP4)"),
    "q2_k": (Q.Q2_K, 10, "mxfp4", "unsloth, bartowski Q2_K (experts kept MXFP4)"),
    "iq4_xs": (Q.IQ4_XS, 30, "mxfp4", "IQ4_XS (experts kept MXFP4)"),
    "q5_0": (Q.Q5_0, 8, "requantized", "llama-quantize --allow-requantize Q5_0: experts requantized"),
    "q4_1": (Q.Q4_1, 3, "requantized", "llama-quantize --allow-requantize Q4_1: experts requantized"),
    "q4_0": (Q.Q4_0, 2, "requantized", "llama-quantize --allow-requantize Q4_0: experts requantized"),
}
DEFAULT_RECIPE = "mxfp4"

# A target whose block does not divide the row length falls back (tensor_type_fallback).
_FALLBACK = {Q.Q2_K: Q.Q4_0, Q.Q3_K: Q.Q4_0, Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0, Q.IQ4_XS: Q.IQ4_NL}
_MATRICES = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight")
_EXPERTS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")


def _more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers and
    every third one between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(recipe: str, name: str, dims: tuple[int, ...], n_layer: int, n_expert: int, n_gqa: int) -> GGMLType | None:
    """The type of tensor `name` (ggml dims) in the recipe, or None for a
    tensor the recipe leaves as it is (vectors, the router)."""
    default, _, experts, _ = RECIPES[recipe]
    base = name.split(".", 2)[-1] if name.startswith("blk.") else name
    layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
    if base not in _MATRICES + _EXPERTS and name not in ("token_embd.weight", "output.weight"):
        return None
    if base in _EXPERTS and experts == "mxfp4":
        return Q.MXFP4
    if default in (Q.F16, Q.BF16, Q.MXFP4):      # converter files, and MXFP4_MOE: dense Q8_0
        return Q.Q8_0 if default == Q.MXFP4 else default
    nx = dims[0]
    t = default
    if name == "output.weight":
        return Q.Q8_0 if nx % 256 or default == Q.Q8_0 else Q.Q6_K
    if base == "attn_v.weight":
        if default == Q.Q2_K:
            t = Q.Q4_K if n_gqa >= 4 else Q.Q3_K
        elif default == Q.Q3_K:
            t = Q.Q5_K if layer < 2 else Q.Q4_K
        elif default == Q.IQ4_XS and n_gqa >= 4:
            t = Q.Q5_K
        elif default in (Q.Q4_K, Q.Q5_K) and _more_bits(layer, n_layer):
            t = Q.Q6_K
        if n_expert == 8:            # "for the 8-expert model, bumping this to Q8_0 trades just ~128MB"
            t = Q.Q8_0
    elif base == "attn_k.weight":
        if n_expert == 8:
            t = Q.Q8_0
    elif base == "ffn_down_exps.weight":
        if default == Q.Q2_K:
            t = Q.Q3_K
        elif default == Q.Q3_K:
            t = Q.Q5_K if layer < n_layer // 16 else Q.Q4_K
        elif default in (Q.Q4_K, Q.Q5_K) and _more_bits(layer, n_layer):
            t = Q.Q6_K
        elif default == Q.IQ4_XS and layer < n_layer // 8:
            t = Q.Q5_K
    elif base == "attn_output.weight":
        if n_expert == 8:
            if default in (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.IQ4_XS):
                t = Q.Q5_K
        elif default == Q.Q2_K:
            t = Q.Q3_K
        elif default == Q.Q3_K:
            t = Q.Q4_K
    if nx % BLOCK_SIZES[t][0]:
        t = _FALLBACK.get(t, t)
        if nx % BLOCK_SIZES[t][0]:
            t = Q.F16
    return t


def apply_recipe(specs, recipe: str) -> int:
    """Set the type of every tensor spec (name, dims, type) the recipe names;
    returns the recipe's general.file_type."""
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {', '.join(RECIPES)}, got {recipe!r}")
    layers = {int(s.name.split(".")[1]) for s in specs if s.name.startswith("blk.")}
    n_layer = max(layers) + 1 if layers else 0
    exps = next((s for s in specs if s.name.endswith("ffn_gate_exps.weight")), None)
    n_expert = exps.dims[2] if exps is not None else 1
    q = next((s for s in specs if s.name.endswith("attn_q.weight")), None)
    k = next((s for s in specs if s.name.endswith("attn_k.weight")), None)
    n_gqa = q.dims[1] // k.dims[1] if q is not None and k is not None else 1
    for s in specs:
        t = tensor_type(recipe, s.name, s.dims, n_layer, n_expert, n_gqa)
        if t is not None:
            s.type = t
    return RECIPES[recipe][1]
