"""goosedump and llama.cpp side by side on one GGUF file: the same prompt
(token ids), the same number of greedy tokens, the same threads, experts in
memory. Each engine runs in its own process (so peak RSS is its own); the two
alternate `--reps` times. The script watches the machine: before and during
each run it records the load average and the CPU that other processes used,
and flags a run as contaminated when others used more than 0.15 of a core
(on 2 cores one other job cuts llama.cpp's decode several times over). It
prints prefill and decode tokens/s and peak RSS per run, the ratios
goosedump/llama.cpp with their spread, the bytes of weights a decoded token
reads, the memory bandwidth measured in the same run, and the fraction of that
bound each engine's decode reaches.

llama.cpp comes from llama-cpp-python, built outside the repo (see README) and
installed in its own environment: pass its interpreter with --llama-python.
--baseline-python PY compares against another goosedump build instead (the
interpreter of an environment where it is installed): new build / old build.

usage: python benchmarks/vs_llamacpp.py MODEL.gguf [--prompt-tokens 512] [--gen 128] [--threads 2]
           [--reps 3] [--llama-python ~/.cache/goosedump/llama-venv/bin/python] [--baseline-python PY]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def prompt_ids(model_path: str, n: int) -> list[int]:
    """n token ids of varied text (the tests' corpus), tokenized by goosedump."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from corpus import corpus

    import goosedump
    tok = goosedump.load(model_path).tokenizer
    ids: list[int] = []
    seed = 0
    while len(ids) < n:
        ids += tok.encode(" ".join(corpus(200, seed=seed)))
        seed += 1
    return ids[:n]


def child_goosedump(args) -> dict:
    import goosedump
    ids = json.loads(args.ids)
    # experts fully in memory (the bounded-memory case streams them through the expert cache)
    model = goosedump.load(args.model, n_ctx=len(ids) + args.gen, threads=args.threads, expert_cache="16G")
    model.transformer   # maps the weights, as llama.cpp does at load
    # The public generation loop, greedy, end-of-generation ignored: the same
    # work as llama.cpp (and the same call in every goosedump build, for --baseline-python).
    r = model.generate(ids, max_tokens=args.gen, reuse_cache=False, ignore_eos=True)
    return {"prefill_s": r.prefill_seconds, "decode_s": r.decode_seconds, "n_prompt": len(ids),
            "n_decode": r.decode_steps, "tokens": r.token_ids, "stop": r.stop_reason}


def child_llamacpp(args) -> dict:
    from llamacpp_greedy import greedy
    return greedy(args.model, json.loads(args.ids), args.gen, args.threads)


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v) - idle, sum(v)


def others_cpu(seconds: float = 1.0) -> float:
    """Cores' worth of CPU that other processes use right now."""
    b0, _ = cpu_jiffies()
    t0 = time.perf_counter()
    time.sleep(seconds)
    b1, _ = cpu_jiffies()
    return (b1 - b0) / os.sysconf("SC_CLK_TCK") / (time.perf_counter() - t0)


def bandwidth_gbs(threads: int, size: int = 1 << 30) -> float:
    """A streaming read over a buffer far larger than the caches, on `threads` threads."""
    import numpy as np

    from goosedump import _kernels
    buf = np.ones(size, np.uint8)
    old = _kernels.num_threads()
    _kernels.set_num_threads(threads)
    try:
        _kernels.stream_read(buf)
        best = 0.0
        for _ in range(3):
            t0 = time.perf_counter()
            _kernels.stream_read(buf)
            best = max(best, size / (time.perf_counter() - t0) / 1e9)
        return best
    finally:
        _kernels.set_num_threads(old)


def decode_bytes_per_token(model_path: str, ctx: int) -> int:
    """Weights (and KV cache) a decoded token reads: every dense matrix but
    the embeddings (one row), the chosen experts of every layer, the cache."""
    import goosedump
    from goosedump.layout import is_expert_tensor
    m = goosedump.load(model_path)
    c = m.config
    dense = sum(t.nbytes for t in m.file.tensors.values()
                if not is_expert_tensor(t.name) and t.name != "token_embd.weight")
    embd = m.file.tensors["token_embd.weight"].nbytes // c.n_vocab
    experts = c.n_layer * c.n_expert_used * m.layout.expert_slot_bytes
    per_pos = c.n_head_kv * (c.head_dim + c.value_dim) * 2
    # the positions attention reads: the last `window` on sliding layers, all on full ones
    kv = sum(per_pos * (min(ctx, c.sliding_window) if c.is_sliding(i) else ctx) for i in range(c.n_layer))
    return dense + embd + experts + kv


