"""The expert store: a byte budget of slots, LRU over unpinned slots, reads
that fail cleanly, and generation through it equal to generation in place."""
import errno
import json
import os

import numpy as np
import pytest

import goosedump
from goosedump import experts as experts_mod
from goosedump import synth
from goosedump.experts import ExpertReadError, ExpertStore
from goosedump.gguf import GGMLType
from goosedump.options import Options

PROMPT = [97, 485, 197, 383, 11, 290, 377, 12, 500, 3]


@pytest.fixture(scope="module")
def t120_path(tmp_path_factory, small_vocab):
    """The 120b's routing shape (36 layers x 128 experts) at tiny widths."""
    p = tmp_path_factory.mktemp("store") / "t120.gguf"
    synth.write_model(p, "tiny-120b", seed=4, vocab=small_vocab)
    return os.fspath(p)


def store_for(path, n_slots):
    m = goosedump.load(path)
    _, slot = experts_mod.slot_layout(m.file, m.config)
    return m, ExpertStore(m.file, m.config, n_slots * slot)


def test_a_budget_covering_every_expert_is_used_in_place(t120_path):
    m = goosedump.load(t120_path, expert_cache="1G")
    s = m.store
    assert s.in_place and s.n_slots == 0 and s.resident_bytes == 0
    (e, v), = list(s.fetch(3, [5]))
    assert np.shares_memory(v.gate, m.file.buf)   # no copy
    m2 = goosedump.load(t120_path, expert_cache=4 << 20)
    assert not m2.store.in_place and m2.store.n_slots == (4 << 20) // m2.store.slot_bytes


def test_views_hold_the_files_bytes(t120_path):
    m, s = store_for(t120_path, 8)
    got = dict(s.fetch(7, [3, 100]))
    for e in (3, 100):
        for name, arr in zip(experts_mod.PIECES, vars(got[e]).values()):
            t = m.file.tensor(f"blk.7.{name}")
            np.testing.assert_array_equal(arr, t[e])
        s.release(7, e)


def test_eviction_by_decayed_use_count_and_stats(t120_path):
    _, s = store_for(t120_path, 6)

    def use(layer, experts):
        got = [e for e, _ in s.fetch(layer, experts)]
        for e in got:
            s.release(layer, e)
        return sorted(got)

    assert use(0, [0, 1, 2, 3]) == [0, 1, 2, 3]
    assert (s.stats.hits, s.stats.misses, s.stats.evictions) == (0, 4, 0)
    assert use(0, [2, 3, 4, 5]) == [2, 3, 4, 5]       # 2, 3 hit; 4, 5 fill the last free slots
    assert (s.stats.hits, s.stats.misses, s.stats.evictions) == (2, 6, 0)
    use(1, [0, 1])                                     # evicts layer 0's 0 and 1: used once, longest ago
    assert s.stats.evictions == 2
    use(0, [2])                                        # still cached
    assert s.stats.hits == 3
    use(0, [0])                                        # was evicted: a miss
    assert s.stats.misses == 9
    assert s.stats.bytes_read == 9 * sum(p.nbytes for p in s._pieces[0].values())
    assert 0 < s.snapshot()["hit_rate"] < 1


def test_pinned_slots_are_never_evicted(t120_path):
    _, s = store_for(t120_path, 4)
    held = dict(s.fetch(2, [10, 11, 12, 13]))          # all four pinned, none released
    before = {e: v.gate.copy() for e, v in held.items()}
    with pytest.raises(RuntimeError, match=r"every expert slot \(4\) is pinned"):
        list(s.fetch(2, [14]))
    for e, v in held.items():                           # untouched
        np.testing.assert_array_equal(v.gate, before[e])
    s.release(2, 10)
    assert [e for e, _ in s.fetch(2, [14])] == [14]     # reuses 10's slot
    assert s.stats.evictions == 1


def test_budget_too_small_for_a_token(t120_path):
    m = goosedump.load(t120_path)
    _, slot = experts_mod.slot_layout(m.file, m.config)
    with pytest.raises(ValueError, match=r"an expert cache \(--expert-cache, \$GOOSEDUMP_EXPERT_CACHE_SIZE\) of .* "
                                         r"holds 3 expert slots .* a token needs 4 at once: give at least"):
        ExpertStore(m.file, m.config, 3 * slot + 10)


