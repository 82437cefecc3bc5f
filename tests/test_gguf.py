"""The GGUF reader against gguf-py's GGUFReader, and writer round trips."""
import io
import os

import gguf as ggufpy
import numpy as np
import pytest

from goosedump.gguf import BLOCK_SIZES, GGUFFile, StringArray, ValueType
from goosedump.gguf_writer import GGUFWriter


def _values_equal(ours, field_py):
    """Compare our decoded value with gguf-py's field contents."""
    t = field_py.types
    if t[0] == ggufpy.GGUFValueType.ARRAY:
        if t[-1] == ggufpy.GGUFValueType.STRING:
            expect = [bytes(field_py.parts[i]).decode("utf-8") for i in field_py.data]
            assert isinstance(ours, StringArray)
            assert len(ours) == len(expect)
            for i in (0, 1, len(expect) // 2, len(expect) - 1):
                assert ours[i] == expect[i]
            assert list(ours) == expect
        else:
            expect = np.concatenate([field_py.parts[i] for i in field_py.data]) if field_py.data else []
            np.testing.assert_array_equal(np.asarray(ours), expect)
    elif t[0] == ggufpy.GGUFValueType.STRING:
        assert ours == bytes(field_py.parts[-1]).decode("utf-8")
    else:
        assert ours == field_py.parts[-1][0]


def test_matches_gguf_py_on_a_synthetic_model(small_model_path):
    # A cut-down vocabulary: gguf-py needs ~30 s to walk the real one.
    ref = ggufpy.GGUFReader(small_model_path)
    f = GGUFFile(small_model_path)
    assert list(f.fields) == [k for k in ref.fields if not k.startswith("GGUF.")]
    for key, field in f.fields.items():
        _values_equal(field.value, ref.fields[key])
    assert list(f.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        ours = f.tensors[t.name]
        assert ours.dims == tuple(int(d) for d in t.shape)
        assert ours.type == int(t.tensor_type)
        assert ours.offset == t.data_offset
        assert ours.nbytes == t.n_bytes
        view = f.tensor(t.name)
        np.testing.assert_array_equal(view, t.data)
        # zero-copy: the view shares memory with the file's map
        assert np.shares_memory(view, f.buf)


def test_block_sizes_match_gguf_py():
    for t, size in BLOCK_SIZES.items():
        if t.name == "Q8_1":  # gguf-py says 40 bytes; ggml's block_q8_1 is 2 halves + 32 = 36
            continue
        assert ggufpy.GGML_QUANT_SIZES[ggufpy.GGMLQuantizationType(int(t))] == size


def _write_all_types(path):
    with open(path, "wb") as out:
        w = GGUFWriter(out)
        V = ValueType
        w.add("u8", V.UINT8, 200)
        w.add("i8", V.INT8, -100)
        w.add("u16", V.UINT16, 60000)
        w.add("i16", V.INT16, -30000)
        w.add("u32", V.UINT32, 4_000_000_000)
        w.add("i32", V.INT32, -2_000_000_000)
        w.add("f32", V.FLOAT32, 1.5)
        w.add("bool", V.BOOL, True)
        w.add("str", V.STRING, "héllo ✓")
        w.add("u64", V.UINT64, 2**63 + 5)
        w.add("i64", V.INT64, -(2**62))
        w.add("f64", V.FLOAT64, 2.0**-30)
        w.add("arr.f32", V.ARRAY, [1.0, -2.5], V.FLOAT32)
        w.add("arr.i64", V.ARRAY, [1, -2, 3], V.INT64)
        w.add("arr.bool", V.ARRAY, [True, False], V.BOOL)
        w.add("arr.str", V.ARRAY, ["a", "", "ü"], V.STRING)
        w.add("arr.empty", V.ARRAY, [], V.UINT32)
        w.add_tensor("t.f32", (4, 3), 0)
        w.add_tensor("t.q8", (64, 2), 8)
        w.write_header()
        w.write_tensor("t.f32", [np.arange(12, dtype="<f4")])
        w.write_tensor("t.q8", [np.zeros(2 * 2 * 34, np.uint8)])
        w.finish()


def test_every_value_type_round_trips(tmp_path):
    path = tmp_path / "types.gguf"
    _write_all_types(path)
    f = GGUFFile(path)
    v = {k: f.get(k) for k in f.fields}
    assert v["u8"] == 200 and v["i8"] == -100 and v["u16"] == 60000 and v["i16"] == -30000
    assert v["u32"] == 4_000_000_000 and v["i32"] == -2_000_000_000
    assert v["f32"] == 1.5 and v["bool"] is True and v["str"] == "héllo ✓"
    assert v["u64"] == 2**63 + 5 and v["i64"] == -(2**62) and v["f64"] == 2.0**-30
    assert list(v["arr.f32"]) == [1.0, -2.5] and list(v["arr.i64"]) == [1, -2, 3]
    assert list(v["arr.bool"]) == [True, False] and list(v["arr.str"]) == ["a", "", "ü"]
    assert len(v["arr.empty"]) == 0
    assert f.fields["arr.str"].element_type == ValueType.STRING
    np.testing.assert_array_equal(f.tensor("t.f32"), np.arange(12, dtype="<f4").reshape(3, 4))
    assert f.tensor("t.q8").shape == (2, 68)
    # gguf-py reads our file the same way
    ref = ggufpy.GGUFReader(path)
    for key, field in f.fields.items():
        _values_equal(field.value, ref.fields[key])


def test_writer_streams_to_a_pipe_without_seeking():
    class NoSeek(io.BytesIO):
        def seek(self, *a):
            raise AssertionError("the writer must not seek")
    buf = NoSeek()
    w = GGUFWriter(buf)
    w.add("general.architecture", ValueType.STRING, "x")
    w.add_tensor("a", (32,), 0)
    w.write_header()
    w.write_tensor("a", [np.ones(32, "<f4")])
    w.finish()
    assert buf.getvalue().startswith(b"GGUF")


def test_writer_rejects_wrong_sizes_and_order():
    w = GGUFWriter(io.BytesIO())
    w.add_tensor("a", (32,), 0)
    w.add_tensor("b", (32,), 0)
    w.write_header()
    with pytest.raises(ValueError, match="out of order"):
        w.write_tensor("b", [np.ones(32, "<f4")])
    with pytest.raises(ValueError, match="wrote 64 bytes, expected 128"):
        w.write_tensor("a", [np.ones(16, "<f4")])


def _vm_flags(address: int) -> list[str]:
    """The kernel's VmFlags of the mapping that holds `address`."""
    flags, inside = None, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("VmFlags:"):
                flags = line.split()[1:]
    assert flags is not None, "no mapping holds the address"
    return flags


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux only")
def test_the_map_asks_for_huge_pages(tiny_path):
    # VM_HUGEPAGE ("hg"): the kernel reads the file into 2 MiB folios and maps
    # them whole where it can, so the weights stream through fewer TLB entries
    f = GGUFFile(tiny_path)
    assert "hg" in _vm_flags(f.buf.ctypes.data)
