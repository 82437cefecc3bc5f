"""The resident weights re-read into 2 MiB pages (goosedump.residency),
checked against what the kernel reports in /proc/self/smaps."""
import hashlib
import mmap
import os
import subprocess
import sys

import numpy as np
import pytest

import goosedump
from goosedump import residency
from goosedump.options import ENV_HUGE_PAGES, Options

MiB = 1 << 20
THP = "/sys/kernel/mm/transparent_hugepage/enabled"


def file_thp() -> bool:
    """Whether this kernel maps file pages in 2 MiB pieces at all (Linux with
    transparent huge pages not off)."""
    try:
        with open(THP) as f:
            return "[never]" not in f.read()
    except OSError:
        return False


needs_thp = pytest.mark.skipif(not sys.platform.startswith("linux") or not file_thp(),
                               reason="no transparent huge pages on this system")


def test_smaps_sums_the_mappings_that_overlap():
    smaps = ("7f0000000000-7f0000400000 r--s 00000000 fe:00 12  /m/a.gguf\n"
             "Rss:                4096 kB\nFilePmdMapped:      2048 kB\n"
             "7f0000400000-7f0000600000 r--s 00400000 fe:00 12  /m/a.gguf\n"
             "Rss:                2048 kB\nFilePmdMapped:         0 kB\n"
             "7f0000600000-7f0000800000 r--p 00000000 fe:00 13  /lib/other.so\n"
             "Rss:                2048 kB\nFilePmdMapped:      2048 kB\n")
    # a mapping's end is page-rounded: a view that ends inside the last page still counts it
    sizes = residency.page_sizes(smaps, 0x7F0000000000, 0x7F0000600000 - 100)
    assert (sizes.resident, sizes.huge, sizes.small) == (6 * MiB, 2 * MiB, 4 * MiB)


def test_ranges_widen_to_whole_2mib_pieces_and_merge():
    two = 2 * MiB
    got = residency.huge_ranges([(5 * MiB, 5 * MiB + 10), (100, 200), (two + 1, 3 * MiB), (7, 7)], 11 * MiB)
    assert got == [(0, 6 * MiB)]
    # the file's last piece, shorter than 2 MiB, cannot be a 2 MiB page
    assert residency.huge_ranges([(9 * MiB, 10 * MiB + 5)], 10 * MiB + 5) == [(8 * MiB, 10 * MiB)]
    assert residency.huge_ranges([(10 * MiB + 1, 10 * MiB + 5)], 10 * MiB + 5) == []


