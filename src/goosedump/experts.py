"""The expert store: experts stream from the GGUF file through a byte-budgeted
cache of slots, so a model runs in far less memory than its file.

One slot holds one expert's six pieces (gate, gate bias, up, up bias, down,
down bias), read straight from the file with pread on background threads (the
GIL is released while they read). A layer's chosen experts are requested
together and handed out in the order their reads complete, so computation
starts on whichever is ready first. Slots in use are pinned and never evicted.
Eviction is frequency-aware with decay: each expert's use count halves every
`slots` expert requests, and the unpinned slot with the lowest count goes
(the least recently used among equals). Chosen over LRU and plain LFU by
replaying routing traces (goosedump cache-sim; see the README): it keeps the
popular experts of skewed routing, and matches LRU when routing is uniform.

The budget and the page cache: by default experts are read with O_DIRECT,
past the OS page cache (where a file system refuses O_DIRECT, pages are
dropped right after each read with posix_fadvise DONTNEED), so the process's
real footprint, page cache included, stays within the dense weights plus the
budget, and no CPU time goes to copying out of the page cache.
`page_cache=True` reads through the page cache and leaves the pages there:
faster while RAM is free, slower under a memory limit (measured in
benchmarks/bounded_memory.py; see the README). When the budget covers every
expert, nothing is copied: experts are used in place from the memory map.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from .config import ModelConfig
from .expert_slots import PAGE, PIECES, ExpertView, StoreStats, slot_layout
from .gguf import GGUFFile

_NO_LOCK = contextlib.nullcontext()


class ExpertReadError(OSError):
    """Reading an expert failed: names the layer, the expert and the file."""


@dataclass
class _Piece:
    part: int          # the file (of a split set) that holds it
    offset: int        # of expert 0 in that file
    stride: int        # bytes from one expert to the next
    nbytes: int        # one expert's bytes
    slot_offset: int   # where it goes inside a slot
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass
class _Slot:
    key: tuple[int, int] | None = None   # (layer, expert) held, or None
    pins: int = 0
    ready: bool = False                  # fully read: only then is it in the index
    future: Future | None = field(default=None, repr=False)


class ExpertStore:
    def __init__(self, f: GGUFFile, c: ModelConfig, budget: int, page_cache: bool = False,
                 read_threads: int = 4):
        # read_threads: reads in flight at once (more keep the disk's queue fuller)
        self.file, self.config = f, c
        self.page_cache = page_cache
        self.stats = StoreStats()
        self._pieces: list[dict[str, _Piece]] = []
        slot_offsets, slot_bytes = slot_layout(f, c)
        for i in range(c.n_layer):
            layer = {}
            for name in PIECES:
                t = f.tensors[f"blk.{i}.{name}"]
                per_expert = t.nbytes // c.n_expert
                if name.endswith(".bias"):          # (F32, config's check)
                    shape, dtype = t.dims[:1], np.dtype("<f4")
                else:  # rows of a format's blocks (F32's too: the kernels take every weight's rows as bytes)
                    shape, dtype = (t.dims[1], per_expert // t.dims[1]), np.dtype(np.uint8)
                layer[name] = _Piece(t.part, t.offset, per_expert, per_expert, slot_offsets[name], shape, dtype)
            self._pieces.append(layer)
        self.slot_bytes = slot_bytes
        self.total_experts = c.n_layer * c.n_expert
        self.in_place = budget >= self.total_experts * slot_bytes
        self.budget = budget
        if self.in_place:
            self.n_slots = 0
            return
        self.n_slots = budget // slot_bytes
        if self.n_slots < c.n_expert_used:
            need = c.n_expert_used * slot_bytes
            raise ValueError(f"an expert cache (--expert-cache, $GOOSEDUMP_EXPERT_CACHE_SIZE) of {budget} bytes "
                             f"holds {self.n_slots} expert slots of "
                             f"{slot_bytes} bytes; a token needs {c.n_expert_used} at once: give at least "
                             f"{-(-need // (1 << 20))}M")
        raw = np.empty(self.n_slots * slot_bytes + PAGE, np.uint8)
        skip = -raw.ctypes.data % PAGE
        self._buf = raw[skip:skip + self.n_slots * slot_bytes].reshape(self.n_slots, slot_bytes)
        self._slots = [_Slot() for _ in range(self.n_slots)]
        self._index: dict[tuple[int, int], int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()   # unpinned ready slots, least recently used first
        self._clock = 0                                      # expert requests so far
        self._score: dict[tuple[int, int], tuple[float, int]] = {}   # key -> (use count, at clock)
        self._free = list(range(self.n_slots))
        self._loading: dict[tuple[int, int], int] = {}     # prefetches in flight: key -> slot
        self._unasked: set[int] = set()                     # slots a prefetch filled, not yet asked for
        self._predicted: dict[int, set[int]] = {}           # layer -> experts predicted for it
        self._logs: list[list] = []                         # request logs being kept (start_log)
        # Re-entrant: a read that is already done runs its done-callback at
        # once, in the thread that registers it, which holds this lock.
        self._lock = threading.RLock()
        self._pool = ThreadPoolExecutor(max_workers=read_threads, thread_name_prefix="goosedump-read")
        self.direct = False
        self._fds = self._open(f, direct=not page_cache)    # one per file of a split set

    def _open(self, f: GGUFFile, direct: bool) -> list[int]:
        fds: list[int] = []
        if direct:
            try:
                for part in f.parts:
                    fds.append(os.open(part.path, os.O_RDONLY | os.O_DIRECT))
                self.direct = True
                return fds
            except (OSError, AttributeError):   # the file system refuses O_DIRECT: drop pages after reading
                for fd in fds:
                    os.close(fd)
                fds = []
        for part in f.parts:
            fds.append(os.open(part.path, os.O_RDONLY))
            if not self.page_cache:
                # No readahead: it would pull the neighbouring experts' pages
                # into the page cache, outside the budget and the DONTNEED ranges.
                os.posix_fadvise(fds[-1], 0, 0, os.POSIX_FADV_RANDOM)
        return fds

    def close(self) -> None:
        if not self.in_place and self._fds:
            self._pool.shutdown(wait=True)
            for fd in self._fds:
                os.close(fd)
            self._fds = []

    # -- views -------------------------------------------------------------
    def _mapped_view(self, layer: int, e: int) -> ExpertView:
        f = self.file
        parts = []
        for name in PIECES:
            p = self._pieces[layer][name]
            raw = f.parts[p.part].buf[p.offset + e * p.stride:p.offset + e * p.stride + p.nbytes]
            parts.append(raw.view(p.dtype).reshape(p.shape))
        return ExpertView(*parts)

    def _slot_view(self, layer: int, s: int) -> ExpertView:
        _, e = self._slots[s].key
        parts = []
        for name in PIECES:
            p = self._pieces[layer][name]
            start = p.slot_offset + (p.offset + e * p.stride) % PAGE   # the piece inside its first page
            parts.append(self._buf[s, start:start + p.nbytes].view(p.dtype).reshape(p.shape))
        return ExpertView(*parts)

    # -- reads ---------------------------------------------------------------
    def _read(self, layer: int, e: int, s: int) -> int:
        """Fill slot s with expert e of layer (on a reader thread)."""
        t0 = time.perf_counter()
        total = 0
        for name in PIECES:
            p = self._pieces[layer][name]
            offset = p.offset + e * p.stride
            shift = offset % PAGE
            # Whole pages from the one holding the piece's first byte: what a
            # direct read needs, and the same place in the slot either way.
            need = shift + p.nbytes
            length = -(-need // PAGE) * PAGE
            dst = memoryview(self._buf[s, p.slot_offset:p.slot_offset + length])
            start = offset - shift
            done = 0
            while done < need:
                try:
                    n = os.preadv(self._fds[p.part], [dst[done:] if self.direct else dst[done:need]], start + done)
                except OSError as err:
                    raise ExpertReadError(f"{self.file.parts[p.part].path}: reading blk.{layer}.{name} expert {e} "
                                          f"({p.nbytes} bytes at byte {offset}): {err}") from None
                if n == 0:
                    raise ExpertReadError(f"{self.file.parts[p.part].path}: short read of blk.{layer}.{name} expert {e}: "
                                          f"got {max(0, done - shift)} of {p.nbytes} bytes at byte {offset} "
                                          f"(was the file truncated?)")
                done += n
            if not self.page_cache and not self.direct:
                os.posix_fadvise(self._fds[p.part], start, length, os.POSIX_FADV_DONTNEED)
            total += p.nbytes
        with self._lock:
            self.stats.read_seconds += time.perf_counter() - t0
            self.stats.bytes_read += total
        return total

    def _count(self, key: tuple[int, int]) -> float:
        """The key's use count, decayed to now (half-life: one pass over the slots)."""
        count, at = self._score.get(key, (0.0, self._clock))
        return count * 0.5 ** ((self._clock - at) / self.n_slots)

    def _use(self, key: tuple[int, int]) -> None:
        self._clock += 1
        self._score[key] = (self._count(key) + 1.0, self._clock)

    def _take_slot(self) -> int | None:
        """A free slot, or the unpinned one whose expert has the lowest decayed
        use count (evicted); the least recently used wins ties."""
        if self._free:
            return self._free.pop()
        if not self._lru:
            return None
        s = min(self._lru, key=lambda i: self._count(self._slots[i].key))   # min is stable: LRU order
        del self._lru[s]
        old = self._slots[s]
        del self._index[old.key]
        old.key, old.ready = None, False
        self.stats.evictions += 1
        if s in self._unasked:
            self._unasked.discard(s)
            self.stats.prefetch_wasted += 1
        return s

    # -- the interface the forward pass uses ------------------------------------
    def fetch(self, layer: int, experts: Sequence[int]) -> Iterator[tuple[int, ExpertView]]:
        """Yield (expert, view) for each distinct expert, ready ones first, the
        rest as their reads complete. Each yielded expert stays pinned until
        release(layer, expert); a read error propagates after the reads in
        flight settle, leaving no slot half-filled in the index."""
        wanted = list(dict.fromkeys(int(e) for e in experts))
        if self.in_place:
            self.stats.hits += len(wanted)
            for e in wanted:
                yield e, self._mapped_view(layer, e)
            return
        pending: list[int] = []
        ready: list[tuple[int, int]] = []
        inflight: dict[Future, tuple[int, int]] = {}
        with self._lock:
            predicted = self._predicted.pop(layer, None)
            if predicted is not None:
                self.stats.predicted += len(predicted)
                self.stats.predicted_right += len(predicted & set(wanted))
            for e in wanted:
                self._use((layer, e))
                s = self._index.get((layer, e))
                if s is not None and self._slots[s].ready:
                    self.stats.hits += 1
                    if s in self._unasked:             # a prefetch brought it in
                        self._unasked.discard(s)
                        self.stats.prefetch_used += 1
                    self._pin(s)
                    ready.append((e, s))
                elif (layer, e) in self._loading:      # a prefetch is reading it: wait for that read
                    s = self._loading.pop((layer, e))
                    self.stats.hits += 1
                    self.stats.prefetch_used += 1
                    self._slots[s].pins += 1
                    inflight[self._slots[s].future] = (e, s)
                else:
                    self.stats.misses += 1
                    pending.append(e)
            for log in self._logs:     # in the order served: hits, prefetches in flight, then reads
                log.append((layer, tuple([e for e, _ in ready] + [e for e, _ in inflight.values()] + pending)))
        for e, s in ready:
            yield e, self._slot_view(layer, s)
        try:
            while pending or inflight:
                with self._lock:
                    while pending:
                        s = self._take_slot()
                        if s is None:
                            break
                        e = pending.pop(0)
                        slot = self._slots[s]
                        slot.key, slot.ready, slot.pins = (layer, e), False, 1
                        slot.future = self._pool.submit(self._read, layer, e, s)
                        inflight[slot.future] = (e, s)
                if not inflight:
                    raise RuntimeError(f"every expert slot ({self.n_slots}) is pinned: release experts "
                                       f"before fetching more")
                t0 = time.perf_counter()
                done, _ = wait(list(inflight), return_when=FIRST_COMPLETED)
                self.stats.stall_seconds += time.perf_counter() - t0
                for fut in done:
                    e, s = inflight.pop(fut)
                    try:
                        fut.result()
                    except BaseException:
                        with self._lock:   # the slot never entered the index: free it
                            slot = self._slots[s]
                            slot.key, slot.ready, slot.pins = None, False, 0
                            self._free.append(s)
                        raise
                    with self._lock:
                        self._slots[s].ready = True
                        self._index[(layer, e)] = s
                    yield e, self._slot_view(layer, s)
        except BaseException:
            # Settle the reads in flight; failed or abandoned slots go back free.
            for fut, (e, s) in inflight.items():
                try:
                    fut.result()
                    ok = True
                except Exception:
                    ok = False
                with self._lock:
                    slot = self._slots[s]
                    if ok:
                        slot.ready = True
                        self._index[(layer, e)] = s
                        self._unpin(s)
                    else:
                        slot.key, slot.ready, slot.pins = None, False, 0
                        self._free.append(s)
            raise

    def prefetch(self, layer: int, experts: Sequence[int], evict: bool = True) -> None:
        """Start reading a later layer's predicted experts into free or
        least-used unpinned slots (free ones only, without evict), without
        waiting and without pinning; fetch() picks the reads up if the
        prediction was right."""
        if self.in_place:
            return
        with self._lock:
            self._predicted[layer] = {int(e) for e in experts}
            for e in dict.fromkeys(int(e) for e in experts):
                key = (layer, e)
                if key in self._index or key in self._loading:
                    continue
                if not evict and not self._free:
                    return
                s = self._take_slot()
                if s is None:
                    return
                slot = self._slots[s]
                slot.key, slot.ready, slot.pins = key, False, 0
                self._loading[key] = s   # before the callback can look for it
                slot.future = self._pool.submit(self._read, layer, e, s)
                slot.future.add_done_callback(lambda fut, key=key, s=s: self._prefetch_done(key, s, fut))
                self.stats.prefetched += 1

    def _prefetch_done(self, key: tuple[int, int], s: int, fut: Future) -> None:
        """A prefetch nobody waited for: index it when read, free it if failed."""
        with self._lock:
            if self._loading.get(key) != s:
                return  # fetch() took it over
            del self._loading[key]
            slot = self._slots[s]
            if fut.exception() is None:
                slot.ready = True
                self._index[key] = s
                self._lru[s] = None
                self._unasked.add(s)
            else:
                slot.key, slot.ready, slot.pins = None, False, 0
                self._free.append(s)
                self.stats.prefetch_wasted += 1

    def release(self, layer: int, expert: int) -> None:
        if self.in_place:
            return
        with self._lock:
            s = self._index.get((layer, int(expert)))
            if s is not None:
                self._unpin(s)

    def _pin(self, s: int) -> None:
        self._slots[s].pins += 1
        self._lru.pop(s, None)

    def _unpin(self, s: int) -> None:
        slot = self._slots[s]
        slot.pins -= 1
        if slot.pins == 0:
            self._lru[s] = None   # most recently used at the end

    @property
    def resident_bytes(self) -> int:
        """Bytes of experts the store holds in slots (0 in place)."""
        return 0 if self.in_place else len(self._index) * self.slot_bytes

    def start_log(self) -> list:
        """A list that gets each fetch's (layer, experts) from now on, in the
        order the store serves them, until stop_log: the requests the
        counters count, for Belady's oracle on the very same requests."""
        log: list = []
        with self._lock:
            self._logs.append(log)
        return log

    def stop_log(self, log: list) -> None:
        with self._lock:
            self._logs = [x for x in self._logs if x is not log]

    def counters(self) -> StoreStats:
        """A copy of the counters since the store opened (they only grow)."""
        with self._lock if not self.in_place else _NO_LOCK:
            return StoreStats(**self.stats.__dict__)

    def snapshot(self, since: StoreStats | None = None) -> dict:
        """The counters (those since `since`, an earlier counters() copy) with
        their rates and the store's shape."""
        now = self.counters()
        d = (now if since is None else now.minus(since)).as_dict()
        if self.in_place:        # no cache was asked: every expert is read from memory
            d["hit_rate"] = d["demand_hit_rate"] = 1.0
        d.update(in_place=self.in_place, slots=self.n_slots, slot_bytes=self.slot_bytes, budget=self.budget,
                 direct_io=getattr(self, "direct", False))
        return d
