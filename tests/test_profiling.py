"""Process samples see real reads, memory and CPU; routing stats count what the router chose."""
import mmap
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from goosedump.profiling import phase_stats, routing_stats, sample

MB = 1 << 20


def test_sample_fields_are_plausible():
    s = sample()
    assert s.rss > MB and s.peak_rss >= s.rss
    assert s.cpu_user > 0 and s.cpu_system >= 0
    assert s.minor_faults > 0 and s.major_faults >= 0
    if s.io_available:
        assert s.read_chars > 0


def test_read_chars_and_read_bytes_count_a_file_read(tmp_path):
    size = 8 * MB
    path = tmp_path / "blob"
    path.write_bytes(os.urandom(size))
    buf = mmap.mmap(-1, MB)   # page-aligned, as O_DIRECT wants
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        direct = True
    except OSError:   # tmpfs and some others refuse O_DIRECT: drop the cached pages instead
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        direct = False
    try:
        before = sample()
        got = 0
        while n := os.readv(fd, [buf]):
            got += n
        after = sample()
    finally:
        os.close(fd)
        buf.close()
    assert got == size
    if not before.io_available:
        pytest.skip("this OS does not report I/O counters")
    st = phase_stats(before, after)
    assert st["io_available"]
    assert st["read_chars"] >= size
    if direct:
        # O_DIRECT bypasses the page cache: every byte came from storage.
        assert st["read_bytes"] >= size



def test_read_chars_counts_page_cache_hits_read_bytes_does_not(tmp_path):
    size = 8 * MB
    path = tmp_path / "blob"
    path.write_bytes(os.urandom(size))
    path.read_bytes()   # make sure every page is cached
    before = sample()
    assert len(path.read_bytes()) == size
    after = sample()
    if not before.io_available:
        pytest.skip("this OS does not report I/O counters")
    st = phase_stats(before, after)
    assert st["read_chars"] >= size
    assert st["read_bytes"] < size // 2   # served from memory, not storage

def test_touching_200mb_raises_peak_rss_and_minor_faults():
    size = 200 * MB
    # Start the high-water mark from the current RSS (Linux: write 5 to
    # clear_refs), so an earlier peak cannot hide this one.
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    before = sample()
    headroom = before.peak_rss - before.rss   # 0 after the reset
    # Anonymous memory without transparent huge pages: one fault per 4 KiB page.
    m = mmap.mmap(-1, size)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        m.madvise(mmap.MADV_NOHUGEPAGE)
    a = np.frombuffer(m, dtype=np.uint8)
    a[::mmap.PAGESIZE] = 1   # touch every page once
    after = sample()
    del a
    m.close()
    st = phase_stats(before, after)
    assert st["peak_rss_bytes"] - before.peak_rss >= 150 * MB - headroom
    assert st["rss_bytes"] - before.rss >= 150 * MB
    assert st["minor_faults"] >= 30000
    assert st["wall_seconds"] > 0


def test_busy_loop_raises_cpu_user():
    before = sample()
    # 0.3 s of this thread's CPU time (not wall time: the machine may be shared),
    # in chunks of arithmetic: the clock itself is a syscall, i.e. system time.
    end = time.thread_time() + 0.3
    while time.thread_time() < end:
        sum(range(100_000))
    st = phase_stats(before, sample())
    assert st["wall_seconds"] >= 0.3
    assert st["cpu_user_seconds"] >= 0.2
    assert st["cpu_user_seconds"] <= st["wall_seconds"] + 0.05


def test_routing_stats_hand_counted():
    # 2 tokens, 3 layers, k=2, 4 experts.
    sel = np.array([[[0, 1], [2, 3], [1, 0]],
                    [[1, 2], [2, 3], [3, 0]]])
    r = routing_stats(sel, n_layer=3, n_expert=4)
    assert r["selections"] == 12
    assert r["counts"] == [[1, 2, 1, 0],
                           [0, 0, 2, 2],
                           [2, 1, 0, 1]]
    assert r["unique_experts_per_layer"] == [3, 2, 3]
    assert r["unique_pairs"] == 8


def test_routing_stats_against_brute_force():
    rng = np.random.default_rng(7)
    tokens, n_layer, n_expert, k = 37, 5, 32, 4
    # Distinct experts per (token, layer), as the router's top-k gives.
    sel = np.argsort(rng.random((tokens, n_layer, n_expert)), axis=-1)[..., :k]
    r = routing_stats(sel, n_layer, n_expert)
    counts = np.zeros((n_layer, n_expert), dtype=np.int64)
    np.add.at(counts, (np.broadcast_to(np.arange(n_layer)[None, :, None], sel.shape), sel), 1)
    assert r["counts"] == counts.tolist()
    assert r["selections"] == tokens * n_layer * k == counts.sum()
    pairs = {(layer, int(e)) for layer in range(n_layer) for e in sel[:, layer, :].ravel()}
    assert r["unique_pairs"] == len(pairs)
    assert r["unique_experts_per_layer"] == [len(np.unique(sel[:, layer])) for layer in range(n_layer)]


def test_routing_stats_empty_and_bad_input():
    r = routing_stats(np.zeros((0, 3, 4), dtype=np.int32), 3, 8)
    assert r["selections"] == 0 and r["unique_pairs"] == 0
    assert r["unique_experts_per_layer"] == [0, 0, 0]
    assert r["counts"] == [[0] * 8] * 3
    with pytest.raises(ValueError, match="shape"):
        routing_stats(np.zeros((2, 4, 1), dtype=np.int32), 3, 8)
    with pytest.raises(ValueError, match=r"\[0, 8\)"):
        routing_stats(np.full((1, 3, 1), 8), 3, 8)
    with pytest.raises(ValueError, match="integers"):
        routing_stats(np.zeros((1, 3, 1)), 3, 8)


def test_modules_do_not_import_matplotlib():
    code = ("import sys, goosedump, goosedump.profiling, goosedump.plot; "
            "assert 'matplotlib' not in sys.modules, 'matplotlib imported'")
    subprocess.run([sys.executable, "-c", code], check=True)