def test_bytes_read_per_token_count_the_tokens_computed(t120_path):
    """(the prompt and every generated token had been counted, the last of
    which is never run, and a cached prompt's tokens, which read nothing)"""
    m = goosedump.load(t120_path, expert_cache=2 << 20)
    r = m.generate(PROMPT, max_tokens=6)
    st = r.expert_cache
    assert st["bytes_read"] > 0
    assert st["bytes_read_per_token"] == st["bytes_read"] / (len(PROMPT) - r.cached_tokens + r.decode_steps)


def test_generation_through_a_small_cache_equals_in_place(t120_path):
    ref = goosedump.load(t120_path, expert_cache="1G").generate(PROMPT, max_tokens=12)
    m = goosedump.load(t120_path, expert_cache=(2 << 20))   # ~290 of 4608 experts
    assert not m.store.in_place
    r = m.generate(PROMPT, max_tokens=12)
    assert r.token_ids == ref.token_ids
    st = m.store.stats
    assert st.misses > 0 and st.evictions > 0 and st.bytes_read > 0
    # The same products, summed in the same (expert id) order: equal bits.
    np.testing.assert_array_equal(m.logits(PROMPT), goosedump.load(t120_path, expert_cache="1G").logits(PROMPT))


@pytest.mark.parametrize("fault", ["eio", "short"])
def test_read_faults_fail_cleanly_and_the_next_generation_works(t120_path, monkeypatch, fault):
    m = goosedump.load(t120_path, expert_cache=(2 << 20))
    real = os.preadv
    calls = {"n": 0}

    def faulty(fd, buffers, offset):
        calls["n"] += 1
        if calls["n"] == 40:     # somewhere inside the prefill's reads
            if fault == "eio":
                raise OSError(errno.EIO, "Input/output error")
            return 0              # end of file: the file shrank under us
        return real(fd, buffers, offset)

    monkeypatch.setattr(experts_mod.os, "preadv", faulty)
    with pytest.raises(ExpertReadError) as e:
        m.generate(PROMPT, max_tokens=4)
    msg = str(e.value)
    assert msg.startswith(t120_path) and "expert" in msg and "blk." in msg
    assert ("Input/output error" in msg) if fault == "eio" else ("short read" in msg and "truncated" in msg)
    s = m.store
    # consistent: every indexed slot is ready and unpinned, no slot is both free and indexed
    assert all(s._slots[i].ready and s._slots[i].pins == 0 for i in s._index.values())
    assert not set(s._free) & set(s._index.values())
    monkeypatch.setattr(experts_mod.os, "preadv", real)
    ref = goosedump.load(t120_path, expert_cache="1G").generate(PROMPT, max_tokens=6)
    assert m.generate(PROMPT, max_tokens=6).token_ids == ref.token_ids


