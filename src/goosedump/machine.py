"""What the machine is, for every figure a benchmark prints: the CPU model,
its cores and the instruction sets the kernels care about, from
/proc/cpuinfo (x86's `model name`/`flags`, ARM's `Model`/`Features`)."""
from __future__ import annotations

import os
import platform

ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512vbmi", "avx_vnni", "avx512_bf16", "amx_tile",
             "amx_int8", "amx_bf16", "asimd", "asimddp", "sve")
AMX_NOTE = ("AMX tiles: MXFP4's, Q8_0's, Q4_0's and Q5_0's products of 16 tokens and more (prefill's experts and attention), "
            "the same bits (GOOSEDUMP_AMX=0 keeps them off)")


NO_VBMI_NOTE = ("AVX-512 without VBMI (this CPU lacks it, or GOOSEDUMP_AVX512_VBMI=0): MXFP4's, Q8_0's, Q4_0's and Q5_0's kernels "
                "gather their bytes by qword and word permutes (MXFP4: and shifts), the same bits")


def avx512_without_vbmi() -> bool:
    """Whether this run's AVX-512 kernels take their form without VBMI's byte
    permutes (Cascade Lake, Cooper Lake; GOOSEDUMP_AVX512_VBMI=0 anywhere)."""
    from . import _kernels
    return _kernels.active_impl() == "avx512" and not _kernels.cpu_has_vbmi()


def amx_in_use() -> bool:
    """Whether this run's kernels take AMX's tiles (the AVX-512 path, on a
    CPU and OS that have them, GOOSEDUMP_AMX not 0)."""
    from . import _kernels
    return _kernels.cpu_has_amx() and _kernels.active_impl() == "avx512"


def _cpuinfo() -> tuple[str, set[str]]:
    name, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model") and not name:
                    name = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return name or platform.processor() or "unknown CPU", flags


def cpu_name() -> str:
    return _cpuinfo()[0]


def cpu_description() -> str:
    """'MODEL (N cores; flag flag ...)'."""
    name, flags = _cpuinfo()
    return f"{name} ({os.cpu_count()} cores; {' '.join(f for f in ISA_FLAGS if f in flags) or 'no SIMD flags'})"
