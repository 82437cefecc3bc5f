"""GOOSEDUMP_ISA forces the kernels' path, and inspect and bench say which
one runs; a path not known, or one the CPU lacks, is a clear error."""
import os
import subprocess
import sys

import pytest

from goosedump import _kernels


def goosedump(*args, **env):
    return subprocess.run([sys.executable, "-m", "goosedump", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)


@pytest.mark.parametrize("isa", ["generic"] + (["avx2"] if _kernels.cpu_has_avx2() else []))
def test_the_path_forced_is_the_one_reported(tiny_path, isa):
    out = goosedump("inspect", tiny_path, GOOSEDUMP_ISA=isa)
    assert out.returncode == 0 and f"kernels: {isa} on " in out.stdout
    out = goosedump("bench", tiny_path, "-p", "8", "-n", "2", "-r", "1", GOOSEDUMP_ISA=isa)
    assert out.returncode == 0 and f"CPU ({isa})" in out.stdout


def test_auto_is_the_best_the_cpu_has(tiny_path):
    out = goosedump("inspect", tiny_path, "--json", GOOSEDUMP_ISA="auto")
    assert ('"kernels": "avx2"' if _kernels.cpu_has_avx2() else '"kernels": "generic"') in out.stdout


def test_an_unknown_path_is_refused(tiny_path):
    out = goosedump("run", tiny_path, "-p", "hi", "-n", "2", GOOSEDUMP_ISA="neon")
    assert out.returncode == 2 and "GOOSEDUMP_ISA='neon': expected one of auto, generic, avx2" in out.stderr
    assert "Traceback" not in out.stderr
