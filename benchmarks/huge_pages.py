"""Decode with the weights in 4 KiB pages against 2 MiB pages, side by side
in one process: a fresh copy of the model is written (the page cache then
holds it mostly in the 4 KiB folios its writes made), decoded, re-read into
2 MiB pages (goosedump.residency, what loading does by default) and decoded
again; once per pair, the copy written anew each time. The decodes run
4 KiB, 2 MiB, 4 KiB, 2 MiB, ...: each 2 MiB decode is set against the 4 KiB
decode before it and the one after it (the next pair's), so that neither
side always runs second (the machine's load drifts within minutes).

usage: python benchmarks/huge_pages.py MODEL.gguf [--pairs 3] [--gen 32] [--dir DIR]
(the copy is as large as the model: DIR needs that much free space; it is removed at the end)
"""
import argparse
import os
import shutil
import statistics
import sys
import time

import goosedump
from goosedump.bench import measure
from goosedump.machine import cpu_name
from goosedump.options import Options
from goosedump.residency import mapping_page_sizes


def write_copy(src: str, dst: str) -> float:
    """dst written from src in 64 KiB writes (as a download or a copy writes), synced; seconds taken."""
    t0 = time.perf_counter()
    with open(src, "rb") as f, open(dst, "wb") as g:
        while chunk := f.read(64 << 10):
            g.write(chunk)
        g.flush()
        os.fsync(g.fileno())
    return time.perf_counter() - t0


def decode(m, n_gen: int) -> float:
    """Decode tokens/s after a 16-token prompt (one warm-up first, as `goosedump bench`)."""
    return measure(m, 16, n_gen, reps=1, profile=False, log=lambda _: None)["decode_tokens_per_s"]


def huge_share(m) -> float:
    sizes = [mapping_page_sizes(p.buf) for p in m.file.parts]
    resident = sum(s.resident for s in sizes if s)
    return sum(s.huge for s in sizes if s) / max(1, resident)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--dir", default=None, help="where the copy goes (default: beside the model)")
    args = ap.parse_args()
    folder = args.dir or os.path.dirname(os.path.abspath(args.model))
    need = os.path.getsize(args.model)
    if shutil.disk_usage(folder).free < need + (1 << 30):
        print(f"huge_pages: {folder} has {shutil.disk_usage(folder).free / 2**30:.1f} GiB free, the copy needs "
              f"{need / 2**30:.1f} GiB", file=sys.stderr)
        return 2
    copy = os.path.join(folder, "huge-pages-bench-copy.gguf")
    print(f"CPU: {cpu_name()}; {args.model}, decode {args.gen} tokens after 16, default threads")
    smalls, huges = [], []
    try:
        for pair in range(args.pairs):
            secs = write_copy(args.model, copy)
            m = goosedump.load(copy, options=Options.from_env(prompt_cache="off", huge_pages=False))
            m.transformer
            share_small, small = huge_share(m), decode(m, args.gen)
            t0 = time.perf_counter()
            m.reread_in_huge_pages()
            reread = time.perf_counter() - t0
            share_huge, huge = huge_share(m), decode(m, args.gen)
            m.close()
            smalls.append(small)
            huges.append(huge)
            print(f"pair {pair + 1}: copy written in {secs:.0f} s; {100 * share_small:3.0f}% in 2 MiB pages: "
                  f"{small:.2f} tok/s; re-read in {reread:.0f} s, {100 * share_huge:3.0f}% in 2 MiB pages: "
                  f"{huge:.2f} tok/s; {huge / small:.2f}x", flush=True)
    finally:
        if os.path.exists(copy):
            os.remove(copy)
    # each 2 MiB decode against its neighbours: the 4 KiB one before it and after it
    ratios = [h / s for i, h in enumerate(huges) for s in smalls[i:i + 2]]
    print(f"decode, 2 MiB against 4 KiB pages ({len(ratios)} neighbouring pairs): "
          f"median {statistics.median(ratios):.2f}x "
          f"({min(ratios):.2f} .. {max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
