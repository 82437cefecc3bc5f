"""A streaming GGUF v3 writer: metadata and the tensor table first, then each
tensor's data in order, so a 60 GB file is written in bounded memory (and may
go to a pipe: the writer never seeks)."""
from __future__ import annotations

import struct
from typing import Any, BinaryIO, Iterable

import numpy as np

from .gguf import _STRUCT_FORMATS as _PACK
from .gguf import DEFAULT_ALIGNMENT, MAGIC, ValueType, tensor_nbytes
_NP = {
    ValueType.UINT8: "<u1", ValueType.INT8: "<i1", ValueType.UINT16: "<u2", ValueType.INT16: "<i2",
    ValueType.UINT32: "<u4", ValueType.INT32: "<i4", ValueType.FLOAT32: "<f4", ValueType.BOOL: "?",
    ValueType.UINT64: "<u8", ValueType.INT64: "<i8", ValueType.FLOAT64: "<f8",
}


def _string(s: str | bytes) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def encode_value(vtype: ValueType, value: Any, element_type: ValueType | None = None) -> bytes:
    """The bytes of one metadata value (without its key and type)."""
    if vtype == ValueType.STRING:
        return _string(value)
    if vtype != ValueType.ARRAY:
        return struct.pack(_PACK[vtype], value)
    assert element_type is not None, "arrays need an element type"
    head = struct.pack("<IQ", element_type, len(value))
    if element_type == ValueType.STRING:
        return head + b"".join(map(_string, value))
    if element_type == ValueType.ARRAY:
        raise NotImplementedError("nested arrays are not written by goosedump")
    return head + np.asarray(value, dtype=_NP[element_type]).tobytes()


class GGUFWriter:
    def __init__(self, out: BinaryIO, alignment: int = DEFAULT_ALIGNMENT, version: int = 3):
        self.out = out
        self.alignment = alignment
        self.version = version
        self.kv: list[tuple[str, bytes]] = []
        self.tensors: list[tuple[str, tuple[int, ...], int, int]] = []  # name, dims, type, nbytes
        self._written = 0
        self._next_tensor = 0

    # -- metadata ------------------------------------------------------------
    def add(self, key: str, vtype: ValueType, value: Any, element_type: ValueType | None = None) -> None:
        self.kv.append((key, struct.pack("<I", vtype) + encode_value(vtype, value, element_type)))

    def add_raw(self, key: str, raw_value: bytes) -> None:
        """A key whose type and value bytes are given as they go on disk."""
        self.kv.append((key, raw_value))

    # -- tensors -------------------------------------------------------------
    def add_tensor(self, name: str, dims: Iterable[int], type_id: int) -> None:
        dims = tuple(int(d) for d in dims)
        self.tensors.append((name, dims, int(type_id), tensor_nbytes(type_id, dims)))

    def _write(self, b: bytes | memoryview) -> None:
        self.out.write(b)
        self._written += len(b)

    def _pad(self) -> None:
        self._write(b"\0" * (-self._written % self.alignment))

    def write_header(self) -> None:
        self._write(MAGIC + struct.pack("<IQQ", self.version, len(self.tensors), len(self.kv)))
        for key, raw in self.kv:
            self._write(_string(key) + raw)
        offset = 0
        for name, dims, type_id, nbytes in self.tensors:
            self._write(_string(name) + struct.pack("<I", len(dims)) +
                        struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", type_id, offset))
            offset += -(-nbytes // self.alignment) * self.alignment
        self._pad()

    def write_tensor(self, name: str, chunks: Iterable[bytes | np.ndarray]) -> None:
        """Write the next tensor's data (tensors go in the order they were added)."""
        expect_name, dims, _, nbytes = self.tensors[self._next_tensor]
        if name != expect_name:
            raise ValueError(f"tensor '{name}' written out of order: expected '{expect_name}'")
        done = 0
        for chunk in chunks:
            b = memoryview(np.ascontiguousarray(chunk)).cast("B") if isinstance(chunk, np.ndarray) else chunk
            done += len(b)
            self._write(b)
        if done != nbytes:
            raise ValueError(f"tensor '{name}' {list(dims)}: wrote {done} bytes, expected {nbytes}")
        self._pad()
        self._next_tensor += 1

    @property
    def bytes_written(self) -> int:
        return self._written

    def finish(self) -> None:
        if self._next_tensor != len(self.tensors):
            missing = self.tensors[self._next_tensor][0]
            raise ValueError(f"tensor '{missing}' and later ones were never written")
        self.out.flush()
