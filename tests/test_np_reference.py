"""The float64 reference of tests/np_reference.py: itself checked against
transformers, then the engine checked against it on synthetic files in every
recipe and as a split set (the reference reads them with gguf-py, not with
goosedump)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch==2.13.0 is a test dependency")

import goosedump  # noqa: E402
from goosedump import synth  # noqa: E402
from goosedump.recipes import RECIPES  # noqa: E402
from hf_reference import RefConfig, build  # noqa: E402
from np_reference import Reference  # noqa: E402
from test_reference import hf_logits  # noqa: E402

PROMPT = [5, 17, 300, 2, 99, 4, 250, 61, 7, 480, 33, 1]


def test_the_reference_equals_transformers(tmp_path, small_vocab):
    cfg = RefConfig(n_layer=3)
    hf = build(cfg, small_vocab, tmp_path / "m.gguf", seed=4, recipe="q4_0")
    ref = Reference(str(tmp_path / "m.gguf"), fp16_kv=False).logits(PROMPT)
    hf_out = hf_logits(hf, PROMPT)
    assert np.abs(ref - hf_out).max() < 1e-5 * np.abs(hf_out).max()


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_engine_equals_the_reference_on_every_recipe(tmp_path, small_vocab, recipe):
    path = tmp_path / f"{recipe}.gguf"
    synth.write_model(path, "tiny", seed=3, vocab=small_vocab, recipe=recipe)
    ours = goosedump.load(path).logits(PROMPT)
    ref = Reference(str(path)).logits(PROMPT)
    scale = np.abs(ref).max()
    assert np.abs(ours - ref).max() < 4e-4 * scale
    top2 = np.sort(ref, -1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-3 * scale
    assert clear.sum() >= len(PROMPT) // 2
    assert (ours.argmax(-1)[clear] == ref.argmax(-1)[clear]).all()


def test_engine_equals_the_reference_on_a_split_set(tmp_path, small_vocab):
    synth.write_model(tmp_path / "s.gguf", "tiny", seed=3, vocab=small_vocab, recipe="q4_k_m", split_max_size=50_000)
    parts = sorted(tmp_path.glob("s-*-of-*.gguf"))
    assert len(parts) >= 3
    ours = goosedump.load(parts[-1]).logits(PROMPT)     # the last part opens the set too
    ref = Reference(str(parts[0])).logits(PROMPT)
    assert np.abs(ours - ref).max() < 4e-4 * np.abs(ref).max()
