"""Profiles end to end: run/bench --profile-out write what the engine did,
consistent with the generation and the expert store, and goosedump plot
draws it."""
import json
import os
import subprocess
import sys

import pytest

from goosedump import synth
from goosedump.plot import FILES, validate_profile


@pytest.fixture(scope="module")
def streamed_path(tmp_path_factory, small_vocab):
    """The 120b's routing shape at tiny widths, skewed like a trained router."""
    p = tmp_path_factory.mktemp("profile") / "t120.gguf"
    synth.write_model(p, "tiny-120b", seed=5, vocab=small_vocab, routing="skewed")
    return os.fspath(p)


def goosedump(*args):
    return subprocess.run([sys.executable, "-m", "goosedump", *args], capture_output=True, text=True)


def test_run_profile_out_matches_the_generation(streamed_path, tmp_path):
    out_file = tmp_path / "p.json"
    r = goosedump("run", streamed_path, "--prompt-ids", ",".join(str(i) for i in range(10, 40)), "-n", "12",
                  "--temperature", "0", "--expert-cache", "2M", "--json", "--profile", "--profile-out", str(out_file))
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    prof = json.loads(out_file.read_text())
    validate_profile(prof)
    assert prof == {**res["profile"], "model": streamed_path}
    L, k = prof["n_layer"], prof["n_expert_used"]
    pre, dec = prof["phases"]["prefill"], prof["phases"]["decode"]
    assert pre["tokens"] == 30 - res["cached_tokens"] and dec["tokens"] == len(prof["decode_tokens"]) == 11
    # every token picks k experts in every layer; the heatmap counts them all
    assert pre["routing"]["selections"] == pre["tokens"] * L * k
    assert dec["routing"]["selections"] == dec["tokens"] * L * k
    assert sum(map(sum, prof["routing_counts"])) == (pre["tokens"] + dec["tokens"]) * L * k
    assert len(pre["routing"]["unique_experts_per_layer"]) == L
    # skewed routing: the decode reuses few experts per layer
    assert max(dec["routing"]["unique_experts_per_layer"]) < prof["n_expert"]
    # per-token cache lookups add up to the decode phase's, which add up to the whole run's
    toks = prof["decode_tokens"]
    assert sum(t["hits"] + t["misses"] for t in toks) == dec["expert_cache"]["hits"] + dec["expert_cache"]["misses"]
    assert dec["expert_cache"]["hits"] + pre["expert_cache"]["hits"] == res["expert_cache"]["hits"]
    assert dec["expert_cache"]["misses"] > 0 and 0 < dec["routing"]["hit_rate"] < 1
    assert all(0 <= t["stall_seconds"] <= t["seconds"] for t in toks)
    assert all(abs(t["compute_seconds"] + t["stall_seconds"] - t["seconds"]) < 1e-9 for t in toks)
    # process figures: this run read experts from the file and used CPU
    assert pre["cpu_user_seconds"] + pre["cpu_system_seconds"] > 0
    assert dec["read_chars"] >= dec["expert_cache"]["bytes_read"] > 0
    assert pre["peak_rss_bytes"] > 10 << 20 and dec["peak_rss_bytes"] >= pre["peak_rss_bytes"]


def test_bench_and_plot(streamed_path, tmp_path):
    prof_file = tmp_path / "bench.json"
    r = goosedump("bench", streamed_path, "-p", "16", "-n", "8", "-r", "1", "--expert-cache", "2M",
                  "--profile", "--profile-out", str(prof_file))
    assert r.returncode == 0, r.stderr
    assert "where the time went" in r.stdout and "expert routing:" in r.stdout and "peak RSS" in r.stdout
    prof = json.loads(prof_file.read_text())
    validate_profile(prof)
    assert prof["phases"]["prefill"]["tokens"] == 16 and len(prof["decode_tokens"]) == 8   # tg8: 8 forward passes
    out = goosedump("plot", str(prof_file), "--out", str(tmp_path / "pics"))
    assert out.returncode == 0, out.stderr
    for name in FILES.values():
        png = tmp_path / "pics" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1}')
    out = goosedump("plot", str(bad), "--out", str(tmp_path / "x"))
    assert out.returncode == 2 and str(bad) in out.stderr and "Traceback" not in out.stderr