def run_child(python: str, engine: str, model: str, ids: list[int], gen: int, threads: int) -> dict:
    cmd = [python, os.path.abspath(__file__), "--child", engine, model, "--gen", str(gen),
           "--threads", str(threads), "--ids", json.dumps(ids)]
    before = others_cpu()
    load_before = os.getloadavg()[0]
    busy0, _ = cpu_jiffies()
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    busy1, _ = cpu_jiffies()
    own = usage.ru_utime + usage.ru_stime
    during = max(0.0, ((busy1 - busy0) / os.sysconf("SC_CLK_TCK") - own) / wall)
    out, err = p.stdout.read(), p.stderr.read()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(f"{engine} failed ({p.returncode}): {err[-2000:]}")
    r = json.loads(out.strip().splitlines()[-1])
    r["others_cpu_before"], r["others_cpu_during"], r["load_before"] = before, during, load_before
    r["contaminated"] = before > 0.15 or during > 0.15
    r["prefill_tps"] = r["n_prompt"] / r["prefill_s"]
    r["decode_tps"] = r["n_decode"] / r["decode_s"]
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--llama-python", default=os.path.expanduser("~/.cache/goosedump/llama-venv/bin/python"))
    ap.add_argument("--baseline-python", help="compare against the goosedump build of this interpreter")
    ap.add_argument("--child", choices=["goosedump", "llamacpp"])
    ap.add_argument("--ids")
    args = ap.parse_args()
    if args.child:
        fn = child_goosedump if args.child == "goosedump" else child_llamacpp
        r = fn(args)
        # The process's own peak (getrusage's maxrss would carry the parent's over fork and exec).
        with open("/proc/self/status") as f:
            r["peak_rss_mib"] = next(int(x.split()[1]) for x in f if x.startswith("VmHWM:")) / 1024
        print(json.dumps(r))
        return 0

    ids = prompt_ids(args.model, args.prompt_tokens)
    engines = {"goosedump": sys.executable}
    other = "baseline" if args.baseline_python else "llama.cpp"
    if args.baseline_python:
        engines[other] = args.baseline_python
    elif os.path.exists(args.llama_python):
        engines[other] = args.llama_python
    else:
        print(f"no llama.cpp interpreter at {args.llama_python}: goosedump only", file=sys.stderr)
    bw_before = bandwidth_gbs(args.threads)
    runs = {e: [] for e in engines}
    for rep in range(args.reps):
        for engine, python in engines.items():
            r = run_child(python, "llamacpp" if engine == "llama.cpp" else "goosedump", args.model, ids,
                          args.gen, args.threads)
            runs[engine].append(r)
            flag = "  CONTAMINATED" if r["contaminated"] else ""
            print(f"rep {rep + 1} {engine:9s}: prefill {r['prefill_tps']:7.2f} tok/s, decode "
                  f"{r['decode_tps']:6.2f} tok/s, peak RSS {r['peak_rss_mib']:8.0f} MiB; others' CPU "
                  f"{r['others_cpu_before']:.2f} before, {r['others_cpu_during']:.2f} during, load "
                  f"{r['load_before']:.2f}{flag}", flush=True)
    bw = max(bw_before, bandwidth_gbs(args.threads))
    per_token = decode_bytes_per_token(args.model, args.prompt_tokens + args.gen // 2)

    print(f"\n{os.path.basename(args.model)}: {args.prompt_tokens}-token prompt, {args.gen} generated, "
          f"{args.threads} threads, {args.reps} alternating rep(s)")
    print(f"memory bandwidth (streaming read, {args.threads} threads): {bw:.1f} GB/s; a decoded token reads "
          f"{per_token / 1e9:.3f} GB -> bound {bw * 1e9 / per_token:.2f} tok/s")
    print(f"{'engine':10s} {'prefill tok/s':>18s} {'decode tok/s':>18s} {'peak RSS MiB':>13s} {'of bound':>9s}")
    summary = {}
    for engine, rs in runs.items():
        clean = [r for r in rs if not r["contaminated"]] or rs
        s = {k: statistics.mean(r[k] for r in clean) for k in ("prefill_tps", "decode_tps", "peak_rss_mib")}
        s["prefill_sd"] = statistics.stdev([r["prefill_tps"] for r in clean]) if len(clean) > 1 else 0.0
        s["decode_sd"] = statistics.stdev([r["decode_tps"] for r in clean]) if len(clean) > 1 else 0.0
        s["fraction_of_bound"] = s["decode_tps"] * per_token / (bw * 1e9)
        s["clean_runs"] = len([r for r in rs if not r["contaminated"]])
        summary[engine] = s
        print(f"{engine:10s} {s['prefill_tps']:10.2f} ± {s['prefill_sd']:5.2f} {s['decode_tps']:10.2f} ± "
              f"{s['decode_sd']:5.2f} {s['peak_rss_mib']:13.0f} {100 * s['fraction_of_bound']:8.0f}%")
    ratios = {}
    if other in runs:
        pairs = [(g, lc) for g, lc in zip(runs["goosedump"], runs[other])
                 if not (g["contaminated"] or lc["contaminated"])] or list(zip(runs["goosedump"], runs[other]))
        for key, name in (("prefill_tps", "prefill"), ("decode_tps", "decode"), ("peak_rss_mib", "peak RSS")):
            r = [g[key] / lc[key] for g, lc in pairs]
            ratios[name] = {"mean": statistics.mean(r), "min": min(r), "max": max(r)}
            print(f"goosedump / {other} {name:9s}: {statistics.mean(r):.2f}x (min {min(r):.2f}, "
                  f"max {max(r):.2f}, {len(pairs)} clean pair(s))")
        same = sum(a == b for a, b in zip(runs["goosedump"][0]["tokens"], runs[other][0]["tokens"]))
        print(f"greedy tokens equal to {other}'s: {same} of {args.gen}" + ("" if args.baseline_python else
              " (random weights, small margins: llama.cpp's 8-bit activations and rounded YaRN range move them)"))
    print(json.dumps({"summary": summary, "ratios": ratios, "bandwidth_gbs": bw,
                      "decode_bytes_per_token": per_token, "prompt_tokens": args.prompt_tokens,
                      "gen": args.gen, "threads": args.threads, "reps": args.reps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
