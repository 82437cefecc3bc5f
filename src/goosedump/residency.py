"""The resident weights in 2 MiB pages.

Decode streams every resident weight once per token, so the TLB sees one
miss per page: with 4 KiB pages a miss per 64 cache lines, with 2 MiB pages
(file-backed transparent huge pages) almost none. Linux maps a file's page
cache in 2 MiB pieces where the cache holds it in 2 MiB folios, and it
reads a file that is not cached into such folios (readahead), but a file
written on this machine (a download, a conversion, `goosedump synth`) stays
in the folios its writes made, mostly 4 KiB ones, until the cache drops it.
Measured on the synthetic 20b (AMD EPYC Zen 4, 2 threads,
benchmarks/huge_pages.py): a copy just written, 0% in 2 MiB pages, decoded
1.03-1.20x slower than after its re-read; `goosedump synth` leaves 44% of
its output in 4 KiB pages.

So after the resident weights are mapped, `reread_in_huge_pages` asks the
kernel how much of each file's mapping it holds in 2 MiB pages
(/proc/self/smaps: FilePmdMapped against Rss) and, where much is in 4 KiB
pages, takes the ranges PIECE bytes at a time: a piece with at least
MIN_SMALL_SHARE of it in 4 KiB pages is dropped from this process's
mapping and from the page cache (madvise DONTNEED, posix_fadvise DONTNEED:
pages another process maps stay) and mapped again, read from disk into
2 MiB folios. Once: the next run finds them cached that way. It stops
after a first piece that comes back in 4 KiB pages again (another process maps
them, free memory too fragmented, or a file system without large folios)
and says so.
"""
from __future__ import annotations

import mmap
import os
import re
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

HUGE = 2 << 20
MADV_POPULATE_READ = 22  # Linux 5.14+; Python's mmap module does not name it
# Re-read only where at least this much of a file's resident bytes sits in 4 KiB pages
MIN_SMALL_BYTES = 64 << 20
# ... and at least this share of them (a few odd pieces are not worth a disk read)
MIN_SMALL_SHARE = 0.05
PIECE = 32 << 20   # checked one at a time, and re-read where MIN_SMALL_SHARE of it or more is in 4 KiB pages

_VMA = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) ")


@dataclass
class PageSizes:
    resident: int     # bytes of the mapping in memory (Rss)
    huge: int         # of those, mapped in 2 MiB pages (FilePmdMapped)

    @property
    def small(self) -> int:
        return self.resident - self.huge


def page_sizes(smaps: str, start: int, end: int) -> PageSizes:
    """Rss and FilePmdMapped of the mappings that overlap [start, end) (a
    mapping ends on a page boundary), from the text of /proc/<pid>/smaps."""
    resident = huge = 0
    inside = False
    for line in smaps.splitlines():
        m = _VMA.match(line)
        if m:
            lo, hi = int(m.group(1), 16), int(m.group(2), 16)
            inside = lo < end and hi > start
        elif inside and line.startswith("Rss:"):
            resident += int(line.split()[1]) << 10
        elif inside and line.startswith("FilePmdMapped:"):
            huge += int(line.split()[1]) << 10
    return PageSizes(resident, huge)


def mapping_page_sizes(buf) -> PageSizes | None:
    """How this process holds the mapping under `buf` (a numpy view of a
    whole mmap); None where /proc/self/smaps cannot be read."""
    start = buf.ctypes.data
    try:
        with open("/proc/self/smaps") as f:
            text = f.read()
    except OSError:
        return None
    return page_sizes(text, start, start + buf.nbytes)


