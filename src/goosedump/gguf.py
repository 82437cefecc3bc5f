"""GGUF v3 files: metadata, tensor table and zero-copy tensor views.

The file is memory-mapped once. Scalars become Python values, numeric arrays
become numpy views into the map, and string arrays (the 201,088-token
vocabulary, the 446,189 merges) are indexed by a native scan and decoded only
when asked for, which is what keeps opening a 12 GB file well under a second.
"""
from __future__ import annotations

import enum
import mmap
import os
import stat
import struct
from dataclasses import dataclass, replace
from typing import Any, Iterator

import numpy as np

from . import _kernels
from .ggml import _ELEMENT_DTYPES, BLOCK_SIZES, GGMLType, tensor_nbytes, type_name  # noqa: F401
from .gguf_split import SplitError, first_part, part_path, set_prefix
from .residency import populate, reread_in_huge_pages

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
# Bounds on what one metadata array may make goosedump hold, far above any
# real file's (a vocabulary: ~200k strings, its merges ~450k): an array of
# strings costs 16 bytes of index a string, even an empty one (8 bytes of
# file); an array of arrays a Python list each.
MAX_STRINGS = 1 << 24
MAX_NESTED_ARRAYS = 1 << 16
MAX_ARRAY_DEPTH = 8


def printable(text: str, limit: int = 2000) -> str:
    """text with control characters escaped (\\n, \\x00, ...) and cut at limit."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return out if len(out) <= limit else out[:limit] + "..."


class GGUFError(ValueError):
    """A file that is not a well-formed GGUF file; the message names the file,
    as one printable line whatever names the file holds."""

    def __init__(self, message: str):
        super().__init__(printable(message))


class ValueType(enum.IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


_SCALAR_DTYPES = {
    ValueType.UINT8: np.dtype("<u1"),
    ValueType.INT8: np.dtype("<i1"),
    ValueType.UINT16: np.dtype("<u2"),
    ValueType.INT16: np.dtype("<i2"),
    ValueType.UINT32: np.dtype("<u4"),
    ValueType.INT32: np.dtype("<i4"),
    ValueType.FLOAT32: np.dtype("<f4"),
    ValueType.BOOL: np.dtype("?"),
    ValueType.UINT64: np.dtype("<u8"),
    ValueType.INT64: np.dtype("<i8"),
    ValueType.FLOAT64: np.dtype("<f8"),
}


_STRUCT_FORMATS = {
    ValueType.UINT8: "<B", ValueType.INT8: "<b", ValueType.UINT16: "<H", ValueType.INT16: "<h",
    ValueType.UINT32: "<I", ValueType.INT32: "<i", ValueType.FLOAT32: "<f", ValueType.BOOL: "<?",
    ValueType.UINT64: "<Q", ValueType.INT64: "<q", ValueType.FLOAT64: "<d",
}


class StringArray:
    """A GGUF array of strings, decoded lazily from the memory map."""

    def __init__(self, buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray):
        self._buf, self.starts, self.lengths = buf, starts, lengths

    def __len__(self) -> int:
        return len(self.starts)

    def raw(self, i: int) -> bytes:
        start = int(self.starts[i])
        return self._buf[start:start + int(self.lengths[i])].tobytes()

    def __getitem__(self, i: int) -> str:
        return self.raw(i).decode("utf-8", errors="replace")

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        return f"StringArray(len={len(self)})"


@dataclass(frozen=True)
class Field:
    """One metadata key: its GGUF type (element type for arrays) and value."""
    key: str
    type: ValueType
    value: Any
    element_type: ValueType | None = None  # for arrays


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]       # ggml order: innermost (contiguous) first
    type: int                   # ggml type id
    offset: int                 # absolute byte offset in its part's file
    nbytes: int
    part: int = 0               # which file of a split set holds it (0: the first, or the only one)

    @property
    def type_name(self) -> str:
        return type_name(self.type)

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy order: outermost first."""
        return tuple(reversed(self.dims))


