"""The row kernels' fp16 scale conversion stays inline. GCC had left it a
call out of line where it was handed to the scale helpers as a function:
NEON's `half_neon` in every block of most formats (the loops' vector
registers saved and reloaded around each call; one-token Q2_K 85.5 -> 70.8
executed instructions a block once inlined), AVX-512's `half_avx512` once or
twice a Q2_K or Q3_K super-block (an AVX-512 function inside the AVX2
helpers, which cannot inline a wider target). Neither shows in the results
(the same bits either way), only in the code: so each row source is compiled
as CMakeLists.txt compiles it (-O3, no contraction; AArch64's with
aarch64-linux-gnu-g++) and its object's calls are read back."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parent.parent / "csrc"
INSTALL = "apt-get install g++-aarch64-linux-gnu"
# (compiler, disassembler, the call instruction's mnemonic, source)
# (every row source: the AMX path's task scales had called it out of line once a
# super-block of IQ4_XS, the generic superblock_scales with an AVX2 conversion)
BUILDS = [("aarch64-linux-gnu-g++", "aarch64-linux-gnu-objdump", "bl", p.stem) if p.stem == "rows_neon"
          else ("g++", "objdump", "call", p.stem) for p in sorted(CSRC.glob("rows_*.cpp"))]


def called(objdump: str, mnemonic: str, obj: Path) -> list[str]:
    """The demangled names of the functions the object's code calls: a call
    within the object names its target; one outside it (another source's
    function) names the object's own code, its relocation the target."""
    text = subprocess.run([objdump, "-dr", "--no-show-raw-insn", "-C", str(obj)], capture_output=True, text=True,
                          check=True, timeout=300).stdout
    lines = text.splitlines()
    names = []
    for i, line in enumerate(lines):
        m = re.match(rf"\s+[0-9a-f]+:\s+{mnemonic}\s+[0-9a-f]+ <(.+)>$", line)
        if m is None:
            continue
        names.append(m.group(1))
        r = re.match(r"\s+[0-9a-f]+: R_\w+\s+(.+)$", lines[i + 1]) if i + 1 < len(lines) else None
        if r is not None:
            names.append(r.group(1))
    return names


def test_no_row_kernel_calls_an_fp16_conversion(tmp_path):
    assert len(BUILDS) >= 9 and {"rows_avx2_i16", "rows_amx", "rows_neon"} <= {b[3] for b in BUILDS}
    missing = [tool for b in BUILDS for tool in b[:2] if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"{', '.join(sorted(set(missing)))} not found: this test needs `{INSTALL}` (and binutils)")
    procs = []
    for cxx, objdump, mnemonic, name in BUILDS:
        obj = tmp_path / f"{name}.o"
        cmd = [cxx, "-std=c++17", "-O3", "-ffp-contract=off", f"-I{CSRC}", "-c", str(CSRC / f"{name}.cpp"), "-o",
               str(obj)]
        procs.append((objdump, mnemonic, name, obj, subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)))
    # every compiler's pipe read and closed before any failure is reported
    built = [(objdump, mnemonic, name, obj, *p.communicate(timeout=600), p.returncode)
             for objdump, mnemonic, name, obj, p in procs]
    for objdump, mnemonic, name, obj, _, err, code in built:
        assert code == 0, f"{name}.cpp: {err}"
        calls = called(objdump, mnemonic, obj)
        assert calls, f"{name}.o: no calls read back (the disassembly's form changed?)"
        halves = sorted({c for c in calls if re.search(r"half|fp16|f16", c, re.I)})
        assert not halves, f"{name}.o calls an fp16 conversion out of line: {halves}"
