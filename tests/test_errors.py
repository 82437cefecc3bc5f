"""Bad files get specific errors naming the file, the key or tensor, and the
expected and actual values."""
import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest

import goosedump
from goosedump import synth
from goosedump.gguf import GGMLType, GGUFError, GGUFFile, ValueType, tensor_nbytes


def write(tmp_path, small_vocab, edit=None, name="bad.gguf"):
    path = tmp_path / name
    synth.write_model(path, "tiny", seed=3, vocab=small_vocab, edit=edit)
    return os.fspath(path)


def expect_error(path, *fragments):
    with pytest.raises(GGUFError) as e:
        goosedump.load(path)
    msg = str(e.value)
    assert msg.startswith(path), msg
    for frag in fragments:
        assert re.search(frag, msg), f"{frag!r} not in {msg!r}"
    return msg


def set_kv(kv, key, vtype=None, value=None, remove=False):
    i = [k for k, *_ in kv].index(key)
    if remove:
        del kv[i]
    else:
        kv[i] = (key, vtype, value, None)


def test_valid_file_loads(tmp_path, small_vocab):
    model = goosedump.load(write(tmp_path, small_vocab))
    assert model.config.n_layer == 4 and model.config.n_vocab == len(small_vocab[0])


def test_not_a_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"PK\x03\x04 this is a zip")
    expect_error(os.fspath(p), "not a GGUF file", r"b'PK\\x03\\x04'", "expected b'GGUF'")
    p.write_bytes(b"")
    expect_error(os.fspath(p), "not a GGUF file", "empty")


def test_unsupported_version(tmp_path, small_vocab):
    path = write(tmp_path, small_vocab)
    with open(path, "r+b") as f:
        f.seek(4)
        f.write(struct.pack("<I", 7))
    expect_error(path, "unsupported GGUF version 7", "supported: 2, 3")


