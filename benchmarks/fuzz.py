"""Coverage-guided fuzzing of the native boundary with atheris: the GGUF
parser (alone and as a split set's first part), every block format's
kernels against float64, the tokenizer (tests/fuzz_targets.py).

    python benchmarks/fuzz.py --target gguf|gguf-split|kernels|tokenizer [--seconds 60] [--minutes N]

Seeds: the tiny model's files (a whole file, a split set's parts), a few
texts. A finding is saved under tests/fuzz_corpus/TARGET/ (which the test
suite replays) and ends the run with status 1.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
CORPUS = os.path.join(HERE, "..", "tests", "fuzz_corpus")


def seeds(target: str, folder: str) -> tuple[list[bytes], bytes | None]:
    """(seed inputs, the split set's valid second part)."""
    from goosedump import synth
    if target in ("gguf", "gguf-split"):
        vocab = synth.small_vocab()
        whole = os.path.join(folder, "seed.gguf")
        synth.write_model(whole, "tiny", seed=1, vocab=vocab, recipe="q4_k_m")
        split = os.path.join(folder, "seed-split.gguf")
        synth.write_model(split, "tiny", seed=1, vocab=vocab, split_max_size=250_000)
        parts = sorted(p for p in os.listdir(folder) if p.startswith("seed-split") and "-of-" in p)
        read = lambda p: open(os.path.join(folder, p), "rb").read()  # noqa: E731
        if target == "gguf":
            return [open(whole, "rb").read()], None
        return [read(parts[0])], read(parts[1])
    if target == "kernels":
        return [bytes([i, 3, 2, 7]) + bytes(range(256)) * 4 for i in range(16)], None
    return [b"\x00Hello, world! 123 ", "\x00héllo wörld — 日本語".encode(), b"\x02\x00\x05\x41\x01",
            b"\x01\x00\xd8\x41\x00"], None


def main() -> int:
    # libFuzzer's memory limit reads the peak RSS (getrusage), which Linux
    # carries over from the parent through fork and exec: run from a test
    # suite's 2 GB process, a target started past libFuzzer's default 2048 MB
    # limit and was "out of memory" before its first input. The limit is
    # those 2048 MB above what this process inherited.
    inherited_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, choices=["gguf", "gguf-split", "kernels", "tokenizer"])
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--minutes", type=float, default=None, help="run this long instead of --seconds")
    ap.add_argument("--in-child", action="store_true", help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args()
    if not args.in_child:
        # libFuzzer ends its process with C's exit(), past Python's atexit: the
        # run's files (seeds, corpus, the targets' scratch) are removed out here
        work = tempfile.mkdtemp(prefix="goosedump-fuzz-")
        try:
            return subprocess.call([sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--in-child"],
                                   env={**os.environ, "GOOSEDUMP_FUZZ_DIR": work})
        finally:
            shutil.rmtree(work, ignore_errors=True)
    import atheris
    with atheris.instrument_imports():
        import fuzz_targets
    seconds = int(args.minutes * 60) if args.minutes else args.seconds
    work = os.environ["GOOSEDUMP_FUZZ_DIR"]
    corpus_in = os.path.join(work, "corpus")
    os.makedirs(corpus_in)
    seed_list, part2 = seeds(args.target, work)
    for i, s in enumerate(seed_list):
        with open(os.path.join(corpus_in, f"seed{i}"), "wb") as f:
            f.write(s)
    saved = os.path.join(CORPUS, args.target)
    if os.path.isdir(saved):
        for name in os.listdir(saved):
            with open(os.path.join(saved, name), "rb") as src, open(os.path.join(corpus_in, name), "wb") as dst:
                dst.write(src.read())
    tok = None
    if args.target == "tokenizer":
        from goosedump.gguf import GGUFFile
        from goosedump.tokenizer import Tokenizer
        from goosedump import synth
        path = os.path.join(work, "tok.gguf")
        synth.write_model(path, "tiny", seed=1)
        tok = Tokenizer(GGUFFile(path))

    def one(data: bytes) -> None:
        try:
            if args.target == "gguf":
                fuzz_targets.gguf_target(data)
            elif args.target == "gguf-split":
                fuzz_targets.gguf_target(data, part2)
            elif args.target == "kernels":
                fuzz_targets.kernels_target(data)
            else:
                fuzz_targets.tokenizer_target(tok, data)
        except BaseException:
            os.makedirs(saved, exist_ok=True)
            name = hashlib.sha256(data).hexdigest()[:16]
            with open(os.path.join(saved, name), "wb") as f:
                f.write(data)
            print(f"finding saved as tests/fuzz_corpus/{args.target}/{name}", file=sys.stderr)
            raise
    max_len = max(len(s) for s in seed_list) + 4096
    atheris.Setup([sys.argv[0], f"-max_total_time={seconds}", f"-max_len={max_len}", "-print_final_stats=1",
                   f"-artifact_prefix={work}/", f"-rss_limit_mb={2048 + inherited_mb}",
                   "-timeout=20", corpus_in, *rest], one)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())
