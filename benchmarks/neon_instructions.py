"""The NEON int16 products' executed instructions per 32-value block and
token, counted under qemu-aarch64 on this (x86) machine: no ARM machine is
at hand to time them, and the count is what a change of the kernels'
instructions changes. A QEMU plugin (benchmarks/native/qemu_insn_count.c)
counts every guest instruction of a driver (benchmarks/native/neon_count.cpp)
built from the extension's sources with aarch64-linux-gnu-g++; a run of zero
products is subtracted, so the setup does not count. With --against REF the
sources of that git revision are counted too, side by side.

Counted, not timed: on a wide out-of-order ARM core the scalar instructions
of a loop may run beside its vector ones, so fewer instructions need not be
proportionally faster.

usage: python benchmarks/neon_instructions.py [--against REF] [--formats mxfp4,q8_0,...] [--rows N] [--k K]
                                              [--acts i16|f32]
needs: apt-get install g++-aarch64-linux-gnu qemu-user (and gcc for the plugin)
"""
from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "benchmarks" / "native"
sys.path.insert(0, str(ROOT / "tests"))
# the kernel sources and their flags as the NEON tests build them (which check them against CMakeLists.txt)
from test_neon import CXX, NO_CONTRACT, QEMU, SOURCES  # noqa: E402


def build_driver(csrc: Path, out: Path) -> Path:
    """The counting driver linked with csrc's kernels (as CMakeLists.txt
    compiles them: -O3, the row kernels without contraction)."""
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(csrc / f"{n}.cpp", out / f"{n}.o", n in NO_CONTRACT) for n in SOURCES]
    jobs.append((NATIVE / "neon_count.cpp", out / "neon_count.o", False))

    def compile_one(job):
        src, obj, no_contract = job
        flags = ["-std=c++17", "-O3", f"-I{csrc}"] + (["-ffp-contract=off"] if no_contract else [])
        return subprocess.run([CXX, *flags, "-c", str(src), "-o", str(obj)], capture_output=True, text=True)

    with ThreadPoolExecutor(2) as pool:
        for r in pool.map(compile_one, jobs):
            if r.returncode:
                sys.exit(r.stderr)
    exe = out / "neon_count"
    subprocess.run([CXX, "-static", "-pthread", *(str(j[1]) for j in jobs), "-o", str(exe)], check=True)
    return exe


def instructions(plugin: Path, exe: Path, fmt: str, n: int, k: int, t: int, reps: int, acts: str) -> int:
    r = subprocess.run([QEMU, "-plugin", str(plugin), "-d", "plugin", str(exe), fmt, str(n), str(k), str(t),
                        str(reps), acts], capture_output=True, text=True, env={"GOOSEDUMP_ISA": "neon"}, timeout=1800)
    line = [l for l in (r.stdout + r.stderr).splitlines() if l.startswith("instructions ")]
    if r.returncode or not line:
        sys.exit(f"{exe} {fmt}: {r.stderr.strip()}")
    return int(line[0].split()[1])


def per_block(plugin: Path, exe: Path, fmt: str, n: int, k: int, t: int, acts: str) -> float:
    base = instructions(plugin, exe, fmt, n, k, t, 0, acts)
    return (instructions(plugin, exe, fmt, n, k, t, 2, acts) - base) / 2 / (n * k // 32 * t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", metavar="REF", help="a git revision whose kernels are counted too")
    ap.add_argument("--formats", default="mxfp4,q8_0,q4_k,q6_k", help="comma-separated (default %(default)s)")
    ap.add_argument("--rows", type=int, default=1024, help="matrix rows (default %(default)s)")
    ap.add_argument("--k", type=int, default=2816, help="matrix columns, a multiple of 256 (default %(default)s)")
    ap.add_argument("--acts", choices=("i16", "f32"), default="i16",
                    help="the activations' precision, as GOOSEDUMP_ACTIVATIONS (default %(default)s)")
    args = ap.parse_args()
    for tool in (CXX, QEMU, "gcc"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found: apt-get install g++-aarch64-linux-gnu qemu-user gcc")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        plugin = tmp / "libqemu_insn_count.so"
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", str(NATIVE / "qemu_insn_count.c"), "-o", str(plugin)],
                       check=True)
        builds = {"working tree": build_driver(ROOT / "csrc", tmp / "tree")}
        if args.against:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.against, "csrc"], capture_output=True,
                                     check=True).stdout
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                tar.extractall(tmp / "ref", filter="data")
            builds = {args.against: build_driver(tmp / "ref" / "csrc", tmp / "refbuild"), **builds}
        print(f"NEON {'int16' if args.acts == 'i16' else 'fp32'} products, {args.rows} x {args.k}, one thread, qemu-aarch64's default CPU: executed "
              "instructions per 32-value block and token (counted, not timed)")
        names = list(builds)
        print("| format | tokens | " + " | ".join(names) + (" | ratio |" if len(names) == 2 else " |"))
        print("|---" * (2 + len(names) + (len(names) == 2)) + "|")
        for fmt in args.formats.split(","):
            for t in (1, 8):
                counts = [per_block(plugin, builds[b], fmt, args.rows, args.k, t, args.acts) for b in names]
                ratio = f" | {counts[1] / counts[0]:.2f}x" if len(counts) == 2 else ""
                print(f"| {fmt} | {t} | " + " | ".join(f"{c:.1f}" for c in counts) + ratio + " |")


if __name__ == "__main__":
    main()
