"""--expert-cache auto: the rule, on made-up machines (cgroup files written
here), and what a real load decides."""
import os

import pytest

from goosedump import budget
from goosedump.budget import AUTO, MARGIN_BYTES, MARGIN_SHARE, auto_budget, expert_cache_budget

GiB, MiB = 1 << 30, 1 << 20


def test_auto_is_the_default_and_a_spelling():
    assert expert_cache_budget(None, {}) == AUTO
    assert expert_cache_budget("auto", {}) == AUTO and expert_cache_budget("AUTO", {}) == AUTO
    assert expert_cache_budget(None, {"GOOSEDUMP_EXPERT_CACHE_SIZE": "auto"}) == AUTO
    assert expert_cache_budget("64G", {}) == 64 * GiB          # beyond the old 16G cap


def margin(available):
    return MARGIN_BYTES + int(MARGIN_SHARE * available)


def test_experts_that_fit_stay_in_memory():
    # the 20b's shape: 9.5 GiB of experts, 1.8 GiB dense, 12.7 MiB slots, on a 24 GiB machine
    slot = int(12.67 * MiB)
    a = auto_budget(768 * slot, slot, 2 * GiB, 96 * slot, 4 * slot, available=22 * GiB, source="test")
    assert a.in_memory and a.budget == 768 * slot and "experts in memory" in a.note and a.warning is None


def test_experts_that_do_not_fit_get_the_room_left():
    slot = int(12.67 * MiB)
    avail = 8 * GiB                     # the 120b (4608 slots) under an 8 GiB limit
    a = auto_budget(4608 * slot, slot, 2 * GiB, 144 * slot, 4 * slot, available=avail, source="test")
    room = avail - 2 * GiB - margin(avail)
    assert not a.in_memory and a.budget == room // slot * slot and a.budget > 144 * slot
    assert a.warning is None and "streaming" in a.note


def test_a_budget_under_one_tokens_experts_warns_with_the_way_out():
    slot = int(12.67 * MiB)
    a = auto_budget(4608 * slot, slot, 2 * GiB, 144 * slot, 4 * slot, available=4 * GiB, source="test")
    assert a.budget < 144 * slot and a.warning is not None
    assert "hit rate near 0" in a.warning and budget.format_bytes(288 * slot) in a.warning
    tiny = auto_budget(4608 * slot, slot, 2 * GiB, 144 * slot, 4 * slot, available=1 * GiB, source="test")
    assert tiny.budget == 4 * slot            # never below what one token's layer needs


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_cgroup_v1_limit_counts_reclaimable_cache(tmp_path):
    root, proc = tmp_path / "cg", tmp_path / "self-cgroup"
    write(str(proc), "12:memory:/job\n11:cpu:/job\n")
    d = root / "memory" / "job"
    write(str(d / "memory.limit_in_bytes"), str(8 * GiB))
    write(str(d / "memory.usage_in_bytes"), str(5 * GiB))
    write(str(d / "memory.stat"), f"cache 1\ntotal_inactive_file {2 * GiB}\ntotal_active_file {GiB}\n")
    free, where = budget._cgroup_available(str(root), str(proc))
    assert free == 6 * GiB and where.endswith("memory.limit_in_bytes")


def test_cgroup_v2_and_unlimited(tmp_path):
    root, proc = tmp_path / "cg", tmp_path / "self-cgroup"
    write(str(proc), "0::/user.slice/job\n")
    d = root / "user.slice" / "job"
    write(str(d / "memory.max"), str(4 * GiB))
    write(str(d / "memory.current"), str(3 * GiB))
    write(str(d / "memory.stat"), f"inactive_file {GiB}\nactive_file 0\n")
    assert budget._cgroup_available(str(root), str(proc))[0] == 2 * GiB
    write(str(d / "memory.max"), "max\n")
    assert budget._cgroup_available(str(root), str(proc)) is None