@pytest.mark.parametrize("where", ["version", "counts", "key", "vocabulary", "tensor table"])
def test_truncated_header(tmp_path, small_vocab, where):
    path = write(tmp_path, small_vocab)
    f = GGUFFile(path)
    vocab = f.fields["tokenizer.ggml.tokens"].value
    keep = {"version": 6, "counts": 20, "key": 30, "vocabulary": int(vocab.starts[len(vocab) // 2]),
            "tensor table": f.data_offset - 40}[where]
    f.close()
    os.truncate(path, keep)
    expect_error(path, "truncated header|past the end")


def test_tensor_data_past_end(tmp_path, small_vocab):
    path = write(tmp_path, small_vocab)
    os.truncate(path, os.path.getsize(path) - 100)
    # The last tensor in the file loses its tail.
    expect_error(path, "tensor 'blk.3.post_attention_norm.weight'", "past the end of the file",
                 "truncated")


def _tensor_info_offset_pos(path, name):
    """Byte position of a tensor's offset field in the tensor table."""
    with open(path, "rb") as f:
        data = f.read()
    key = struct.pack("<Q", len(name)) + name.encode()
    at = data.index(key) + len(key)
    (n_dims,) = struct.unpack_from("<I", data, at)
    return at + 4 + 8 * n_dims + 4


def test_misaligned_offset(tmp_path, small_vocab):
    path = write(tmp_path, small_vocab)
    pos = _tensor_info_offset_pos(path, "output_norm.weight")
    with open(path, "r+b") as f:
        f.seek(pos)
        (off,) = struct.unpack("<Q", f.read(8))
        f.seek(pos)
        f.write(struct.pack("<Q", off + 4))
    expect_error(path, "tensor 'output_norm.weight'", f"misaligned offset {off + 4}", "multiple of "
                 "the alignment 32")


def test_overlapping_tensors(tmp_path, small_vocab):
    """A tensor whose offset points into another's bytes (aligned, in the
    file) would alias its data: refused, both named."""
    path = write(tmp_path, small_vocab)
    src, dst = _tensor_info_offset_pos(path, "output_norm.weight"), _tensor_info_offset_pos(path, "output.weight")
    with open(path, "r+b") as f:
        f.seek(src)
        off = f.read(8)
        f.seek(dst)
        f.write(off)
    expect_error(path, "tensor 'output.weight'", "overlaps tensor 'output_norm.weight'")


def test_missing_key(tmp_path, small_vocab):
    path = write(tmp_path, small_vocab,
                 lambda kv, t: set_kv(kv, "gpt-oss.expert_feed_forward_length", remove=True))
    expect_error(path, "missing metadata key 'gpt-oss.expert_feed_forward_length'")


def test_key_of_wrong_type(tmp_path, small_vocab):
    path = write(tmp_path, small_vocab,
                 lambda kv, t: set_kv(kv, "gpt-oss.block_count", ValueType.STRING, "four"))
    expect_error(path, "'gpt-oss.block_count' has type STRING, expected int")


def test_wrong_architecture(tmp_path, small_vocab):
    path = write(tmp_path, small_vocab,
                 lambda kv, t: set_kv(kv, "general.architecture", ValueType.STRING, "llama"))
    expect_error(path, "wrong architecture", "'llama'", "expected 'gpt-oss'")


def test_missing_tensor(tmp_path, small_vocab):
    def edit(kv, tensors):
        tensors[:] = [t for t in tensors if t.name != "blk.2.attn_sinks.weight"]
    expect_error(write(tmp_path, small_vocab, edit), "missing tensor 'blk.2.attn_sinks.weight'",
                 r"expected F32/F16/BF16 \[4\]")


def test_unsupported_type(tmp_path, small_vocab):
    """A type the kernels do not take is refused by name, with the list of
    those this tensor may have; so is a type a tensor's role cannot hold."""
    def edit(kv, tensors):
        t = next(t for t in tensors if t.name == "blk.1.attn_q.weight")
        t.type = GGMLType.Q8_1
        t.data = np.zeros(tensor_nbytes(t.type, t.dims), np.uint8)
    expect_error(write(tmp_path, small_vocab, edit), "tensor 'blk.1.attn_q.weight'",
                 "has type Q8_1, which is a type goosedump does not run",
                 "supported for this tensor: F32, F16, BF16, Q4_0, .*Q6_K, IQ4_NL, IQ4_XS, MXFP4")

    def edit_bias(kv, tensors):
        t = next(t for t in tensors if t.name == "blk.0.ffn_up_exps.bias")
        t.type = GGMLType.F16
        t.init = "matrix"
    expect_error(write(tmp_path, small_vocab, edit_bias), "tensor 'blk.0.ffn_up_exps.bias'",
                 "has type F16, which cannot hold this tensor; supported for this tensor: F32$")


def test_wrong_shape(tmp_path, small_vocab):
    def edit(kv, tensors):
        t = next(t for t in tensors if t.name == "blk.0.ffn_up_exps.weight")
        t.dims = (64, 32, 8)
    expect_error(write(tmp_path, small_vocab, edit), "tensor 'blk.0.ffn_up_exps.weight'",
                 r"wrong shape \[64, 32, 8\]", r"expected \[64, 64, 8\]")


def test_unexpected_tensor(tmp_path, small_vocab):
    def edit(kv, tensors):
        tensors.append(synth.TensorSpec("blk.9.attn_q.weight", (64, 64), GGMLType.Q8_0, "matrix"))
    expect_error(write(tmp_path, small_vocab, edit), "unexpected tensor 'blk.9.attn_q.weight'")


def test_fused_gate_up_is_refused_clearly(tmp_path, small_vocab):
    def edit(kv, tensors):
        for t in tensors:
            if t.name.endswith("ffn_gate_exps.weight"):
                t.name = t.name.replace("gate", "gate_up")
    expect_error(write(tmp_path, small_vocab, edit), "ffn_gate_up_exps.weight", "fused gate/up",
                 "not supported")


@pytest.mark.parametrize("key,value,fragment", [
    ("gpt-oss.attention.head_count_kv", 3, r"head_count \(4\) is not a multiple of .*head_count_kv \(3\)"),
    ("gpt-oss.expert_used_count", 9, r"expert_used_count \(9\) exceeds gpt-oss.expert_count \(8\)"),
    ("gpt-oss.embedding_length", 48, r"embedding_length \(48\) must be a multiple of 32"),
    ("gpt-oss.attention.key_length", 15, r"key_length \(15\) must be even"),
    ("gpt-oss.attention.sliding_window", 0, r"sliding_window' must be positive, got 0"),
])
def test_inconsistent_hyperparameters(tmp_path, small_vocab, key, value, fragment):
    path = write(tmp_path, small_vocab, lambda kv, t: set_kv(kv, key, ValueType.UINT32, value))
    expect_error(path, fragment)


def test_vocab_size_must_match_embeddings(tmp_path, small_vocab):
    tokens, types, merges = small_vocab
    def edit(kv, tensors):
        set_kv(kv, "tokenizer.ggml.tokens", remove=True)
        kv.insert(0, ("tokenizer.ggml.tokens", ValueType.ARRAY, tokens[:-1], ValueType.STRING))
    # token_embd still has the full vocabulary: the shape check names it.
    expect_error(write(tmp_path, small_vocab, edit), "tensor 'token_embd.weight'", "wrong shape",
                 rf"expected \[64, {len(tokens) - 1}\]")


def test_bad_token_string(tmp_path, small_vocab):
    tokens, types, merges = small_vocab
    bad = list(tokens)
    bad[300] = "caf\u4e00"  # a normal token must use the GPT-2 byte alphabet
    expect_error(write(tmp_path, (bad, types, merges)), "token 300", "U\\+4E00",
                 "not in the GPT-2 byte-level alphabet")


def test_unknown_tensor_type(tmp_path, small_vocab):
    path = write(tmp_path, small_vocab)
    pos = _tensor_info_offset_pos(path, "output_norm.weight") - 4
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(struct.pack("<I", 77))
    expect_error(path, "tensor 'output_norm.weight' has unknown ggml type 77")


def test_cli_reports_errors_without_traceback(tmp_path, capsys):
    from goosedump.cli import main
    p = tmp_path / "junk.gguf"
    p.write_bytes(b"junkjunkjunk")
    assert main(["inspect", os.fspath(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("goosedump: error: ") and "not a GGUF file" in err
    assert "Traceback" not in err
    assert main(["inspect", os.fspath(tmp_path / "missing.gguf")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_reader_opens_without_model_checks(tmp_path, small_vocab):
    # The file layer alone accepts any architecture.
    path = write(tmp_path, small_vocab,
                 lambda kv, t: set_kv(kv, "general.architecture", ValueType.STRING, "llama"))
    assert GGUFFile(path).get("general.architecture") == "llama"


def test_token_types_out_of_range(tmp_path, small_vocab):
    """A token type outside llama.cpp's 1..6 had dropped the token from the
    vocabulary silently (other texts then tokenized differently)."""
    tokens, types, merges = small_vocab
    bad = np.array(types, dtype=np.int32)
    bad[300] = 99
    bad[301] = -7
    expect_error(write(tmp_path, (tokens, bad, merges)), r"tokenizer.ggml.token_type\[300\] is 99, expected 1..6",
                 "2 entries are out of range")


def test_a_token_that_is_not_utf8_is_named(tmp_path, small_vocab):
    tokens, types, merges = small_vocab
    k = next(i for i, t in enumerate(tokens) if types[i] == 1 and len(t) >= 3 and t.isascii() and t.isalpha())
    path = write(tmp_path, small_vocab)
    raw = bytearray(Path(path).read_bytes())
    # the token's length field then its bytes: overwrite its first two bytes in place
    needle = struct.pack("<Q", len(tokens[k])) + tokens[k].encode()
    at = raw.index(needle) + 8
    raw[at:at + 2] = b"\xff\xfe"
    Path(path).write_bytes(bytes(raw))
    expect_error(path, rf"token {k} \(bytes \\xFF\\xFE{tokens[k][2:]}\)", "not UTF-8")


def _header(kvs: bytes, n_kv: int) -> bytes:
    """A GGUF v3 file's header: no tensors, n_kv keys already serialised."""
    return b"GGUF" + struct.pack("<IQQ", 3, 0, n_kv) + kvs


def _key(name: str) -> bytes:
    return struct.pack("<Q", len(name)) + name.encode()


def test_metadata_arrays_are_bounded(tmp_path):
    """Arrays of arrays nested past 8 levels (had recursed until Python's
    limit: a traceback), 65,536 arrays or more in one (a Python list each:
    8.3M took 42 s and 1.2 GB), and arrays of strings beyond 2^24 or beyond
    the bytes left in the file are refused by key, before anything is held."""
    deep = _key("deep") + struct.pack("<I", ValueType.ARRAY) + struct.pack("<IQ", ValueType.ARRAY, 1) * 9 + \
        struct.pack("<IQ", ValueType.UINT8, 0)
    many = _key("many") + struct.pack("<I", ValueType.ARRAY) + struct.pack("<IQ", ValueType.ARRAY, 70_000) + \
        struct.pack("<IQ", ValueType.UINT8, 0) * 70_000
    strings = _key("words") + struct.pack("<I", ValueType.ARRAY) + struct.pack("<IQ", ValueType.STRING, (1 << 24) + 1)
    short = _key("words") + struct.pack("<I", ValueType.ARRAY) + struct.pack("<IQ", ValueType.STRING, 1000) + \
        struct.pack("<Q", 0) * 990
    cases = [(deep, r"array 'deep(\[0\])+' nests arrays more than 8 levels deep"),
             (many, "array 'many' holds 70000 arrays, more than goosedump reads in one array \\(65536\\)"),
             (strings, "array 'words' holds 16777217 strings, more than goosedump reads in one array"),
             (short, r"array 'words': an array of 1000 strings cannot fit in the 7984 bytes after byte \d+")]
    for k, (kv, message) in enumerate(cases):
        p = tmp_path / f"a{k}.gguf"
        p.write_bytes(_header(kv, 1) + b"\0" * 64)
        with pytest.raises(GGUFError) as e:
            GGUFFile(p)
        assert str(e.value).startswith(os.fspath(p)) and re.search(message, str(e.value)), e.value
    # within the bounds, arrays of arrays still read
    ok = _key("ok") + struct.pack("<I", ValueType.ARRAY) + struct.pack("<IQ", ValueType.ARRAY, 2) + \
        struct.pack("<IQ", ValueType.UINT8, 1) + b"\x07" + struct.pack("<IQ", ValueType.UINT8, 0)
    p = tmp_path / "ok.gguf"
    p.write_bytes(_header(ok, 1))
    assert [list(a) for a in GGUFFile(p).get("ok")] == [[7], []]


def test_a_chat_template_that_is_no_string(tmp_path, small_vocab):
    path = write(tmp_path, small_vocab,
                 lambda kv, t: set_kv(kv, "tokenizer.chat_template", ValueType.UINT32, 7))
    expect_error(path, "tokenizer.chat_template is UINT32, expected a string")


def test_a_context_beyond_memory_is_refused_before_allocating(tmp_path, small_vocab, capsys):
    from goosedump.cli import main
    huge = 1 << 40
    path = write(tmp_path, small_vocab,
                 lambda kv, t: set_kv(kv, "gpt-oss.context_length", ValueType.UINT64, huge))
    assert main(["run", path, "-c", "0", "-p", "hi", "-n", "1", "--no-prompt-cache"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"-c/--ctx 0 (the model's context length): the KV cache of {huge} tokens" in err
    assert "more than this machine's" in err


def test_inspect_takes_a_model_shorter_than_the_default_context(tmp_path, small_vocab, capsys):
    """inspect's -c had defaulted to 4096 whatever the model's context, and
    refused a 2048-token model for a flag never given."""
    from goosedump.cli import main

    def edit(kv, t):
        set_kv(kv, "gpt-oss.context_length", ValueType.UINT32, 2048)
        set_kv(kv, "gpt-oss.rope.scaling.original_context_length", ValueType.UINT32, 2048)
    path = write(tmp_path, small_vocab, edit)
    assert main(["inspect", path]) == 0
    assert "at --ctx 2048:" in capsys.readouterr().out


def test_inspect_escapes_the_files_name(tmp_path, small_vocab, capsys):
    from goosedump.cli import main
    path = write(tmp_path, small_vocab,
                 lambda kv, t: set_kv(kv, "general.name", ValueType.STRING, "evil\x1b[2J\x1b]0;pwned\x07\rname"))
    assert main(["inspect", path]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert "evil\\x1b[2J" in out


@pytest.mark.parametrize("key,vtype,value,etype,fragment", [
    ("tokenizer.ggml.model", ValueType.ARRAY, [1, 2, 3], ValueType.UINT8, "must be a string, got ARRAY of UINT8"),
    ("tokenizer.ggml.model", ValueType.UINT32, 2, None, "must be a string, got UINT32"),
    ("tokenizer.ggml.pre", ValueType.ARRAY, ["gpt-4o"], ValueType.STRING, "must be a string, got ARRAY of STRING"),
])
def test_tokenizer_keys_of_the_wrong_type_are_named(tmp_path, small_vocab, key, vtype, value, etype, fragment):
    """(numpy's "truth value of an array is ambiguous" had been the error)"""
    def edit(kv, tensors):
        set_kv(kv, key, remove=True)
        kv.append((key, vtype, value, etype))
    expect_error(write(tmp_path, small_vocab, edit), key, fragment)


def test_token_types_of_another_kind_are_named(tmp_path, small_vocab):
    tokens, types, merges = small_vocab
    def edit(kv, tensors):
        set_kv(kv, "tokenizer.ggml.token_type", remove=True)
        kv.append(("tokenizer.ggml.token_type", ValueType.ARRAY, [True] * len(tokens), ValueType.BOOL))
    expect_error(write(tmp_path, small_vocab, edit), "token_type must be an integer array, got ARRAY of BOOL")


def test_a_pipe_is_refused_not_waited_on(tmp_path):
    """open() of a FIFO waits for a writer: load() had hung."""
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    expect_error(os.fspath(fifo), "not a regular file")
