"""The x86 timing tools in benchmarks/native build with the command line
their own header gives (the README points readers to them; one of them had
stopped linking when the kernels' source it includes gained a function),
and mxfp4_tiles, which checks the bits it times, passes its checks in both
AVX2 forms: every token of a tile against its one-token products (batch
invariance), the stretched tiles against each row whole."""
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from goosedump import _kernels

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "benchmarks" / "native"

pytestmark = pytest.mark.skipif(not _kernels.cpu_has_avx2(), reason="the x86 timing tools run AVX2, FMA and F16C code")


def header_command(name: str) -> list[str]:
    """The compile command in a tool's header comment (continued over
    comment lines up to its `-o`), as argv."""
    text = (NATIVE / name).read_text()
    if text.startswith("/*"):
        head = text[2:text.index("*/")].splitlines()
    else:
        head = [line[2:] for line in text.splitlines()[:60] if line.startswith("//")]
    comment = " ".join(line.strip() for line in head)
    found = re.search(r"\b(g\+\+|gcc) (.*?-o \S+)", comment)
    assert found, f"{name}: no compile command in its header"
    return shlex.split(f"{found.group(1)} {found.group(2)}")


TOOLS = ["x86_pipes.c", "mxfp4_cycles.cpp", "format_cycles.cpp", "overlap.cpp", "decode_rows.cpp", "mxfp4_tiles.cpp"]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, tuple[list[str], int, str]]:
    """Every tool built as its header says, the compilers run together (one
    at a time they set this file's wall: decode_rows alone took 83 s): each
    tool's (command, exit status, stderr)."""
    where = tmp_path_factory.mktemp("tools")
    procs = {}
    for name in TOOLS:
        argv = header_command(name)
        out = argv.index("-o") + 1
        argv[out] = str(where / argv[out])
        procs[name] = (argv, subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                              text=True))
    # every compiler's pipe read and closed before any failure is reported
    results = {}
    for name, (argv, p) in procs.items():
        err = p.communicate(timeout=600)[1]
        results[name] = (argv, p.returncode, err)
    return results


def tool(built, name: str) -> Path:
    argv, code, err = built[name]
    assert code == 0, f"{' '.join(argv)}:\n{err[-3000:]}"
    return Path(argv[argv.index("-o") + 1])


@pytest.fixture(scope="module")
def tiles(built) -> Path:
    return tool(built, "mxfp4_tiles.cpp")


@pytest.mark.parametrize("name", TOOLS[:-1])
def test_each_tool_builds_as_its_header_says(name, built):
    assert tool(built, name).is_file()


@pytest.mark.parametrize("halves", ["0", "1"])
def test_the_tiles_tool_builds_and_passes_its_bit_checks(halves, tiles):
    # 32 rows (two tasks of 16), counts on both sides of the stretches'
    # threshold (48 tokens of a 2880-wide row: 270 KB of activations)
    done = subprocess.run([str(tiles), "32", "1", "8", "48"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "GOOSEDUMP_AVX2_HALVES": halves})
    assert done.returncode == 0, done.stderr
    form = "halves'" if halves == "1" else "256-bit"
    assert f"the entry's {form} forms" in done.stdout
    lines = [line for line in done.stdout.splitlines() if "tokens:" in line]
    assert [int(line.split()[0]) for line in lines] == [1, 8, 48]
    assert all(line.endswith("(the same bits)") for line in lines), done.stdout