def _ask_for_huge_pages(m: mmap.mmap) -> None:
    """Ask Linux to read the file into 2 MiB folios and map them whole
    (file-backed transparent huge pages, where the kernel and the file system
    have them): the weights then stream through a TLB entry per 2 MiB
    instead of one per 4 KiB page. Measured: the output head (Q8_0, 615 MB)
    read at 25.5 GB/s from a mapping of 4 KiB pages, 29.5 from 2 MiB ones
    (AMD EPYC, 2 threads). Linux 6.18 on ext4 reads cold files into 2 MiB
    folios even without the hint (the 20b then decodes the same with it and
    without); it matters where only VM_HUGEPAGE turns huge readahead on.
    Pages already cached keep their size. A no-op where unsupported."""
    try:
        m.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError, ValueError):
        pass


class GGUFFile:
    """A memory-mapped GGUF file, or the first part of a split set, which then
    holds the tensors of every part (`parts`; each tensor's `part` says
    where its bytes are). Use as a context manager or call close()."""

    def __init__(self, path: str | os.PathLike, whole_set: bool = True):
        self.path = os.fspath(path)
        try:
            mode = os.stat(self.path).st_mode
        except FileNotFoundError:
            mode = None                 # (open's own error below)
        if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISBLK(mode)):
            # (a FIFO's open waits for a writer: load() had hung)
            raise GGUFError(f"{self.path}: not a GGUF file: not a regular file (a pipe, device or socket)")
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                size = st.st_size
                if size == 0:
                    raise GGUFError(f"{self.path}: not a GGUF file: the file is empty")
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except IsADirectoryError:
            raise GGUFError(f"{self.path}: not a GGUF file: it is a directory") from None
        self.size, self.mtime_ns = size, st.st_mtime_ns   # (of the file mapped, should its path change later)
        _ask_for_huge_pages(self._mmap)
        self.buf = np.frombuffer(self._mmap, dtype=np.uint8)
        self.fields: dict[str, Field] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self.parts: list[GGUFFile] = [self]
        self._parse()
        if whole_set and self.split_count > 1:
            try:
                first = first_part(self)
            except SplitError as e:
                raise GGUFError(str(e)) from None
            if os.path.abspath(first) != os.path.abspath(self.path):
                if not os.path.exists(first):
                    raise GGUFError(f"{self.path}: part 1 of the split set of {self.split_count} (the one "
                                    f"with the model's metadata) is missing: expected {first}")
                named, count = self.path, self.split_count
                self.__init__(first)        # a set opens from its first part, whichever part was named
                if self.split_count != count:
                    raise GGUFError(f"{named}: part of a split set of {count} (split.count), but its first part "
                                    f"{first} says split.count {self.split_count}"
                                    + (" (it has no split keys: not a part of a set)"
                                       if "split.count" not in self.fields else ""))
                return
            self._join_parts()

    def _join_parts(self) -> None:
        """Open the other parts of this (first) part's set and add their
        tensors, each marked with its part."""
        prefix, no = set_prefix(self)
        if no != 0:
            raise self._fail(f"expected the first part of the set (split.no 0), found split.no {no}")
        count = self.split_count
        for k in range(1, count):
            path = part_path(prefix, k + 1, count)
            if not os.path.exists(path):
                raise self._fail(f"part {k + 1} of the split set of {count} is missing: expected {path}")
            part = GGUFFile(path, whole_set=False)
            if part.split_count != count or int(part.get("split.no", -1)) != k:
                raise GGUFError(f"{path}: expected part {k + 1} of {count} (split.no {k}, split.count {count}), "
                                f"found split.no {part.get('split.no')}, split.count {part.get('split.count')}")
            for name, t in part.tensors.items():
                if name in self.tensors:
                    raise GGUFError(f"{path}: tensor '{name}' is also in part {self.tensors[name].part + 1}")
                self.tensors[name] = replace(t, part=k)
            self.parts.append(part)
        total = self.get("split.tensors.count")
        if total is not None and int(total) != len(self.tensors):
            raise self._fail(f"split.tensors.count says {int(total)} tensors, the {count} parts hold "
                             f"{len(self.tensors)}")

    @property
    def split_count(self) -> int:
        """Parts in this file's split set (1: not split)."""
        return int(self.get("split.count", 1))

    # -- context manager ----------------------------------------------------
    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        # Views handed out keep the map alive; drop ours and let GC unmap.
        for part in self.parts:
            part.buf = None  # type: ignore[assignment]
            part._mmap = None  # type: ignore[assignment]

    # -- metadata ------------------------------------------------------------
    def __contains__(self, key: str) -> bool:
        return key in self.fields

    def get(self, key: str, default: Any = None) -> Any:
        field = self.fields.get(key)
        return default if field is None else field.value

    # -- residency -----------------------------------------------------------
    def reread_in_huge_pages(self, ranges: list[tuple[int, int]], say=None):
        """goosedump.residency.reread_in_huge_pages on this part's mapping."""
        return reread_in_huge_pages(self.path, self._mmap, self.buf, ranges, say)

    def populate_tensor(self, t: TensorInfo) -> None:
        self.parts[t.part].populate(t.offset, t.offset + t.nbytes)

    def populate(self, start: int = 0, end: int | None = None) -> None:
        """Map the pages of [start, end) into this process now (reading them if
        they are not in the page cache), so compute never stalls on page
        faults: 4 KiB faults cost ~1 us each, a few ms per 13 MB expert."""
        end = self.size if end is None else min(end, self.size)
        page = mmap.PAGESIZE
        start -= start % page
        if end <= start:
            return
        populate(self._mmap, start, end)

    # -- tensors -------------------------------------------------------------
    def tensor_bytes(self, name: str) -> np.ndarray:
        """The tensor's raw bytes, a zero-copy uint8 view."""
        t = self.tensors[name]
        return self.parts[t.part].buf[t.offset:t.offset + t.nbytes]

    def rows(self, name: str) -> np.ndarray:
        """The tensor's bytes as rows, a zero-copy uint8 view of shape
        (*outer dims, bytes per row), whatever its type (the form the
        kernels take)."""
        t = self.tensors[name]
        block, size = BLOCK_SIZES[GGMLType(t.type)]
        return self.tensor_bytes(name).reshape(*t.shape[:-1], t.dims[0] // block * size)

    def floats(self, name: str) -> np.ndarray:
        """A float tensor (F32, F16 or BF16) as float32, in numpy order: the
        map's own view for F32, a converted copy otherwise."""
        t = self.tensors[name]
        x = self.tensor(name)
        if t.type == GGMLType.F32:
            return np.require(x, np.float32, ["C", "A"])     # (a copy where the map is not aligned)
        if t.type == GGMLType.F16:
            return x.astype(np.float32)
        if t.type == GGMLType.BF16:
            return (x.astype(np.uint32) << 16).view(np.float32)
        raise GGUFError(f"{self.path}: tensor '{name}' is {t.type_name}, expected a float type (F32, F16, BF16)")

    def tensor(self, name: str) -> np.ndarray:
        """Zero-copy numpy view: element types in numpy order (outermost first);
        block types as uint8 of shape (*outer dims, bytes per row)."""
        t = self.tensors[name]
        raw = self.tensor_bytes(name)
        dtype = _ELEMENT_DTYPES.get(GGMLType(t.type))
        if dtype is not None:
            return raw.view(dtype).reshape(t.shape)
        block, size = BLOCK_SIZES[GGMLType(t.type)]
        return raw.reshape(*t.shape[:-1], t.dims[0] // block * size)

    # -- parsing -------------------------------------------------------------
    def _fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.path}: {what}")

    def _read(self, fmt: str, what: str) -> tuple:
        n = struct.calcsize(fmt)
        if self._pos + n > self.size:
            raise self._fail(f"truncated header: {what} at byte {self._pos} needs {n} bytes, "
                             f"the file has {self.size}")
        out = struct.unpack_from(fmt, self._mmap, self._pos)
        self._pos += n
        return out

    def _read_string(self, what: str) -> str:
        (n,) = self._read("<Q", f"length of {what}")
        if n > self.size - self._pos:
            raise self._fail(f"truncated header: {what} of {n} bytes at byte {self._pos} runs past "
                             f"the end of the file ({self.size} bytes)")
        raw = self._mmap[self._pos:self._pos + n]
        self._pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self._fail(f"{what} is not valid UTF-8: {e}") from None

    def _value_type(self, raw: int, key: str) -> ValueType:
        try:
            return ValueType(raw)
        except ValueError:
            raise self._fail(f"metadata key '{key}' has unknown value type {raw} "
                             f"(expected 0..12)") from None

    def _read_value(self, vtype: ValueType, key: str, depth: int = 0) -> tuple[Any, ValueType | None]:
        if vtype == ValueType.STRING:
            return self._read_string(f"value of '{key}'"), None
        if vtype != ValueType.ARRAY:
            (v,) = self._read(_STRUCT_FORMATS[vtype], f"value of '{key}'")
            return (bool(v) if vtype == ValueType.BOOL else v), None
        (etype_raw, count) = self._read("<IQ", f"array header of '{key}'")
        etype = self._value_type(etype_raw, key)
        if etype == ValueType.STRING:
            if count > MAX_STRINGS:
                raise self._fail(f"array '{key}' holds {count} strings, more than goosedump reads in one array "
                                 f"({MAX_STRINGS})")
            try:
                starts, lengths, end = _kernels.scan_string_array(self.buf, self._pos, count)
            except IndexError as e:  # std::out_of_range
                raise self._fail(f"truncated header: array '{key}': {e}") from None
            self._pos = end
            return StringArray(self.buf, starts, lengths), etype
        if etype == ValueType.ARRAY:  # arrays of arrays are legal GGUF, if rare
            if depth + 2 > MAX_ARRAY_DEPTH:
                raise self._fail(f"array '{key}' nests arrays more than {MAX_ARRAY_DEPTH} levels deep, more than "
                                 "goosedump reads")
            if count > MAX_NESTED_ARRAYS:
                raise self._fail(f"array '{key}' holds {count} arrays, more than goosedump reads in one array "
                                 f"({MAX_NESTED_ARRAYS})")
            return [self._read_value(ValueType.ARRAY, f"{key}[{i}]", depth + 1)[0] for i in range(count)], etype
        dtype = _SCALAR_DTYPES[etype]
        nbytes = count * dtype.itemsize
        if nbytes > self.size - self._pos:
            raise self._fail(f"truncated header: array '{key}' of {count} x {etype.name} at byte "
                             f"{self._pos} runs past the end of the file ({self.size} bytes)")
        arr = self.buf[self._pos:self._pos + nbytes].view(dtype)
        self._pos += nbytes
        return arr, etype

    def _check_split_keys(self) -> None:
        """gguf-split's keys, if present, are integers in range (split.no
        below split.count): the set is read by them."""
        ints = (ValueType.UINT8, ValueType.INT8, ValueType.UINT16, ValueType.INT16, ValueType.UINT32,
                ValueType.INT32, ValueType.UINT64, ValueType.INT64)
        for key, low in (("split.count", 1), ("split.no", 0), ("split.tensors.count", 0)):
            f = self.fields.get(key)
            if f is not None and (f.type not in ints or f.value < low):
                raise self._fail(f"{key} must be an integer >= {low}, found {f.type.name} {f.value!r}")
        if "split.no" in self.fields and self.get("split.no") >= self.split_count:
            raise self._fail(f"split.no {self.get('split.no')} is not below split.count {self.split_count}")

    def _parse(self) -> None:
        self._pos = 0
        if self.size < 4 or self._mmap[:4] != MAGIC:
            head = bytes(self._mmap[:4])
            raise self._fail(f"not a GGUF file: the first 4 bytes are {head!r}, expected {MAGIC!r}")
        self._pos = 4
        (self.version,) = self._read("<I", "version")
        if self.version not in SUPPORTED_VERSIONS:
            raise self._fail(f"unsupported GGUF version {self.version} (supported: "
                             f"{', '.join(map(str, SUPPORTED_VERSIONS))})")
        n_tensors, n_kv = self._read("<QQ", "tensor and metadata counts")
        # Each key takes at least 12 bytes and each tensor info 24: reject
        # absurd counts before looping over them.
        if n_kv * 12 + n_tensors * 24 > self.size:
            raise self._fail(f"truncated header: {n_kv} metadata keys and {n_tensors} tensors "
                             f"cannot fit in {self.size} bytes")
        for _ in range(n_kv):
            key = self._read_string("metadata key")
            (vtype_raw,) = self._read("<I", f"value type of '{key}'")
            vtype = self._value_type(vtype_raw, key)
            value, etype = self._read_value(vtype, key)
            if key in self.fields:
                raise self._fail(f"metadata key '{key}' appears twice")
            self.fields[key] = Field(key, vtype, value, etype)

        self.alignment = DEFAULT_ALIGNMENT
        if "general.alignment" in self.fields:
            a = self.fields["general.alignment"]
            if a.type != ValueType.UINT32 or a.value == 0 or a.value & (a.value - 1):
                raise self._fail(f"general.alignment must be a UINT32 power of two, got "
                                 f"{a.value!r} ({a.type.name})")
            self.alignment = int(a.value)

        self._check_split_keys()

        infos = []
        for _ in range(n_tensors):
            name = self._read_string("tensor name")
            (n_dims,) = self._read("<I", f"dimension count of tensor '{name}'")
            if not 1 <= n_dims <= 4:
                raise self._fail(f"tensor '{name}' has {n_dims} dimensions, expected 1 to 4")
            dims = self._read("<" + "Q" * n_dims, f"dimensions of tensor '{name}'")
            type_raw, offset = self._read("<IQ", f"type and offset of tensor '{name}'")
            infos.append((name, tuple(int(d) for d in dims), type_raw, offset))

        self.data_offset = -(-self._pos // self.alignment) * self.alignment
        for name, dims, type_raw, offset in infos:
            if name in self.tensors:
                raise self._fail(f"tensor '{name}' appears twice in the tensor table")
            try:
                gtype = GGMLType(type_raw)
            except ValueError:
                raise self._fail(f"tensor '{name}' has unknown ggml type {type_raw}") from None
            block, _ = BLOCK_SIZES[gtype]
            if dims[0] % block:
                raise self._fail(f"tensor '{name}': its first dimension {dims[0]} is not a multiple "
                                 f"of the {gtype.name} block size {block}")
            if offset % self.alignment:
                raise self._fail(f"tensor '{name}' has misaligned offset {offset} (must be a "
                                 f"multiple of the alignment {self.alignment})")
            nbytes = tensor_nbytes(gtype, dims)
            start = self.data_offset + offset
            if start + nbytes > self.size:
                raise self._fail(f"tensor '{name}' ({gtype.name} {list(dims)}, {nbytes} bytes at "
                                 f"byte {start}) has data past the end of the file "
                                 f"({self.size} bytes): the file is truncated")
            self.tensors[name] = TensorInfo(name, dims, int(gtype), start, nbytes)
        # no two tensors' bytes overlap (a corrupt offset would alias another's data)
        spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in self.tensors.values() if t.nbytes)
        for (a0, a1, a), (b0, _, b) in zip(spans, spans[1:]):
            if b0 < a1:
                raise self._fail(f"tensor '{b}' (from byte {b0}) overlaps tensor '{a}' (bytes {a0}..{a1 - 1})")