def test_cli_expert_cache_flag_and_env(t120_path):
    import subprocess
    import sys
    # a fixed seed: with fresh entropy about one run in 40 samples the end token first, and a trace
    # of the prompt alone reuses no expert (Belady's rate 0)
    run = [sys.executable, "-m", "goosedump", "run", t120_path, "--prompt-ids", "1,2,3", "-n", "3", "--json", "-s", "1"]
    ok = subprocess.run(run + ["--expert-cache", "2M"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run(run + ["--expert-cache", "2GB"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--expert-cache='2GB' is not a size" in bad.stderr
    env = {**os.environ, "GOOSEDUMP_EXPERT_CACHE_SIZE": "0M"}
    bad = subprocess.run(run, capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "GOOSEDUMP_EXPERT_CACHE_SIZE='0M' is out of range" in bad.stderr
    small = subprocess.run([sys.executable, "-m", "goosedump", "bench", t120_path, "-p", "8", "-n", "2", "-r", "1",
                            "--expert-cache", "1M", "--json"], capture_output=True, text=True)
    assert small.returncode == 0, small.stderr
    st = json.loads(small.stdout)["expert_cache"]
    assert not st["in_place"] and st["slots"] > 0 and st["misses"] > 0 and st["bytes_read"] > 0
    assert 0 < st["belady_hit_rate"] <= 1
    kept = subprocess.run(run + ["--expert-cache", "2M", "--page-cache", "--profile"], capture_output=True, text=True)
    assert kept.returncode == 0, kept.stderr
    out = json.loads(kept.stdout)
    assert out["generated_tokens"] == 3 and out["expert_cache"]["belady_hit_rate"] > 0


def test_prefetch_reads_the_next_layers_experts_ahead(t120_path):
    runs = {}
    for prefetch in (False, True):
        m = goosedump.load(t120_path, options=Options(expert_cache=2 << 20, prefetch=prefetch))
        r = m.generate(PROMPT, max_tokens=10)
        runs[prefetch] = (r.token_ids, m.store.snapshot())
    assert runs[True][0] == runs[False][0]          # timing only: the same tokens
    off, on = runs[False][1], runs[True][1]
    assert off["prefetched"] == 0 and off["predicted"] == 0
    assert on["prefetched"] > 0 and on["prefetch_used"] > 0
    assert on["predicted"] > 0 and 0 < on["prefetch_accuracy"] <= 1
    # a prefetched read the layer then asks for counts as a hit
    assert on["hits"] >= on["prefetch_used"]


def test_eviction_keeps_popular_experts(t120_path):
    _, s = store_for(t120_path, 4)

    def use(experts):
        for e, _ in s.fetch(0, experts):
            s.release(0, e)

    for _ in range(3):
        use([7, 8])              # popular
    use([1, 2])                  # fills the cache: 7, 8, 1, 2
    use([3])                     # evicts a once-used expert, not 7 or 8, though they were used less recently
    misses = s.stats.misses
    use([7, 8])
    assert s.stats.misses == misses


def test_cache_sim_policies_on_a_trace(tmp_path):
    from goosedump.cachesim import read_trace, simulate, write_trace
    rows = [(0, 0, (1, 2)), (1, 0, (1, 3)), (2, 0, (2, 3)), (3, 0, (1, 2)), (4, 0, (4, 1))]
    path = tmp_path / "t.jsonl"
    write_trace(str(path), {"slot_bytes": 100, "k": 2}, rows)
    meta, trace = read_trace(str(path))
    assert meta["slot_bytes"] == 100 and trace == rows
    # 3 slots: misses 1, 2, 3, then 4 (evicting 3); 6 hits
    assert simulate(trace, 3, "lru")["hits"] == 6
    assert simulate(trace, 3, "belady")["hits"] >= simulate(trace, 3, "lfu-decay")["hits"]
    # Belady is an upper bound for every policy on any trace
    import random
    rng = random.Random(0)
    rows = [(t, t % 3, tuple(rng.sample(range(12), 2))) for t in range(300)]
    best = simulate(rows, 6, "belady")["hit_rate"]
    for p in ("lru", "lfu", "lfu-decay"):
        assert simulate(rows, 6, p)["hit_rate"] <= best
    with pytest.raises(ValueError, match="1 slots cannot hold the 2 experts"):
        simulate(rows, 1, "lru")


def _retyped(path, vocab, kinds):
    """The tiny preset with its experts' matrices retyped: kinds(layer,
    piece name) -> a GGMLType, or None to keep the file's."""
    import dataclasses

    def edit(kv, tensors):
        for i, t in enumerate(tensors):
            if "_exps.weight" in t.name:
                kind = kinds(int(t.name.split(".")[1]), t.name)
                if kind is not None:
                    tensors[i] = dataclasses.replace(t, type=kind)
    synth.write_model(path, "tiny", seed=3, vocab=vocab, edit=edit)
    return os.fspath(path)


@pytest.mark.parametrize("name, kinds", [
    # llama-quantize gives ffn_down more bits on some layers: a later layer's piece outgrows layer 0's
    ("layers", lambda layer, name: GGMLType.F16 if layer > 0 else None),
    ("down", lambda layer, name: GGMLType.Q8_0 if layer > 0 and "down" in name else GGMLType.Q4_0),
    # F32 matrices (rows of floats, not biases)
    ("f32", lambda layer, name: GGMLType.F32),
])
def test_streamed_experts_of_any_types_equal_them_in_place(tmp_path, small_vocab, name, kinds):
    """A slot holds every layer's pieces (it had been sized by layer 0's
    alone: a larger later piece ran into the next one, wrong logits or a
    "short read"), and F32 matrices stream as rows (they had been read as
    a bias: a reshape error naming nothing)."""
    path = _retyped(tmp_path / f"{name}.gguf", small_vocab, kinds)
    tokens = [5, 77, 300, 12, 9, 400, 3, 7]
    ref = goosedump.load(path, expert_cache="1G")
    assert ref.store.in_place
    m = goosedump.load(path, expert_cache=1 << 20)
    assert not m.store.in_place and m.store.n_slots >= m.config.n_expert_used
    np.testing.assert_array_equal(m.logits(tokens), ref.logits(tokens))
    largest = max(m.file.tensors[f"blk.{i}.ffn_down_exps.weight"].nbytes for i in range(m.config.n_layer))
    assert m.store.slot_bytes > largest // m.config.n_expert
