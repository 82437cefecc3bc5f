"""goosedump and llama.cpp under a memory limit, side by side.

For each limit (default 8 GiB and 5 GiB) the script creates a memory cgroup
(v1 `memory.limit_in_bytes` / `memory.max_usage_in_bytes`, or v2
`memory.max` / `memory.peak`; both count the page cache), drops the page
cache, runs each engine inside it on the same prompt ids for the same number
of greedy tokens, and removes the cgroup. It reports decode tokens/s, peak
memory as the cgroup counts it, and bytes the engine read from storage
(/proc/self/io). goosedump runs with its expert cache (default budget 2G,
pages dropped after reading); with --page-cache it also runs leaving the
experts' pages to the OS. llama.cpp runs with its weights memory-mapped
(without --repack: its default CPU weight repacking copies ~10 GiB into
anonymous memory and is killed under these limits). Needs root (cgroups,
drop_caches).

usage: python benchmarks/bounded_memory.py MODEL.gguf [--limits 8G,5G] [--gen 32] [--prompt-tokens 16]
           [--expert-cache 2G] [--page-cache] [--llama-python ~/.cache/goosedump/llama-venv/bin/python]
"""
import argparse
import json
import os
import subprocess
import sys
import time

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


def read_bytes() -> int:
    with open("/proc/self/io") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("read_bytes:"))


def child_goosedump(args) -> dict:
    import numpy as np

    import goosedump
    ids = json.loads(args.ids)
    model = goosedump.load(args.model, n_ctx=len(ids) + args.gen, threads=args.threads,
                           expert_cache=args.expert_cache, page_cache=args.page_cache)
    tr = model.transformer
    cache = model.new_cache()
    t0 = time.perf_counter()
    tok = int(tr.head.argmax(tr.forward(np.asarray(ids), cache, last_only=True))[0])
    t1 = time.perf_counter()
    for _ in range(args.gen - 1):
        tok = int(tr.head.argmax(tr.forward(np.asarray([tok]), cache))[0])
    t2 = time.perf_counter()
    return {"prefill_s": t1 - t0, "decode_s": t2 - t1, "n_decode": args.gen - 1, "read_bytes": read_bytes(),
            "expert_cache": model.store.snapshot()}


def child_llamacpp(args) -> dict:
    from llamacpp_greedy import greedy
    r = greedy(args.model, json.loads(args.ids), args.gen, args.threads, repack=args.repack)
    return {**r, "read_bytes": read_bytes()}


def run(engine: str, python: str, args, ids: list[int], limit: int, page_cache: bool) -> dict:
    drop_page_cache()
    cg = Cgroup(f"goosedump-bench-{os.getpid()}", limit)
    cmd = [python, os.path.abspath(__file__), "--child", engine, args.model, "--gen", str(args.gen),
           "--threads", str(args.threads), "--ids", json.dumps(ids), "--expert-cache", args.expert_cache]
    if page_cache:
        cmd.append("--page-cache")
    if args.repack:
        cmd.append("--repack")
    try:
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=cg.join, timeout=args.timeout)
        wall = time.perf_counter() - t0
        peak = cg.peak()
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout} s", "peak_bytes": cg.peak()}
    finally:
        cg.remove()
    if p.returncode != 0:
        return {"error": f"exit {p.returncode}: {p.stderr.strip()[-300:]}", "peak_bytes": peak}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r.update(peak_bytes=peak, wall_s=wall, decode_tps=r["n_decode"] / r["decode_s"])
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--limits", default="8G,5G")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--expert-cache", default="2G")
    ap.add_argument("--page-cache", action="store_true", help="also run goosedump leaving pages to the OS")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--repack", action="store_true",
                    help="let llama.cpp repack its weights into anonymous memory (its default; OOM at 8 GiB)")
    ap.add_argument("--llama-python", default=os.path.expanduser("~/.cache/goosedump/llama-venv/bin/python"))
    ap.add_argument("--child", choices=["goosedump", "llamacpp"])
    ap.add_argument("--ids")
    args = ap.parse_args()
    if args.child:
        fn = child_goosedump if args.child == "goosedump" else child_llamacpp
        print(json.dumps(fn(args)))
        return 0

    import goosedump
    from goosedump.budget import parse_size
    tok = goosedump.load(args.model).tokenizer
    ids = tok.encode("The expert cache keeps the mixture-of-experts weights on disk and streams them " * 4)
    ids = ids[:args.prompt_tokens]
    limits = [x.strip() for x in args.limits.split(",")]
    engines = [("goosedump", sys.executable, False)]
    if args.page_cache:
        engines.append(("goosedump (page cache)", sys.executable, True))
    if os.path.exists(args.llama_python):
        engines.append(("llama.cpp", args.llama_python, False))
    rows = []
    for limit in limits:
        for name, python, pc in engines:
            r = run("llamacpp" if name == "llama.cpp" else "goosedump", python, args, ids, parse_size(limit, "limit"),
                    pc)
            r.update(engine=name, limit=limit)
            rows.append(r)
            if "error" in r:
                print(f"{limit:>4s} {name:24s} {r['error']}", flush=True)
            else:
                print(f"{limit:>4s} {name:24s} decode {r['decode_tps']:6.3f} tok/s, peak {r['peak_bytes'] / 2**30:5.2f} "
                      f"GiB, read {r['read_bytes'] / 1e9:7.1f} GB", flush=True)
    print(f"\n{os.path.basename(args.model)}: {len(ids)}-token prompt, {args.gen} greedy tokens, "
          f"{args.threads} threads, goosedump --expert-cache {args.expert_cache}")
    print(f"| limit | engine | decode tok/s | peak (cgroup) | read from disk |")
    print(f"|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['limit']} | {r['engine']} | {r['error']} | | |")
        else:
            print(f"| {r['limit']} | {r['engine']} | {r['decode_tps']:.3f} | {r['peak_bytes'] / 2**30:.2f} GiB | "
                  f"{r['read_bytes'] / 1e9:.1f} GB |")
    for limit in limits:
        g = next((r for r in rows if r["limit"] == limit and r["engine"] == "goosedump" and "error" not in r), None)
        lc = next((r for r in rows if r["limit"] == limit and r["engine"] == "llama.cpp" and "error" not in r), None)
        if g and lc:
            print(f"{limit}: goosedump / llama.cpp decode {g['decode_tps'] / lc['decode_tps']:.1f}x")
    print(json.dumps(rows, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