def huge_ranges(ranges: Iterable[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """[start, end) ranges of a file widened to whole 2 MiB pieces (a folio
    covers an aligned piece of the file), merged; the file's last piece
    when shorter than 2 MiB left out (no 2 MiB folio holds it)."""
    whole = size - size % HUGE
    out: list[tuple[int, int]] = []
    for a, b in sorted((a - a % HUGE, min(whole, -(-b // HUGE) * HUGE)) for a, b in ranges if b > a):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _pieces(ranges: list[tuple[int, int]]) -> Iterable[tuple[int, int]]:
    """The ranges in pieces of at most PIECE bytes (2 MiB aligned where the ranges are)."""
    for a, b in ranges:
        for x in range(a, b, PIECE):
            yield x, min(b, x + PIECE)


def piece_page_sizes(fd: int, a: int, b: int) -> PageSizes | None:
    """How the page cache holds [a, b) of the file: mapped on its own (a
    mapping of its own is a VMA of its own in smaps) and populated, which
    reads nothing where the pages are cached and maps a 2 MiB folio as one
    2 MiB page."""
    m = mmap.mmap(fd, b - a, offset=a, access=mmap.ACCESS_READ)
    try:
        m.madvise(mmap.MADV_HUGEPAGE)
        populate(m, 0, b - a)
        return mapping_page_sizes(np.frombuffer(m, np.uint8))
    finally:
        m.close()


@dataclass
class Reread:
    path: str
    before: PageSizes
    after: PageSizes
    bytes_read: int
    seconds: float
    gave_up: bool     # the first piece came back in 4 KiB pages (mapped by another process, or no 2 MiB folios)

    def note(self) -> str:
        gib = 1 << 30
        if self.gave_up:
            return (f"goosedump: {os.path.basename(self.path)}: {self.before.small / gib:.2f} GiB of the weights "
                    f"are cached in 4 KiB pages, and read again they came back in 4 KiB pages (another process "
                    f"maps them, free memory is too fragmented, or the file system has no 2 MiB pages): left as "
                    f"they are")
        return (f"goosedump: read {self.bytes_read / gib:.2f} GiB of {os.path.basename(self.path)} again into "
                f"2 MiB pages in {self.seconds:.1f} s (the page cache held "
                f"{self.before.small / gib:.2f} GiB of its weights in 4 KiB pages, which slow decode by "
                f"TLB misses; once: later runs find them cached this way)")


def populate(m: mmap.mmap, a: int, b: int) -> None:
    """Map the pages of [a, b) of m now, reading those not in the page cache."""
    try:
        m.madvise(MADV_POPULATE_READ, a, b - a)
    except (OSError, ValueError):   # kernels before 5.14: touch one byte per page
        int(np.frombuffer(m, np.uint8, b - a, a)[::mmap.PAGESIZE].sum(dtype=np.uint64))


def reread_in_huge_pages(path: str, m: mmap.mmap, buf, ranges: list[tuple[int, int]],
                         say: Callable[[str], None] | None = None) -> Reread | None:
    """Where the mapping holds enough in 4 KiB pages: the pieces of
    `ranges` of the file (mapped whole by m, viewed by buf) with at least
    MIN_SMALL_SHARE of them in 4 KiB pages dropped from this mapping and
    from the page cache and mapped again, read into 2 MiB folios. None
    where nothing needed doing (or smaps is not readable). say: told
    before the first read (they take a while: up to the resident weights'
    size at the disk's speed)."""
    before = mapping_page_sizes(buf)
    if before is None or before.small < MIN_SMALL_BYTES or before.small < MIN_SMALL_SHARE * before.resident:
        return None
    t0 = time.perf_counter()
    done = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        # a file just written may still have pages to write back, which the
        # page cache keeps whatever DONTNEED says: write them now
        os.fdatasync(fd)
        for a, b in _pieces(huge_ranges(ranges, len(m))):
            sizes = piece_page_sizes(fd, a, b)
            if sizes is None or sizes.small < MIN_SMALL_SHARE * sizes.resident:
                continue
            if done == 0 and say is not None:   # (said once there is something to read)
                say(f"goosedump: {os.path.basename(path)}: {before.small / (1 << 30):.2f} GiB of the weights are "
                    f"cached in 4 KiB pages; reading them again into 2 MiB pages, which decode faster (once; "
                    f"--no-huge-pages skips this)")
            m.madvise(mmap.MADV_DONTNEED, a, b - a)
            os.posix_fadvise(fd, a, b - a, os.POSIX_FADV_DONTNEED)
            populate(m, a, b)
            if done == 0:   # the first piece read again: did it come back in 2 MiB folios?
                again = piece_page_sizes(fd, a, b)
                if again is not None and again.small >= sizes.small:
                    return Reread(path, before, mapping_page_sizes(buf) or before, b - a,
                                  time.perf_counter() - t0, gave_up=True)
            done += b - a
    finally:
        os.close(fd)
    if done == 0:   # (the 4 KiB pages are outside the ranges, or spread thin)
        return None
    return Reread(path, before, mapping_page_sizes(buf) or before, done, time.perf_counter() - t0, gave_up=False)
