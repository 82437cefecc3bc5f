"""Synthetic models, `goosedump inspect`, sizes and the public API."""
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import goosedump
from goosedump import _kernels, synth
from goosedump.budget import SizeError, expert_cache_budget, parse_size
from goosedump.gguf import GGUFFile, ValueType

# Key order of ggml-org's gpt-oss-20b-mxfp4.gguf, as llama.cpp prints it.
REAL_KEY_ORDER = [
    "general.architecture", "general.type", "general.name", "general.basename", "general.size_label",
    "general.license", "general.tags", "gpt-oss.block_count", "gpt-oss.context_length",
    "gpt-oss.embedding_length", "gpt-oss.feed_forward_length", "gpt-oss.attention.head_count",
    "gpt-oss.attention.head_count_kv", "gpt-oss.rope.freq_base",
    "gpt-oss.attention.layer_norm_rms_epsilon", "gpt-oss.expert_count", "gpt-oss.expert_used_count",
    "gpt-oss.attention.key_length", "gpt-oss.attention.value_length",
    "gpt-oss.attention.sliding_window", "gpt-oss.expert_feed_forward_length",
    "gpt-oss.rope.scaling.type", "gpt-oss.rope.scaling.factor",
    "gpt-oss.rope.scaling.original_context_length", "tokenizer.ggml.model", "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id",
    "tokenizer.chat_template", "general.quantization_version", "general.file_type",
]


def test_layout_matches_the_real_file(tiny_path):
    f = GGUFFile(tiny_path)
    assert list(f.fields) == REAL_KEY_ORDER
    assert f.fields["gpt-oss.rope.freq_base"].type == ValueType.FLOAT32
    assert f.fields["gpt-oss.attention.sliding_window"].type == ValueType.UINT32
    assert f.fields["tokenizer.ggml.token_type"].element_type == ValueType.INT32
    tokens, merges = f.get("tokenizer.ggml.tokens"), f.get("tokenizer.ggml.merges")
    assert len(tokens) == 201088 and len(merges) == 446189
    assert [merges[i] for i in range(3)] == ["Ġ Ġ", "Ġ ĠĠĠ", "ĠĠ ĠĠ"]
    assert tokens[198] == "Ċ" and tokens[200018] == "<|endofprompt|>" and tokens[200019] == "[PAD200019]"
    types = f.get("tokenizer.ggml.token_type")
    assert (types[:199998] == 1).all() and (types[199998:200019] == 3).all() and (types[200019:] == 5).all()
    assert f.get("general.file_type") == 38
    # Tensor order: the three non-layer tensors, then each layer's sorted by name.
    names = list(f.tensors)
    assert names[:3] == ["output.weight", "output_norm.weight", "token_embd.weight"]
    layer0 = [n for n in names if n.startswith("blk.0.")]
    assert layer0 == sorted(layer0) and len(layer0) == 19
    assert names.index("blk.1.attn_k.bias") > names.index("blk.0.post_attention_norm.weight")


def test_same_seed_same_file_other_seed_other_weights(tmp_path, small_vocab):
    paths = [tmp_path / f"{i}.gguf" for i in range(3)]
    for p, seed in zip(paths, (5, 5, 6)):
        synth.write_model(p, "tiny", seed=seed, vocab=small_vocab)
    digest = [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]
    assert digest[0] == digest[1] != digest[2]


def _dequantized(f, name):
    t = f.tensors[name]
    fmt = {8: "q8_0", 39: "mxfp4"}[t.type]
    out = np.empty(int(np.prod(t.dims)), np.float32)
    _kernels.dequantize(fmt, f.tensor_bytes(name), out)
    return out


def test_weight_magnitudes_keep_activations_near_unit_scale(tiny_path):
    f = GGUFFile(tiny_path)
    D, F = 64, 64
    for name, target in [("blk.0.attn_q.weight", D ** -0.5), ("blk.0.ffn_gate_exps.weight", D ** -0.5),
                         ("blk.0.ffn_down_exps.weight", 0.5 * F ** -0.5), ("token_embd.weight", 1.0)]:
        w = _dequantized(f, name)
        assert np.isfinite(w).all()
        assert 0.6 * target < w.std() < 1.6 * target, (name, w.std(), target)
    norm = f.tensor("output_norm.weight")
    assert abs(norm.mean() - 1) < 0.05


