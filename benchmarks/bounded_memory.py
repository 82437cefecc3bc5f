"""goosedump and llama.cpp under a memory limit, side by side, against the disk's
own speed.

In one run:
1. the disk: random reads of expert-sized blocks from the model file
   (O_DIRECT, page cache dropped) with 1, 2, 4 and 8 reads in flight: GB/s;
2. goosedump inside a memory cgroup (v1 `memory.limit_in_bytes`, or v2
   `memory.max`; both count the page cache) for each expert cache budget
   (default: auto, 2G, 4G, 6G), page cache dropped first: prefill of a
   prompt of random ids and greedy decode, with bytes read per token, hit
   rate (demand and Belady's on the same requests), read stall, prefetch used
   and wasted, major page faults per token (the dense weights' pages taken
   back and read again), peak memory as the cgroup counts it, and whether the
   tokens are the same at every budget;
3. llama.cpp (`llama-bench`, weights memory-mapped, no repacking: its
   repacking copies the weights into anonymous memory and is killed under
   such limits) in the same cgroup: prefill and decode tok/s, peak memory.

The decode bound is the bytes a token must read at the achieved hit rate
over the bandwidth at the store's number of reads in flight. Needs root
(cgroups, drop_caches).

usage: python benchmarks/bounded_memory.py MODEL.gguf [--limit 8G] [--budgets auto,2G,4G,6G]
           [--prompt-tokens 256] [--gen 16] [--llama-gen 4] [--threads 2] [--llama-bench PATH]
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import resource
import subprocess
import sys
import threading
import time
from goosedump.machine import cpu_name

HERE = os.path.dirname(os.path.abspath(__file__))
V1 = "/sys/fs/cgroup/memory"
V2 = "/sys/fs/cgroup"


class Cgroup:
    """A memory cgroup with a limit; processes join it before exec."""

    def __init__(self, name: str, limit: int):
        if os.path.exists(os.path.join(V1, "memory.limit_in_bytes")):
            self.path, self.v2 = os.path.join(V1, name), False
        elif os.path.exists(os.path.join(V2, "cgroup.controllers")):
            self.path, self.v2 = os.path.join(V2, name), True
        else:
            raise SystemExit("no memory cgroup controller (v1 or v2) is mounted")
        os.makedirs(self.path, exist_ok=True)
        self._write("memory.max" if self.v2 else "memory.limit_in_bytes", str(limit))
        if not self.v2:
            try:   # no swap either, where the kernel accounts it
                self._write("memory.memsw.limit_in_bytes", str(limit))
            except OSError:
                pass

    def _write(self, f: str, value: str) -> None:
        with open(os.path.join(self.path, f), "w") as fh:
            fh.write(value)

    def join(self) -> None:   # in the child, before exec
        with open(os.path.join(self.path, "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))

    def peak(self) -> int:
        with open(os.path.join(self.path, "memory.peak" if self.v2 else "memory.max_usage_in_bytes")) as fh:
            return int(fh.read())

    def remove(self) -> None:
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)


def drop_page_cache() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1")




# --- 1. the disk ------------------------------------------------------------------

def expert_ranges(path: str) -> tuple[list[tuple[int, int, int]], int, list[str]]:
    """(part index, offset, bytes) of every expert tensor of the model's file
    set, one expert's slot size, the files."""
    import goosedump
    from goosedump.layout import is_expert_tensor
    m = goosedump.load(path)
    ranges = [(t.part, t.offset, t.nbytes) for t in m.file.tensors.values() if is_expert_tensor(t.name)]
    return ranges, m.layout.expert_slot_bytes, [p.path for p in m.file.parts]