def small_page_file(folder, size: int) -> str:
    """A file written in 64 KiB pieces: the page cache holds it as the
    writes made it, in small folios."""
    path = os.path.join(folder, "weights.bin")
    rng = np.random.default_rng(7)
    with open(path, "wb") as f:
        for _ in range(size // (64 << 10)):
            f.write(rng.integers(0, 256, 64 << 10, dtype=np.uint8).tobytes())
        f.flush()
        os.fsync(f.fileno())
    return path


def mapped(path):
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    m.madvise(mmap.MADV_HUGEPAGE)
    buf = np.frombuffer(m, np.uint8)
    residency.populate(m, 0, len(m))
    return m, buf


@needs_thp
def test_a_freshly_written_file_is_read_again_into_2mib_pages(tmp_path, monkeypatch):
    # (tmp_path: a disk file system; the thresholds scaled down to a 24 MiB file)
    monkeypatch.setattr(residency, "MIN_SMALL_BYTES", 4 * MiB)
    monkeypatch.setattr(residency, "PIECE", 8 * MiB)
    path = small_page_file(str(tmp_path), 24 * MiB)
    m, buf = mapped(path)
    before = residency.mapping_page_sizes(buf)
    assert before.resident == 24 * MiB and before.small >= 4 * MiB, before
    digest = hashlib.sha256(buf).hexdigest()
    said = []
    done = residency.reread_in_huge_pages(path, m, buf, [(3 * MiB, 20 * MiB)], said.append)
    assert len(said) == 1 and "reading them again into 2 MiB pages" in said[0] and "--no-huge-pages" in said[0]
    if done is not None and done.gave_up:
        pytest.skip(f"this file system does not give 2 MiB folios: {done.note()}")
    assert done is not None and done.bytes_read == 18 * MiB        # [2, 20) MiB: the range widened
    assert done.after.huge >= before.huge + 16 * MiB, (before, done.after)
    assert hashlib.sha256(buf).hexdigest() == digest                       # the same bytes, re-read
    assert "2 MiB pages" in done.note() and "weights.bin" in done.note()
    # a second look finds them in 2 MiB pages already: nothing to do
    assert residency.reread_in_huge_pages(path, m, buf, [(3 * MiB, 20 * MiB)]) is None
    del buf
    m.close()


@needs_thp
def test_where_the_cache_cannot_hold_2mib_pages_it_stops_after_one_piece(monkeypatch):
    # tmpfs without huge pages (shmem_enabled never/advise for this mount):
    # its pages cannot be dropped and read again, they stay small
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as f:
        if "[never]" not in f.read():
            pytest.skip("tmpfs here may hold 2 MiB pages")
    monkeypatch.setattr(residency, "MIN_SMALL_BYTES", 4 * MiB)
    monkeypatch.setattr(residency, "PIECE", 4 * MiB)
    folder = os.path.join("/dev/shm", f"goosedump-test-{os.getpid()}")
    os.makedirs(folder)
    try:
        path = small_page_file(folder, 16 * MiB)
        m, buf = mapped(path)
        done = residency.reread_in_huge_pages(path, m, buf, [(0, 16 * MiB)])
        assert done is not None and done.gave_up and done.bytes_read == 4 * MiB
        assert "left as they are" in done.note()
        del buf
        m.close()
    finally:
        for name in os.listdir(folder):
            os.remove(os.path.join(folder, name))
        os.rmdir(folder)


def test_the_setting_from_flag_and_environment():
    assert Options.from_env(env={}).huge_pages is True
    assert Options.from_env(env={ENV_HUGE_PAGES: "off"}).huge_pages is False
    assert Options.from_env(env={ENV_HUGE_PAGES: ""}).huge_pages is True
    assert Options.from_env(huge_pages=False, env={ENV_HUGE_PAGES: "on"}).huge_pages is False
    with pytest.raises(ValueError, match=f"{ENV_HUGE_PAGES}='sometimes': expected on or off"):
        Options.from_env(env={ENV_HUGE_PAGES: "sometimes"})


def test_a_model_under_the_threshold_loads_without_a_note(tiny_path):
    notes = []
    m = goosedump.load(tiny_path, options=Options.from_env(prompt_cache="off"))
    m.on_note = notes.append
    m.transformer
    assert notes == []
    m.close()


def test_the_flag_is_in_the_help():
    out = subprocess.run([sys.executable, "-m", "goosedump", "run", "--help"], capture_output=True, text=True)
    assert "--no-huge-pages" in out.stdout and "GOOSEDUMP_HUGE_PAGES=off" in out.stdout


@needs_thp
def test_loading_a_model_just_written_rereads_it_and_generates_the_same(tmp_path, monkeypatch, tiny_model):
    # a tiny model (39 MB) written now: its pages are the writes' small ones
    # (the thresholds scaled down to its size); the re-read one generates
    # what the model loaded before generates, token for token
    from goosedump import synth
    monkeypatch.setattr(residency, "MIN_SMALL_BYTES", 4 * MiB)
    monkeypatch.setattr(residency, "PIECE", 8 * MiB)
    path = os.fspath(tmp_path / "fresh.gguf")
    synth.write_model(path, "tiny", seed=1)      # the same model as tiny_model's
    notes = []
    m = goosedump.load(path, options=Options.from_env(prompt_cache="off"))
    m.on_note = notes.append
    m.transformer
    if len(notes) == 2 and "left as they are" in notes[1]:
        pytest.skip(notes[1])
    assert len(notes) == 2 and "reading them again into 2 MiB pages" in notes[0], notes
    assert notes[1].startswith("goosedump: read ") and "fresh.gguf again into 2 MiB pages" in notes[1], notes
    sizes = residency.mapping_page_sizes(m.file.buf)
    assert sizes.huge >= 0.75 * sizes.resident, sizes   # (readahead near the end of a file takes smaller folios)
    prompt = [976, 4853, 19705, 68347]
    assert m.generate(prompt, max_tokens=12).token_ids == tiny_model.generate(prompt, max_tokens=12).token_ids
    # the next load finds it cached in 2 MiB pages: nothing to do, nothing said
    again = goosedump.load(path, options=Options.from_env(prompt_cache="off"))
    again.on_note = notes.append
    again.transformer
    assert len(notes) == 2
    m.close()
    again.close()
