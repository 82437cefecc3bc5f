"""What the machine is, for every figure a benchmark prints: the CPU model,
the logical CPUs this process may use and the instruction sets the kernels care about, from
/proc/cpuinfo (x86's `model name`/`flags`, ARM's `Model`/`Features`)."""
from __future__ import annotations

import os
import platform

ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512vbmi", "avx_vnni", "avx512_bf16", "amx_tile",
             "amx_int8", "amx_bf16", "asimd", "asimddp", "sve")
# (the formats as csrc/matmul.h's grouped_acts and byte_codes name them)
AMX_NOTE = ("AMX tiles: the products of 16 tokens and more (prefill's experts and attention) of every block format but "
            "Q2_K, Q3_K and Q6_K (MXFP4 as bf16, the others as int8), the same bits (GOOSEDUMP_AMX=0 keeps them off)")


NO_VBMI_NOTE = ("AVX-512 without VBMI (this CPU lacks it, or GOOSEDUMP_AVX512_VBMI=0): the kernels of every block format "
                "but Q2_K and Q3_K gather their bytes by qword and word permutes (MXFP4: and shifts), the same bits")


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


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity; a container's share),
    not the host's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_description() -> str:
    """'MODEL (N CPUs; flag flag ...)': N logical CPUs this process may use."""
    name, flags = _cpuinfo()
    return f"{name} ({cpu_count()} CPUs; {' '.join(f for f in ISA_FLAGS if f in flags) or 'no SIMD flags'})"