def test_inspect_json(tiny_path):
    out = subprocess.run([sys.executable, "-m", "goosedump", "inspect", tiny_path, "--json",
                          "--expert-cache", "2M", "--ctx", "100"], capture_output=True, text=True, check=True)
    r = json.loads(out.stdout)
    f = GGUFFile(tiny_path)
    pieces = ("ffn_gate_exps.weight", "ffn_gate_exps.bias", "ffn_up_exps.weight", "ffn_up_exps.bias",
              "ffn_down_exps.weight", "ffn_down_exps.bias")
    # a slot holds each piece in whole pages, plus one (direct reads start at a page boundary)
    slot = sum(-(-f.tensors[f"blk.0.{p}"].nbytes // 8 // 4096) * 4096 + 4096 for p in pieces)
    assert r["expert_slot_bytes"] == slot
    assert r["expert_bytes"] == sum(f.tensors[f"blk.{i}.{p}"].nbytes for i in range(4) for p in pieces)
    assert r["dense_bytes"] + r["expert_bytes"] == sum(t.nbytes for t in f.tensors.values())
    assert r["tensors"] == 79 and r["hyperparameters"]["n_expert"] == 8
    assert r["bytes_by_type"]["MXFP4"]["tensors"] == 12
    m = r["memory"]
    assert m["experts_in_place"] is True  # 2M covers the tiny model's 32 experts: no copies
    assert m["expert_cache"] == r["expert_bytes"] and m["expert_slots"] == 32
    # kv cache: fp16 k and v for 2 kv heads of 16; the 2 sliding layers' rings (window 8 + 127) are
    # capped by the context of 100, like the 2 full layers: exactly what the engine allocates
    assert m["kv_cache"] == 2 * 2 * 16 * 2 * (100 * 2 + 100 * 2)
    import goosedump
    assert m["kv_cache"] == goosedump.load(tiny_path).new_cache(100).nbytes


def test_budget_smaller_than_the_experts_holds_whole_slots(tiny_model):
    from goosedump.layout import estimate_memory
    lay = tiny_model.layout
    m = estimate_memory(tiny_model.config, lay, 10 * lay.expert_slot_bytes + 5, 4096)
    assert not m.experts_in_place and m.expert_slots == 10
    assert m.expert_cache == 10 * lay.expert_slot_bytes
    assert m.total == m.dense + m.expert_cache + m.kv_cache + m.scratch


def test_inspect_text_and_in_place_budget(tiny_path, capsys):
    from goosedump.cli import main
    assert main(["inspect", tiny_path]) == 0
    out = capsys.readouterr().out
    assert "gpt-oss" in out and "one expert's cache slot" in out and "all experts used in place" in out


def test_synth_cli_end_to_end(tmp_path):
    out = tmp_path / "t.gguf"
    subprocess.run(["goosedump", "synth", "--preset", "tiny", "--out", str(out), "--quiet"], check=True,
                   env={**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]})
    model = goosedump.load(out)
    assert model.config.n_layer == 4
    assert not os.path.exists(str(out) + ".partial")


@pytest.mark.parametrize("text,expect", [("1M", 1 << 20), ("512M", 512 << 20), ("2G", 2 << 30),
                                         ("16G", 16 << 30)])
def test_parse_size(text, expect):
    assert parse_size(text, "--expert-cache") == expect


@pytest.mark.parametrize("text", ["", "2", "2GB", "1.5G", "-1G", "0M", "1025G", "512K", "G"])
def test_parse_size_rejects(text):
    from goosedump.budget import expert_cache_budget
    # --expert-cache takes auto too, and says so; a size flag that does not, does not
    with pytest.raises(SizeError, match=r"--expert-cache=.*expected auto, or an integer followed by M or G, "
                                        r"between 1M and 1024G"):
        expert_cache_budget(text)
    with pytest.raises(SizeError, match=r"--prompt-cache-size=.*expected an integer followed by M or G, "
                                        r"between 1M and 1024G") as e:
        parse_size(text, "--prompt-cache-size")
    assert "auto" not in str(e.value)


def test_budget_from_env_names_the_variable(monkeypatch):
    monkeypatch.setenv("GOOSEDUMP_EXPERT_CACHE_SIZE", "3X")
    with pytest.raises(SizeError, match="GOOSEDUMP_EXPERT_CACHE_SIZE='3X'"):
        expert_cache_budget()
    monkeypatch.setenv("GOOSEDUMP_EXPERT_CACHE_SIZE", "3G")
    assert expert_cache_budget() == 3 << 30
    assert expert_cache_budget("1G") == 1 << 30  # the flag wins
    monkeypatch.delenv("GOOSEDUMP_EXPERT_CACHE_SIZE")
    assert expert_cache_budget() == "auto"


def test_cli_rejects_bad_budget(tiny_path, capsys):
    from goosedump.cli import main
    assert main(["inspect", tiny_path, "--expert-cache", "2000G"]) == 2
    assert "--expert-cache='2000G' is out of range" in capsys.readouterr().err


def test_public_api(tiny_path):
    model = goosedump.load(tiny_path)
    assert model.config.n_vocab == 201088 and model.config.n_expert_used == 4
    assert model.config.is_sliding(0) and not model.config.is_sliding(1)
    ids = model.tokenizer.encode("Hello <|start|>", allow_special=True)
    assert ids[-1] == 200006 and model.tokenizer.decode(ids) == "Hello <|start|>"
    assert "<|start|>" in model.chat_template
    with pytest.raises(FileNotFoundError, match="nope.gguf: no such file"):
        goosedump.load("nope.gguf")


@pytest.mark.slow
def test_tiny_120b_shape_loads(tmp_path, small_vocab):
    p = tmp_path / "t120.gguf"
    synth.write_model(p, "tiny-120b", vocab=small_vocab)
    c = goosedump.load(p).config
    assert (c.n_layer, c.n_expert, c.n_expert_used) == (36, 128, 4)
