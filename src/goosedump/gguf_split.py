"""Split GGUF sets, as llama.cpp's llama-gguf-split writes them
(NAME-00001-of-00003.gguf ...): every part is a whole GGUF file with its own
header and tensor table for the tensors it holds; the first carries the
model's metadata; each says `split.no` (its index from 0), `split.count` and
`split.tensors.count` (the tensors of all parts). Opening any part opens the
set from its first part; the first part's GGUFFile then lists every tensor,
each with the part that holds it (offsets are within that part's file)."""
from __future__ import annotations

import re

SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def part_path(prefix: str, no: int, count: int) -> str:
    """The file of part `no` (from 1, as in the names) of `count`."""
    return f"{prefix}-{no:05d}-of-{count:05d}.gguf"


class SplitError(ValueError):
    """A split set whose parts do not fit together (goosedump.gguf raises
    these as GGUFError)."""


def _error(msg: str) -> SplitError:
    return SplitError(msg)


def set_prefix(f) -> tuple[str, int]:
    """(the set's path prefix, this part's index from 0) of a file whose
    metadata says it is a part of a split set."""
    count = f.split_count
    no = int(f.get("split.no", 0))
    m = SPLIT_NAME.match(f.path)
    if m is None:
        raise _error(f"{f.path}: part {no + 1} of a split set of {count} (split.count), but the file's name "
                     f"does not end in -{no + 1:05d}-of-{count:05d}.gguf, so the other parts cannot be found: "
                     f"keep the names llama-gguf-split gave them")
    if int(m["count"]) != count or int(m["no"]) != no + 1:
        raise _error(f"{f.path}: its name says part {int(m['no'])} of {int(m['count'])}, its metadata part "
                     f"{no + 1} of {count} (split.no {no}, split.count {count})")
    return m["prefix"], no


def first_part(f) -> str:
    prefix, _ = set_prefix(f)
    return part_path(prefix, 1, f.split_count)
