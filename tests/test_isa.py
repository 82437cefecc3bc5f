"""GOOSEDUMP_ISA forces the kernels' path, and inspect and bench say which
one runs; a path not known, or one the CPU lacks, is a clear error."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from goosedump import _kernels


def goosedump(*args, **env):
    return subprocess.run([sys.executable, "-m", "goosedump", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)


@pytest.mark.parametrize("isa", _kernels.available_impls())
def test_the_path_forced_is_the_one_reported(tiny_path, isa):
    out = goosedump("inspect", tiny_path, GOOSEDUMP_ISA=isa)
    assert out.returncode == 0 and f"kernels: {isa} on " in out.stdout
    out = goosedump("bench", tiny_path, "-p", "8", "-n", "2", "-r", "1", GOOSEDUMP_ISA=isa)
    assert out.returncode == 0 and f"CPU ({isa})" in out.stdout


def test_auto_is_the_best_the_cpu_has(tiny_path):
    """The widest path the CPU runs (AVX-512 measured faster than AVX2 on
    every hot shape, benchmarks/kernel_paths.py)."""
    out = goosedump("inspect", tiny_path, "--json", GOOSEDUMP_ISA="auto")
    best = ("avx512" if _kernels.cpu_has_avx512() else "avx2" if _kernels.cpu_has_avx2()
            else "neon" if _kernels.cpu_has_neon() else "generic")
    assert f'"kernels": "{best}"' in out.stdout and _kernels.active_impl() == best
    assert _kernels.available_impls()[-1] == best


def test_an_unknown_path_is_refused(tiny_path):
    out = goosedump("run", tiny_path, "-p", "hi", "-n", "2", GOOSEDUMP_ISA="sse9")
    assert out.returncode == 2 and "GOOSEDUMP_ISA='sse9': expected one of auto, generic, avx2, avx512, neon" in out.stderr
    assert "Traceback" not in out.stderr


LACKED = [p for p in ("generic", "avx2", "avx512", "neon") if p not in _kernels.available_impls()]


@pytest.mark.parametrize("other", LACKED)
def test_a_path_this_cpu_lacks_is_refused(tiny_path, other):
    out = goosedump("run", tiny_path, "-p", "hi", "-n", "2", GOOSEDUMP_ISA=other)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"GOOSEDUMP_ISA={other!r}: this CPU (" in out.stderr
    assert f"cannot run it; expected one of auto, {', '.join(_kernels.available_impls())}" in out.stderr


@pytest.mark.parametrize("other", LACKED)
def test_the_kernels_refuse_a_path_the_cpu_lacks(other):
    with pytest.raises(ValueError, match=f"impl='{other}': this CPU cannot run it"):
        _kernels.matmul("q8_0", np.zeros((1, 34), np.uint8), np.zeros((1, 32), np.float32),
                        np.zeros((1, 1), np.float32), None, other)


def test_inspect_and_bench_say_when_avx512_runs_without_vbmi(tiny_path):
    """The AVX-512 path takes its form without VBMI's byte permutes on a CPU
    without VBMI (/proc/cpuinfo's flags, Cascade Lake's) or where
    GOOSEDUMP_AVX512_VBMI=0; inspect (text and --json) and bench say so, and
    say nothing of it otherwise (the form with VBMI, or another path)."""
    from goosedump.machine import NO_VBMI_NOTE, _cpuinfo
    has_vbmi = "avx512vbmi" in _cpuinfo()[1]
    for vbmi in ("0", "1"):
        out = goosedump("inspect", tiny_path, "--json", GOOSEDUMP_AVX512_VBMI=vbmi)
        report = json.loads(out.stdout)
        without = report["kernels"] == "avx512" and (vbmi == "0" or not has_vbmi)
        assert report["avx512_without_vbmi"] is without
        text = goosedump("inspect", tiny_path, GOOSEDUMP_AVX512_VBMI=vbmi)
        assert text.returncode == 0 and (NO_VBMI_NOTE in text.stdout) is without
        bench = goosedump("bench", tiny_path, "-p", "8", "-n", "2", "-r", "1", GOOSEDUMP_AVX512_VBMI=vbmi)
        assert bench.returncode == 0 and (NO_VBMI_NOTE in bench.stderr) is without