def test_a_parents_limit_counts_where_the_leaf_has_none(tmp_path):
    """A limit on a slice or a pod, its children left unlimited: v2's
    leaf with memory.max "max" and v1's unlimited leaf had read as no limit
    at all (auto then kept experts in memory past the parent's limit)."""
    root, proc = tmp_path / "cg", tmp_path / "self-cgroup"
    write(str(proc), "0::/user.slice/session.scope\n")
    parent, leaf = root / "user.slice", root / "user.slice" / "session.scope"
    write(str(parent / "memory.max"), str(4 * GiB))
    write(str(parent / "memory.current"), str(3 * GiB))
    write(str(parent / "memory.stat"), "inactive_file 0\nactive_file 0\n")
    write(str(leaf / "memory.max"), "max\n")
    write(str(leaf / "memory.current"), str(GiB))
    free, where = budget._cgroup_available(str(root), str(proc))
    assert free == GiB and where == str(parent / "memory.max")
    write(str(leaf / "memory.max"), str(GiB // 2))            # the tightest room wins
    assert budget._cgroup_available(str(root), str(proc))[1] == str(leaf / "memory.max")
    v1, proc1 = tmp_path / "v1", tmp_path / "self-cgroup-v1"
    write(str(proc1), "7:memory:/p/leaf\n")
    write(str(v1 / "memory" / "p" / "memory.limit_in_bytes"), str(4 * GiB))
    write(str(v1 / "memory" / "p" / "memory.usage_in_bytes"), str(GiB))
    write(str(v1 / "memory" / "p" / "leaf" / "memory.limit_in_bytes"), str(1 << 63))
    assert budget._cgroup_available(str(v1), str(proc1))[0] == 3 * GiB


def test_available_memory_is_at_most_memavailable():
    avail, where = budget.available_memory()
    with open("/proc/meminfo") as f:
        meminfo = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    assert 0 < avail <= meminfo["MemAvailable"] * 1.05 and where


def test_a_real_load_decides_and_says_so(tiny_path):
    import goosedump
    m = goosedump.load(tiny_path)
    assert m.store.in_place and "experts in memory" in m.budget_note
    assert m.expert_budget >= m.layout.n_expert_slots * m.layout.expert_slot_bytes
    from goosedump.options import Options
    small = goosedump.load(tiny_path, options=Options.from_env(expert_cache="1M"))
    assert not small.store.in_place and small.budget_note is None     # 1M holds many tokens' experts


def test_a_budget_under_one_tokens_experts_is_warned_of(tmp_path, small_vocab):
    import goosedump
    from goosedump import synth
    from goosedump.options import Options
    path = tmp_path / "t120.gguf"
    synth.write_model(path, "tiny-120b", seed=1, vocab=small_vocab)
    per_token = None
    for size, warned in (("2M", True), ("16M", False)):
        m = goosedump.load(path, options=Options.from_env(expert_cache=size))
        c = m.config
        per_token = c.n_expert_used * c.n_layer * m.layout.expert_slot_bytes     # 36 x 4 x 48 KiB = 6.75 MiB
        assert m.expert_budget == int(size[:-1]) << 20
        assert (m.budget_note is not None and "less than one token's experts" in m.budget_note) == warned
    assert 2 << 20 < per_token < 16 << 20


def test_auto_counts_every_kv_cache_a_server_keeps(tiny_path):
    """serve keeps a KV cache per request it decodes at once (--max-batch):
    auto counts them all (it had counted one)."""
    import goosedump
    from goosedump.layout import auto_expert_budget, estimate_memory
    m = goosedump.load(tiny_path)
    c, lay = m.config, m.layout
    mem = estimate_memory(c, lay, 0, 4096)
    experts = lay.n_expert_slots * lay.expert_slot_bytes
    # room for the experts beside one KV cache (and auto's margin), not beside eight
    need = mem.dense + mem.kv_cache + mem.scratch + experts + budget.MARGIN_BYTES
    room = int(need / (1 - budget.MARGIN_SHARE)) + 4096
    assert mem.kv_cache * 7 > 2 * 4096     # (more than the slack room leaves)
    assert auto_expert_budget(c, lay, 4096, available=room, source="test").in_memory
    assert not auto_expert_budget(c, lay, 4096, available=room, source="test", kv_caches=8).in_memory
