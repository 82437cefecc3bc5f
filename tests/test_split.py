"""Split GGUF sets as llama-gguf-split writes them (and gguf-py's writer,
the independent one, of the same file; gguf-py's reader reads ours): any part opens the set,
the tensors are the unsplit file's, generation equals it token for token
(experts in place and streamed from their parts), and a set that does not fit
together is a clear error naming the part."""
import json
import os
import shutil
import subprocess
import sys

import gguf
import numpy as np
import pytest

import goosedump
from goosedump import synth
from goosedump.gguf import GGUFError, GGUFFile, ValueType

PROMPT = [5, 17, 300, 2, 99, 4]


@pytest.fixture(scope="module")
def sets(tmp_path_factory, small_vocab):
    d = tmp_path_factory.mktemp("split")
    whole = d / "whole.gguf"
    synth.write_model(whole, "tiny", seed=9, vocab=small_vocab)
    synth.write_model(d / "m.gguf", "tiny", seed=9, vocab=small_vocab, split_max_size=60_000)
    parts = sorted(d.glob("m-*-of-*.gguf"))
    return whole, parts


def gguf_py_split(whole, out, max_size: int) -> None:
    """The split set gguf-py's own writer makes of a file (as
    gguf_new_metadata.py copies one): the independent writer."""
    r = gguf.GGUFReader(whole)
    w = gguf.GGUFWriter(out, r.fields["general.architecture"].contents(), split_max_size=max_size)
    for field in r.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        w.add_key_value(field.name, field.contents(), kind,
                        sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def gguf_py_parts(sets, tmp_path_factory):
    whole, _ = sets
    d = tmp_path_factory.mktemp("gguf_py_split")
    gguf_py_split(whole, d / "g.gguf", 60_000)
    return sorted(d.glob("g-*-of-*.gguf"))


def test_the_parts_and_their_keys(sets):
    whole, parts = sets
    n = len(parts)
    assert n >= 3 and [p.name for p in parts] == [f"m-{k:05d}-of-{n:05d}.gguf" for k in range(1, n + 1)]
    whole_set, whole_file = GGUFFile(parts[0]), GGUFFile(whole)
    seen = []
    for k, p in enumerate(parts):
        f = GGUFFile(p, whole_set=False)
        assert (f.get("split.no"), f.get("split.count")) == (k, n)
        assert f.fields["split.no"].type == ValueType.UINT16 and f.fields["split.tensors.count"].type == ValueType.INT32
        # only the first part carries the model's metadata
        assert ("general.architecture" in f) == (k == 0)
        # gguf-py reads each part so too, its split keys in their types and its tensors' bytes
        r = gguf.GGUFReader(p)
        keys = gguf.Keys.Split
        assert [(r.fields[key].contents(), r.fields[key].types) for key in
                (keys.LLM_KV_SPLIT_NO, keys.LLM_KV_SPLIT_COUNT, keys.LLM_KV_SPLIT_TENSORS_COUNT)] == [
            (k, [gguf.GGUFValueType.UINT16]), (n, [gguf.GGUFValueType.UINT16]),
            (len(whole_file.tensors), [gguf.GGUFValueType.INT32])]
        for t in r.tensors:
            seen.append(t.name)
            assert whole_set.tensors[t.name].part == k
            np.testing.assert_array_equal(np.asarray(t.data).view(np.uint8).reshape(-1),
                                          whole_file.tensor_bytes(t.name).reshape(-1))
    assert seen == list(whole_file.tensors)


@pytest.mark.parametrize("which", [0, 1, -1])
def test_a_set_split_by_gguf_py_opens_and_runs(sets, gguf_py_parts, which):
    whole, _ = sets
    parts = gguf_py_parts
    assert len(parts) >= 3
    a, b = GGUFFile(whole), GGUFFile(parts[which])
    assert b.path == os.fspath(parts[0]) and len(b.parts) == len(parts) and list(b.tensors) == list(a.tensors)
    for name in a.tensors:
        np.testing.assert_array_equal(b.tensor_bytes(name), a.tensor_bytes(name))
    want = goosedump.load(whole).generate(PROMPT, max_tokens=8).token_ids
    assert goosedump.load(parts[which], expert_cache=1 << 20).generate(PROMPT, max_tokens=8).token_ids == want


@pytest.mark.parametrize("which", [0, 1, -1])
def test_any_part_opens_the_whole_set(sets, which):
    whole, parts = sets
    a, b = GGUFFile(whole), GGUFFile(parts[which])
    assert b.path == os.fspath(parts[0]) and len(b.parts) == len(parts)
    assert list(b.tensors) == list(a.tensors)
    assert sorted({t.part for t in b.tensors.values()}) == list(range(len(parts)))
    for name in a.tensors:
        np.testing.assert_array_equal(b.tensor_bytes(name), a.tensor_bytes(name))


@pytest.mark.parametrize("budget", [None, 1 << 20])
def test_generation_equals_the_unsplit_file(sets, budget):
    whole, parts = sets
    want = goosedump.load(whole, expert_cache=budget).generate(PROMPT, max_tokens=12).token_ids
    m = goosedump.load(parts[1], expert_cache=budget)
    assert m.store.in_place == (budget is None)
    assert m.generate(PROMPT, max_tokens=12).token_ids == want
    if budget:   # the experts came from the parts' files
        assert m.store.snapshot()["misses"] > 0


def copy_set(parts, folder):
    os.makedirs(folder, exist_ok=True)
    return [shutil.copy(p, folder) for p in parts]


def test_a_missing_part(sets, tmp_path):
    _, parts = sets
    copies = copy_set(parts, tmp_path)
    os.unlink(copies[2])
    with pytest.raises(GGUFError, match=f"part 3 of the split set of {len(parts)} is missing: expected "
                                         f"{copies[2]}"):
        GGUFFile(copies[0])
    os.unlink(copies[0])
    with pytest.raises(GGUFError, match=r"part 1 of the split set .*\(the one with the model's metadata\) is "
                                        f"missing: expected {copies[0]}"):
        GGUFFile(copies[1])


def test_a_part_of_another_set(sets, tmp_path, small_vocab):
    _, parts = sets
    copies = copy_set(parts, tmp_path / "a")
    synth.write_model(tmp_path / "b.gguf", "tiny", seed=9, vocab=small_vocab, split_max_size=20_000)
    other = sorted(tmp_path.glob("b-*-of-*.gguf"))
    shutil.copy(other[1], copies[1])          # a part 2 that thinks it belongs to a longer set
    with pytest.raises(GGUFError, match=rf"{copies[1]}: expected part 2 of {len(parts)} \(split.no 1, split.count "
                                        rf"{len(parts)}\), found split.no 1, split.count {len(other)}"):
        GGUFFile(copies[0])


def test_a_renamed_part(sets, tmp_path):
    _, parts = sets
    p = shutil.copy(parts[0], tmp_path / "renamed.gguf")
    with pytest.raises(GGUFError, match=r"part 1 of a split set of \d+ \(split.count\), but the file's name does not "
                                        r"end in -00001-of-000\d\d.gguf"):
        GGUFFile(p)


def test_a_wrong_tensor_count(tmp_path, small_vocab):
    synth.write_model(tmp_path / "c.gguf", "tiny", seed=9, vocab=small_vocab, split_max_size=60_000)
    first = sorted(tmp_path.glob("c-*-of-*.gguf"))[0]
    f = GGUFFile(first, whole_set=False)
    total = f.get("split.tensors.count")
    # rewrite part 1 with a tensor count one too high (the key's value is an int32 at a known place)
    raw = bytearray(first.read_bytes())
    key = b"split.tensors.count"
    at = raw.index(key) + len(key) + 4
    raw[at:at + 4] = (total + 1).to_bytes(4, "little")
    first.write_bytes(bytes(raw))
    with pytest.raises(GGUFError, match=f"split.tensors.count says {total + 1} tensors, the .* parts hold {total}"):
        GGUFFile(first)


def test_inspect_shows_the_parts_and_synth_writes_sets(sets, tmp_path):
    _, parts = sets
    out = subprocess.run([sys.executable, "-m", "goosedump", "inspect", str(parts[1]), "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert [f["path"] for f in r["files"]] == [os.fspath(p) for p in parts]
    assert sum(f["tensors"] for f in r["files"]) == r["tensors"] and r["recipe"] == "mxfp4"
    text = subprocess.run([sys.executable, "-m", "goosedump", "inspect", str(parts[0])], capture_output=True, text=True)
    assert f"a split set of {len(parts)} parts:" in text.stdout
    made = subprocess.run([sys.executable, "-m", "goosedump", "synth", "--preset", "tiny", "--recipe", "q4_0",
                           "--split-max-size", "10M", "--out", str(tmp_path / "t.gguf"), "--quiet"],
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    written = sorted(tmp_path.glob("t-*-of-*.gguf"))
    assert len(written) >= 2 and goosedump.load(written[0]).generate(PROMPT, max_tokens=2).generated_tokens == 2
    # it names what it wrote: the parts (not a --out never written, nor a stale part of another run), or the
    # one file where the model fits the limit
    again = subprocess.run([sys.executable, "-m", "goosedump", "synth", "--preset", "tiny", "--recipe", "q4_0",
                            "--split-max-size", "20M", "--out", str(tmp_path / "t.gguf")], capture_output=True,
                           text=True)
    count = len(list(tmp_path.glob("t-*-of-00002.gguf")))
    assert again.returncode == 0 and count == 2 and \
        f"wrote {tmp_path}/t-00001-of-00002.gguf .. t-00002-of-00002.gguf (" in again.stderr, again.stderr
    whole = subprocess.run([sys.executable, "-m", "goosedump", "synth", "--preset", "tiny", "--split-max-size", "1G",
                            "--out", str(tmp_path / "w.gguf")], capture_output=True, text=True)
    assert f"wrote {tmp_path}/w.gguf (" in whole.stderr and (tmp_path / "w.gguf").exists(), whole.stderr
    bad = subprocess.run([sys.executable, "-m", "goosedump", "synth", "--preset", "tiny", "--split-max-size", "10X",
                          "--out", str(tmp_path / "u.gguf")], capture_output=True, text=True)
    assert bad.returncode == 2 and "--split-max-size='10X' is not a size" in bad.stderr


def test_split_keys_of_the_wrong_type_or_range(tmp_path, small_vocab):
    """split.count and split.no are integers in range, or the file is refused
    by key (a STRING split.count had failed in int() naming nothing, an
    array in a traceback, a FLOAT 2.7 read as 2)."""
    synth.write_model(tmp_path / "d.gguf", "tiny", seed=9, vocab=small_vocab, split_max_size=60_000)
    first = sorted(tmp_path.glob("d-*-of-*.gguf"))[0]
    raw = first.read_bytes()
    key = b"split.count"
    at = raw.index(key) + len(key)
    vtype = int.from_bytes(raw[at:at + 4], "little")
    assert vtype == gguf.GGUFValueType.UINT16
    for new_type, value, message in ((gguf.GGUFValueType.INT16, (-2).to_bytes(2, "little", signed=True),
                                      "split.count must be an integer >= 1, found INT16 -2"),
                                     (gguf.GGUFValueType.BOOL, b"\x01\x00",    # (BOOL is 1 byte: the next key breaks)
                                      None)):
        bad = bytearray(raw)
        bad[at:at + 4] = int(new_type).to_bytes(4, "little")
        bad[at + 4:at + 6] = value
        p = tmp_path / first.name
        p.write_bytes(bytes(bad))
        with pytest.raises(GGUFError) as e:
            GGUFFile(p)
        assert str(e.value).startswith(os.fspath(p)), e.value
        if message:
            assert message in str(e.value)
    # split.no past split.count
    bad = bytearray(raw)
    no = bad.index(b"split.no") + len(b"split.no") + 4
    bad[no:no + 2] = (7).to_bytes(2, "little")
    p = tmp_path / first.name
    p.write_bytes(bytes(bad))
    with pytest.raises(GGUFError, match=r"split.no 7 is not below split.count \d+"):
        GGUFFile(p)


def test_a_part_whose_first_part_is_no_set(sets, tmp_path, small_vocab):
    """Part 2 named, part 1 a plain file: said so, not read as a model that
    lacks half its tensors."""
    whole, parts = sets
    copies = copy_set(parts, tmp_path)
    shutil.copy(whole, copies[0])
    with pytest.raises(GGUFError, match=rf"{copies[1]}: part of a split set of {len(parts)} \(split.count\), but "
                                        rf"its first part {copies[0]} says split.count 1 \(it has no split keys"):
        GGUFFile(copies[1])
