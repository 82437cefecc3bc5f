"""goosedump and llama.cpp's own tools on the same files, through llama.cpp's
binaries (built from the source in llama-cpp-python's sdist; see the README):

1. recipes: goosedump's recipes (goosedump.recipes) against llama-quantize's
   own choice of every tensor's type (`--dry-run` on SOURCE, each ftype);
2. load: llama-completion loads each synthetic recipe file goosedump writes
   (tiny, from SOURCE's preset) and generates a few tokens;
3. tools: files made by llama-quantize (--allow-requantize, every ftype) and
   llama-gguf-split from a tiny synthetic model, read by goosedump and
   compared with the float64 reference of tests/np_reference.py (which reads
   them with gguf-py): the largest logit difference and the greedy tokens
   where the reference's margin is clear.

Not part of the test suite (building llama.cpp takes long on 2 cores).

usage: python benchmarks/llamacpp_check.py [--bin DIR] [--source synth-20b.gguf] [--work DIR]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
DEFAULT_BIN = os.path.expanduser("~/.cache/goosedump/llama.cpp/build/bin")
FTYPES = {"q4_k_m": "Q4_K_M", "q5_k_m": "Q5_K_M", "q6_k": "Q6_K", "q3_k_m": "Q3_K_M", "q2_k": "Q2_K",
          "iq4_xs": "IQ4_XS", "q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1", "q5_0": "Q5_0", "mxfp4": "MXFP4_MOE"}
PROMPT = [976, 4853, 19705, 68347, 26, 5, 300, 1000, 20000, 77]


def check_recipes(binary: str, source: str) -> bool:
    from goosedump.gguf import GGUFFile
    from goosedump.recipes import RECIPES, tensor_type
    f = GGUFFile(source)
    n_layer = 1 + max(int(n.split(".")[1]) for n in f.tensors if n.startswith("blk."))
    n_expert = f.tensors["blk.0.ffn_gate_exps.weight"].dims[2]
    n_gqa = f.tensors["blk.0.attn_q.weight"].dims[1] // f.tensors["blk.0.attn_k.weight"].dims[1]
    ok = True
    for recipe, ftype in FTYPES.items():
        p = subprocess.run([binary, "--dry-run", "--allow-requantize", source, ftype], capture_output=True, text=True, errors="replace")
        theirs = {}
        for line in (p.stdout + p.stderr).splitlines():
            m = re.search(r"\]\s+(\S+)\s+- \[.*type =\s+(\w+),.*?(?:\((\w+)\))?$", line)
            if m:
                theirs[m.group(1)] = (m.group(3) or m.group(2)).upper()
        bad = []
        for name, t in f.tensors.items():
            mine = tensor_type(recipe, name, t.dims, n_layer, n_expert, n_gqa)
            if mine is None or (RECIPES[recipe][2] == "mxfp4" and "_exps." in name):
                continue   # vectors; the experts the published K-quants keep MXFP4
            if theirs.get(name) != mine.name:
                bad.append(f"{name}: llama-quantize {theirs.get(name)}, goosedump {mine.name}")
        ok &= not bad and len(theirs) == len(f.tensors)
        print(f"  {recipe:7s} ({ftype}): {len(theirs)} tensors, {len(bad)} differ" + (f": {bad[:3]}" if bad else ""))
    return ok


def check_load(binary: str, folder: str) -> bool:
    from goosedump import synth
    from goosedump.recipes import RECIPES
    ok = True
    for recipe in RECIPES:
        path = os.path.join(folder, f"tiny-{recipe}.gguf")
        synth.write_model(path, "tiny", seed=1, recipe=recipe)
        p = subprocess.run([binary, "-m", path, "-p", "The quick brown fox", "-n", "8", "--temp", "0", "-no-cnv",
                            "-t", "2", "--no-warmup"], capture_output=True, text=True, errors="replace", timeout=300)
        gen = re.search(r"eval time =.*?/\s+(\d+) runs", p.stderr)
        good = p.returncode == 0 and gen is not None
        ok &= good
        print(f"  {recipe:7s}: {'loads and generates' if good else 'FAILED: ' + p.stderr[-300:]}")
    return ok


def compare(path: str) -> tuple[float, int, int]:
    """(largest logit difference / largest logit, greedy tokens equal, tokens
    with a clear margin) between goosedump and the float64 reference."""
    import goosedump
    from np_reference import Reference
    ours = goosedump.load(path).logits(PROMPT)
    ref = Reference(path).logits(PROMPT)
    scale = np.abs(ref).max()
    top2 = np.sort(ref, -1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-3 * scale
    return float(np.abs(ours - ref).max() / scale), int((ours.argmax(-1)[clear] == ref.argmax(-1)[clear]).sum()), \
        int(clear.sum())


def check_tools(bindir: str, folder: str) -> bool:
    from goosedump import synth
    src = os.path.join(folder, "tools-f16.gguf")
    synth.write_model(src, "tiny", seed=2, recipe="f16")
    ok = True
    made = []
    for ftype in list(FTYPES.values()) + ["F16", "BF16"]:
        out = os.path.join(folder, f"lq-{ftype}.gguf")
        p = subprocess.run([os.path.join(bindir, "llama-quantize"), "--allow-requantize", src, out, ftype, "2"],
                           capture_output=True, text=True, errors="replace")
        if p.returncode != 0:
            print(f"  llama-quantize {ftype} FAILED: {p.stderr[-300:]}")
            ok = False
            continue
        made.append((f"llama-quantize {ftype}", out))
    p = subprocess.run([os.path.join(bindir, "llama-gguf-split"), "--split-max-tensors", "20",
                        os.path.join(folder, "lq-Q4_K_M.gguf"), os.path.join(folder, "lsplit")],
                       capture_output=True, text=True, errors="replace")
    if p.returncode == 0:
        made.append(("llama-gguf-split of the Q4_K_M file", os.path.join(folder, "lsplit-00001-of-00004.gguf")))
    else:
        ok = False
        print(f"  llama-gguf-split FAILED: {p.stderr[-300:]}")
    for what, path in made:
        try:
            err, same, clear = compare(path)
            good = err < 4e-4 and same == clear
            ok &= good
            print(f"  {what:40s}: max |dlogit| {err:.1e} of the largest, greedy equal {same}/{clear} "
                  f"clear-margin positions{'' if good else '  MISMATCH'}")
        except Exception as e:   # report and go on
            ok = False
            print(f"  {what:40s}: ERROR {type(e).__name__}: {e}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.environ.get("LLAMA_BIN", DEFAULT_BIN), help="llama.cpp's build/bin")
    ap.add_argument("--source", help="a gpt-oss GGUF whose shapes the recipe check uses (e.g. the synthetic 20b)")
    ap.add_argument("--work", default=None, help="a folder for the files made (default: a temporary one)")
    args = ap.parse_args()
    folder = args.work or tempfile.mkdtemp(prefix="goosedump-llamacpp-")
    os.makedirs(folder, exist_ok=True)
    ok = True
    print("1. recipes against llama-quantize --dry-run:")
    from goosedump import synth
    tiny = os.path.join(folder, "tiny-f16.gguf")
    synth.write_model(tiny, "tiny", seed=1, recipe="f16")
    for source in [tiny] + ([args.source] if args.source else []):
        print(f" {source}:")
        ok &= check_recipes(os.path.join(args.bin, "llama-quantize"), source)
    print("2. llama.cpp loads every recipe goosedump writes:")
    ok &= check_load(os.path.join(args.bin, "llama-completion"), folder)
    print("3. files made by llama.cpp's tools, goosedump against the float64 reference:")
    ok &= check_tools(args.bin, folder)
    print("all checks passed" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
