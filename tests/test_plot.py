"""Profile pictures: valid PNGs whose axes show the profile's own numbers."""
import copy
import json

import numpy as np
import pytest

from goosedump import plot
from goosedump.plot import figures, plot_profile, validate_profile

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def make_profile(seed=0, n_layer=6, n_expert=16, k=4, n_tokens=25, in_memory=False):
    """A random but valid profile, as `run --profile-out` would write it."""
    rng = np.random.default_rng(seed)
    sel = np.argsort(rng.random((n_tokens + 5, n_layer, n_expert)), axis=-1)[..., :k]
    counts = np.zeros((n_layer, n_expert), dtype=np.int64)
    np.add.at(counts, (np.broadcast_to(np.arange(n_layer)[None, :, None], sel.shape), sel), 1)

    def phase(tokens):
        return {"wall_seconds": float(rng.random()), "cpu_user_seconds": float(rng.random()),
                "cpu_system_seconds": 0.01, "peak_rss_bytes": 3 << 30, "rss_bytes": 2 << 30,
                "major_faults": 12, "minor_faults": 4000, "read_bytes": 1 << 28, "read_chars": 1 << 29,
                "io_available": True, "tokens": tokens,
                "routing": {"selections": tokens * n_layer * k, "unique_pairs": int((counts > 0).sum()),
                            "unique_experts_per_layer": (counts > 0).sum(axis=1).tolist()},
                "expert_cache": None if in_memory else {"slots": 40, "hits": 10, "misses": 5}}
    decode = []
    for i in range(n_tokens):
        seconds = float(rng.uniform(0.02, 0.2))
        stall = 0.0 if in_memory else float(seconds * rng.uniform(0, 0.7))
        hits = 0 if in_memory else int(rng.integers(0, n_layer * k + 1))
        decode.append({"index": i, "token_id": int(rng.integers(0, 200000)), "seconds": seconds,
                       "compute_seconds": seconds - stall, "stall_seconds": stall,
                       "hits": hits, "misses": 0 if in_memory else n_layer * k - hits})
    return {"version": 1, "model": "/models/gpt-oss-20b-mxfp4.gguf",
            "n_layer": n_layer, "n_expert": n_expert, "n_expert_used": k,
            "phases": {"prefill": phase(5), "decode": phase(n_tokens)},
            "routing_counts": counts.tolist(), "decode_tokens": decode}


def check_png(path, fig):
    import matplotlib.image
    with open(path, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE
    img = matplotlib.image.imread(path)
    w, h = fig.get_size_inches() * fig.dpi
    assert img.shape[:2] == (round(h), round(w)) and img.shape[2] in (3, 4)
    # Drawn, not blank: many distinct colours.
    assert len(np.unique(img.reshape(-1, img.shape[2]), axis=0)) > 20


def test_plot_profile_writes_three_pngs(tmp_path):
    profile = make_profile()
    paths = plot_profile(profile, tmp_path)
    assert sorted(p.rsplit("/", 1)[1] for p in paths) == [
        "cache_hit_rate.png", "decode_timeline.png", "expert_heatmap.png"]
    figs = figures(profile)
    for p in paths:
        check_png(p, figs[p.rsplit("/", 1)[1][:-4]])


def test_heatmap_shows_routing_counts():
    profile = make_profile(seed=1)
    fig = figures(profile)["expert_heatmap"]
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("expert", "layer")
    assert "gpt-oss-20b-mxfp4.gguf" in ax.get_title() and "/models" not in ax.get_title()
    data = np.asarray(ax.get_images()[0].get_array())
    assert data.shape == (profile["n_layer"], profile["n_expert"])
    assert np.array_equal(data, profile["routing_counts"])
    assert fig.axes[1].get_ylabel() == "selections"   # the colorbar


def test_timeline_bars_are_the_token_times():
    profile = make_profile(seed=2)
    ax = figures(profile)["decode_timeline"].axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("decode token", "ms")
    compute_bars, stall_bars = ax.containers
    toks = profile["decode_tokens"]
    ms = lambda k: np.array([t[k] for t in toks]) * 1e3
    np.testing.assert_allclose([b.get_height() for b in compute_bars], ms("compute_seconds"))
    np.testing.assert_allclose([b.get_height() for b in stall_bars], ms("stall_seconds"))
    # stacked: stall starts where compute ends
    np.testing.assert_allclose([b.get_y() for b in stall_bars], ms("compute_seconds"))
    np.testing.assert_allclose([b.get_x() + b.get_width() / 2 for b in compute_bars],
                               [t["index"] for t in toks])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["compute", "read stall"]


def test_hit_rate_lines():
    profile = make_profile(seed=3)
    toks = profile["decode_tokens"]
    toks[4]["hits"] = toks[4]["misses"] = 0   # a token that asked nothing: a gap, not a warning
    ax = figures(profile)["cache_hit_rate"].axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("decode token", "hit rate")
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] <= 1.05
    lines = {line.get_label(): line for line in ax.get_lines()}
    hits = np.array([t["hits"] for t in toks], dtype=float)
    asked = np.array([t["hits"] + t["misses"] for t in toks], dtype=float)
    per = lines["per token"].get_ydata()
    assert np.isnan(per[4])
    np.testing.assert_allclose(np.delete(per, 4), np.delete(hits, 4) / np.delete(asked, 4))
    np.testing.assert_allclose(lines["cumulative"].get_ydata(), np.cumsum(hits) / np.cumsum(asked))
    np.testing.assert_array_equal(lines["per token"].get_xdata(), [t["index"] for t in toks])
    assert np.all((lines["cumulative"].get_ydata() >= 0) & (lines["cumulative"].get_ydata() <= 1))


