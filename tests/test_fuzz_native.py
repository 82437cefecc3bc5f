"""Coverage-guided fuzzing of the native boundary in CI: each atheris target
of tests/fuzz_targets.py (the GGUF parser alone and as a split set's first
part, every format's kernels against float64, the tokenizer) runs for a few
seconds through benchmarks/fuzz.py, and every saved finding under
tests/fuzz_corpus/ is replayed: none may fail again."""
import gzip
import os
import subprocess
import sys

import pytest

import fuzz_targets

HERE = os.path.dirname(__file__)
SCRIPT = os.path.join(HERE, "..", "benchmarks", "fuzz.py")
CORPUS = os.path.join(HERE, "fuzz_corpus")


def corpus(target: str) -> list[str]:
    folder = os.path.join(CORPUS, target)
    return sorted(os.path.join(folder, f) for f in os.listdir(folder)) if os.path.isdir(folder) else []


def read(path: str) -> bytes:
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        return f.read()


@pytest.mark.parametrize("target", ["gguf", "gguf-split", "kernels", "tokenizer"])
def test_a_short_fuzz_run_finds_nothing(target, tmp_path):
    out = subprocess.run([sys.executable, SCRIPT, "--target", target, "--seconds", "12"], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    runs = [ln for ln in out.stderr.splitlines() if ln.startswith("stat::number_of_executed_units")]
    assert runs and int(runs[0].split(":")[-1]) > 100, out.stderr[-2000:]


@pytest.mark.parametrize("path", corpus("gguf"), ids=os.path.basename)
def test_saved_gguf_findings_stay_fixed(path):
    data = read(path)
    fuzz_targets.gguf_target(data)
    fuzz_targets.run_target(data)          # and end to end, as `goosedump run` opens it


@pytest.mark.parametrize("path", corpus("kernels"), ids=os.path.basename)
def test_saved_kernel_findings_stay_fixed(path):
    fuzz_targets.kernels_target(read(path))


def test_the_corpus_is_there():
    assert len(corpus("gguf")) >= 4