def disk_bandwidth(path: str, depths=(1, 2, 4, 8), total: int = 3 << 30) -> dict[int, float]:
    """GB/s of random O_DIRECT reads of one expert's size, at each number of
    reads in flight (threads, each with its own aligned buffer)."""
    ranges, slot, parts = expert_ranges(path)
    block = (slot // 4096) * 4096 or 4096
    fds = [os.open(p, os.O_RDONLY | getattr(os, "O_DIRECT", 0)) for p in parts]
    sizes = [os.fstat(fd).st_size for fd in fds]
    out = {}
    try:
        for depth in depths:
            drop_page_cache()
            rng = random.Random(depth)
            n = total // block
            jobs = []
            for _ in range(n):          # a random expert-sized, page-aligned read inside the experts' bytes
                part, off, size = rng.choice(ranges)
                start = (off + rng.randrange(0, max(1, size - block))) // 4096 * 4096
                start = min(start, (sizes[part] - block) // 4096 * 4096)
                jobs.append((part, start))
            lock = threading.Lock()

            def reader():
                buf = mmap.mmap(-1, block)
                while True:
                    with lock:
                        if not jobs:
                            return
                        part, start = jobs.pop()
                    os.preadv(fds[part], [buf], start)
            t0 = time.perf_counter()
            threads = [threading.Thread(target=reader) for _ in range(depth)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            out[depth] = n * block / (time.perf_counter() - t0) / 1e9
    finally:
        for fd in fds:
            os.close(fd)
    return out


# --- 2, 3. the engines in a cgroup --------------------------------------------------------

def child_goosedump(args) -> dict:
    import goosedump
    from goosedump.options import Options
    ids = json.loads(args.ids)
    t_load = time.perf_counter()
    import dataclasses
    options = Options.from_env(expert_cache=args.budget, threads=args.threads)
    if args.pass_tokens:
        options = dataclasses.replace(options, prefill_tokens=args.pass_tokens)
    model = goosedump.load(args.model, n_ctx=len(ids) + args.gen + 1, options=options)
    model.transformer
    t_load = time.perf_counter() - t_load
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    gen = model.generate_stream(ids, max_tokens=args.gen, ignore_eos=True, profile=True)
    first = None
    faults_prefill = None
    for _ in gen.events():
        if first is None:
            first = time.perf_counter()
            faults_prefill = resource.getrusage(resource.RUSAGE_SELF).ru_majflt - ru0.ru_majflt
    r = gen.result
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    phases = r.profile["phases"]
    dec = phases["decode"]["expert_cache"] or {"bytes_read": 0, "hits": 0, "misses": 0}
    return {"decode_bytes": dec["bytes_read"], "decode_hits": dec["hits"], "decode_misses": dec["misses"],
            "prefill_bytes": (phases["prefill"]["expert_cache"] or {"bytes_read": 0})["bytes_read"],"load_s": t_load, "prefill_s": r.prefill_seconds, "decode_s": r.decode_seconds,
            "n_prompt": r.prompt_tokens, "n_decode": max(1, r.generated_tokens - 1), "tokens": r.token_ids,
            "budget_bytes": model.expert_budget, "budget_note": model.budget_note,
            "majflt_prefill": faults_prefill, "majflt_decode": ru1.ru_majflt - ru0.ru_majflt - (faults_prefill or 0),
            "expert_cache": r.expert_cache}


def in_cgroup(cmd: list[str], limit: int, timeout: int) -> tuple[subprocess.CompletedProcess | None, int, str]:
    drop_page_cache()
    cg = Cgroup(f"goosedump-bench-{os.getpid()}", limit)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", preexec_fn=cg.join,
                           timeout=timeout)
        return p, cg.peak(), ""
    except subprocess.TimeoutExpired:
        return None, cg.peak(), f"timed out after {timeout} s"
    finally:
        cg.remove()


def run_goosedump(args, ids, budget: str, limit: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), args.model, "--child", "--gen", str(args.gen),
           "--threads", str(args.threads), "--ids", json.dumps(ids), "--budget", budget,
           "--pass-tokens", str(args.pass_tokens)]
    p, peak, err = in_cgroup(cmd, limit, args.timeout)
    if p is None or p.returncode != 0:
        return {"error": err or f"exit {p.returncode}: {p.stderr.strip()[-300:]}", "peak_bytes": peak}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r.update(peak_bytes=peak, prefill_tps=r["n_prompt"] / r["prefill_s"], decode_tps=r["n_decode"] / r["decode_s"])
    return r


def run_llamacpp(args, limit: int) -> dict:
    out = {}
    peak = 0
    for test, extra in (("prefill", ["-p", str(args.prompt_tokens), "-n", "0"]),
                        ("decode", ["-p", "0", "-n", str(args.llama_gen)])):
        cmd = [args.llama_bench, "-m", args.model, "-t", str(args.threads), "-r", "1", "-o", "json",
               "-lm", "mmap", "--repack", "0", *extra]
        f0 = resource.getrusage(resource.RUSAGE_CHILDREN).ru_majflt
        p, pk, err = in_cgroup(cmd, limit, args.timeout)
        peak = max(peak, pk)
        if p is None or p.returncode != 0:
            out[test + "_error"] = err or f"exit {p.returncode}: {p.stderr.strip()[-300:]}"
            continue
        out[test + "_tps"] = float(json.loads(p.stdout)[0]["avg_ts"])
        out[test + "_majflt"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_majflt - f0
    out["peak_bytes"] = peak
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--limit", default="8G", help="the memory cgroup's limit (default 8G)")
    ap.add_argument("--budgets", default="auto,2G,4G,6G", help="goosedump expert cache budgets, comma-separated")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--gen", type=int, default=16, help="goosedump's decoded tokens (default 16)")
    ap.add_argument("--llama-gen", type=int, default=4, help="llama.cpp's decoded tokens (default 4: it is slow)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH"))
    ap.add_argument("--skip-disk", action="store_true")
    ap.add_argument("--skip-llama", action="store_true")
    ap.add_argument("--pass-tokens", type=int, default=0,
                    help="tokens a prefill pass takes layer by layer (default: goosedump's, 4096; 128 is the "
                         "batch-by-batch prefill)")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--ids")
    ap.add_argument("--budget")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child_goosedump(args)))
        return 0

    import numpy as np

    import goosedump
    from goosedump.budget import format_bytes, parse_size
    limit = parse_size(args.limit, "--limit")
    m = goosedump.load(args.model)
    normal = [i for i in range(m.config.n_vocab) if i not in m.tokenizer.special_ids]
    ids = np.random.default_rng(0).choice(normal, args.prompt_tokens).tolist()
    print(f"CPU: {cpu_name()} ({os.cpu_count()} cores); {os.path.basename(args.model)} "
          f"({len(m.file.parts)} file(s), {format_bytes(sum(p.size for p in m.file.parts))}); memory cgroup limit "
          f"{args.limit}; {args.prompt_tokens}-token prompt; {args.threads} threads; prefill pass "
          f"{args.pass_tokens or m.options.prefill_tokens} tokens", flush=True)
    read_threads = int(os.environ.get("GOOSEDUMP_READ_THREADS", "4"))
    bw = {}
    if not args.skip_disk:
        bw = disk_bandwidth(args.model)
        print("disk, random expert-sized O_DIRECT reads: " +
              ", ".join(f"{d} in flight {v:.2f} GB/s" for d, v in bw.items()), flush=True)
    rows = []
    for b in [x.strip() for x in args.budgets.split(",")]:
        r = run_goosedump(args, ids, b, limit)
        r["budget"] = b
        rows.append(r)
        if "error" in r:
            print(f"goosedump --expert-cache {b}: {r['error']}", flush=True)
            continue
        c = r["expert_cache"]
        per_token = c["bytes_read"] / max(1, r["n_prompt"] + r["n_decode"])
        print(f"goosedump --expert-cache {b} ({format_bytes(r['budget_bytes'])}): prefill {r['prefill_tps']:.2f} "
              f"tok/s ({r['prefill_s']:.1f} s), decode {r['decode_tps']:.3f} tok/s, hit rate "
              f"{100 * c['hit_rate']:.1f}% (demand {100 * c.get('demand_hit_rate', c['hit_rate']):.1f}%, Belady "
              f"{100 * c.get('belady_hit_rate', 0):.1f}%), read {c['bytes_read'] / 1e9:.1f} GB, stall "
              f"{c['stall_seconds']:.1f} s, prefetch {c['prefetched']} read / {c['prefetch_used']} used / "
              f"{c.get('prefetch_wasted', 0)} wasted, major faults {r['majflt_prefill']} prefill + "
              f"{r['majflt_decode']} decode, peak {format_bytes(r['peak_bytes'])}", flush=True)
    good = [r for r in rows if "error" not in r]
    same = len({tuple(r["tokens"]) for r in good}) <= 1
    print(f"tokens equal at every budget: {'yes' if same else 'NO'} ({len(good)} runs)")
    lc = None
    if args.llama_bench and os.path.exists(args.llama_bench) and not args.skip_llama:
        lc = run_llamacpp(args, limit)
        print(f"llama.cpp (mmap, no repack): prefill {lc.get('prefill_tps', float('nan')):.3f} tok/s, decode "
              f"{lc.get('decode_tps', float('nan')):.4f} tok/s, peak {format_bytes(lc['peak_bytes'])} "
              f"{lc.get('prefill_error', '')} {lc.get('decode_error', '')}", flush=True)
    print(f"\n| engine | budget | prefill tok/s | decode tok/s | hit rate | bytes read / decode token | "
          f"the probe's bound | of that bound | major faults / decode token | peak (cgroup) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in good:
        # decode alone: the bytes its tokens read, its hit rate; the bound: those bytes at the disk's speed
        # with the store's reads in flight
        # (decode runs one step a token after the first, which prefill's step gives)
        tok_bytes = r["decode_bytes"] / r["n_decode"]
        asked = r["decode_hits"] + r["decode_misses"]
        gbs = bw.get(read_threads) or max(bw.values(), default=0)
        bound = gbs * 1e9 / tok_bytes if tok_bytes and gbs else float("inf")
        r["decode_bound_tps"] = bound
        print(f"| goosedump | {r['budget']} ({format_bytes(r['budget_bytes'])}) | {r['prefill_tps']:.2f} | "
              f"{r['decode_tps']:.3f} | {100 * r['decode_hits'] / asked if asked else 100:.1f}% | "
              f"{format_bytes(tok_bytes)} | {bound:.3f} tok/s | "
              f"{100 * r['decode_tps'] / bound if bound != float('inf') else 0:.0f}% | "
              f"{r['majflt_decode'] / r['n_decode']:.1f} | {format_bytes(r['peak_bytes'])} |")
    if lc:
        print(f"| llama.cpp | mmap | {lc.get('prefill_tps', float('nan')):.3f} | {lc.get('decode_tps', float('nan')):.4f}"
              f" | | | | | {lc.get('decode_majflt', 0) / max(1, args.llama_gen):.0f} | {format_bytes(lc['peak_bytes'])} |")
        for r in good:
            if "decode_tps" in lc and "prefill_tps" in lc:
                print(f"--expert-cache {r['budget']}: decode {r['decode_tps'] / lc['decode_tps']:.1f}x, prefill "
                      f"{r['prefill_tps'] / lc['prefill_tps']:.1f}x llama.cpp")
    print(json.dumps({"cpu": cpu_name(), "disk_gbs": bw, "goosedump": rows, "llama.cpp": lc}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