def test_hit_rate_with_experts_in_memory(tmp_path):
    profile = make_profile(seed=4, in_memory=True)
    ax = figures(profile)["cache_hit_rate"].axes[0]
    (line,) = ax.get_lines()
    np.testing.assert_array_equal(line.get_ydata(), np.ones(len(profile["decode_tokens"])))
    assert "experts in memory" in [t.get_text() for t in ax.texts]
    assert len(plot_profile(profile, tmp_path)) == 3


def test_no_decode_tokens(tmp_path):
    profile = make_profile(seed=5, n_tokens=0)
    paths = plot_profile(profile, tmp_path)
    assert len(paths) == 3
    with open(paths[0], "rb") as f:
        assert f.read(8) == PNG_SIGNATURE


def test_validate_names_the_problem():
    good = make_profile(seed=6)
    validate_profile(good)
    cases = [
        (lambda d: d.pop("routing_counts"), r"^routing_counts: missing"),
        (lambda d: d["phases"].pop("decode"), r"^phases\.decode: missing"),
        (lambda d: d["phases"]["prefill"].pop("read_bytes"), r"^phases\.prefill\.read_bytes: missing"),
        (lambda d: d["phases"]["decode"]["routing"].pop("unique_pairs"),
         r"^phases\.decode\.routing\.unique_pairs: missing"),
        (lambda d: d["decode_tokens"][3].pop("stall_seconds"), r"^decode_tokens\[3\]\.stall_seconds: missing"),
        (lambda d: d["decode_tokens"][2].update(hits=-1), r"^decode_tokens\[2\]\.hits: expected an integer"),
        (lambda d: d["decode_tokens"][1].update(compute_seconds=5.0), r"^decode_tokens\[1\]: compute_seconds"),
        (lambda d: d.update(version=2), r"^version: expected 1, got 2"),
        (lambda d: d.update(n_layer=True), r"^n_layer: expected an integer"),
        (lambda d: d["routing_counts"].pop(), r"^routing_counts: expected 6 rows"),
        (lambda d: d["routing_counts"][0].__setitem__(0, 1.5), r"^routing_counts: expected integers"),
        (lambda d: d["phases"]["decode"].update(expert_cache=3), r"^phases\.decode\.expert_cache: expected"),
    ]
    for spoil, message in cases:
        d = copy.deepcopy(good)
        spoil(d)
        with pytest.raises(ValueError, match=message):
            validate_profile(d)


def test_main_reads_validates_and_writes(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(make_profile(seed=7)))
    out = tmp_path / "pictures" / "run1"
    paths = plot.main(path, out)
    assert sorted(p.name for p in out.iterdir()) == sorted(plot.FILES.values())
    assert len(paths) == 3

    bad = make_profile(seed=7)
    del bad["phases"]["prefill"]["tokens"]
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"profile\.json: .*phases\.prefill\.tokens: missing"):
        plot.main(path, out)
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"profile\.json: not a goosedump profile"):
        plot.main(path, out)


def test_out_that_is_a_file_is_named(tmp_path):
    """--out naming an existing file (not a folder) is refused by name,
    before anything is drawn (it had been errno 17's bare 'File exists')."""
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(make_profile(seed=3)))
    taken = tmp_path / "taken.png"
    taken.write_bytes(b"mine")
    with pytest.raises(ValueError, match=r"^--out .*taken\.png: not a folder"):
        plot.main(path, taken)
    assert taken.read_bytes() == b"mine"
