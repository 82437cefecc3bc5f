"""goosedump and llama.cpp side by side on one GGUF file: a prompt of random
(non-special) token ids, then greedy tokens, the same threads. goosedump runs
its own generation loop; llama.cpp runs its `llama-bench` binary (built from
the source in llama-cpp-python's sdist, see the README): pp (prompt
processing) and tg (generation at the prompt's depth, `-d`). Each engine runs
in its own process, warmed up first as llama-bench warms up (the prompt once,
one generated token), and the two alternate `--reps` times, the first of a
pair turning each time (A B, B A, ...). The script watches
the machine: before and during each run it records the CPU that other
processes used and flags a run as contaminated when they used more than 0.15
of a core. It prints the CPU model and instruction sets, prefill and decode
tokens/s and peak RSS per run, the ratios goosedump/llama.cpp with their
spread, the bytes a decoded token reads, the memory bandwidth measured in the
same run and the fraction of that bound each engine's decode reaches; and
the multiply-accumulates a prompt token costs, the rate each engine's prefill
reaches and its fraction of the measured peak of goosedump's int16
instruction (llama.cpp's 8-bit products have a peak twice that on AVX2).

--baseline-python PY compares against another goosedump build instead (the
interpreter of an environment where it is installed): new build / old build.

usage: python benchmarks/vs_llamacpp.py MODEL.gguf [--prompt-tokens 512] [--gen 128] [--threads 2]
           [--reps 3] [--llama-bench ~/.cache/goosedump/llama.cpp/build/bin/llama-bench]
           [--expert-cache auto] [--baseline-python PY]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from goosedump.machine import cpu_description

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_LLAMA_BENCH = os.path.expanduser("~/.cache/goosedump/llama.cpp/build/bin/llama-bench")




def prompt_ids(model_path: str, n: int) -> list[int]:
    """n random token ids outside the special tokens (as llama-bench draws them)."""
    import numpy as np

    import goosedump
    tok = goosedump.load(model_path).tokenizer
    normal = [i for i in range(tok.n_vocab) if i not in tok.special_ids]
    return np.random.default_rng(0).choice(normal, n).tolist()


def child_goosedump(args) -> dict:
    import goosedump
    ids = json.loads(args.ids)
    model = goosedump.load(args.model, n_ctx=len(ids) + args.gen + 1, threads=args.threads,
                           expert_cache=args.expert_cache)
    model.transformer   # maps the weights, as llama.cpp does at load
    # A warm-up as llama-bench's own (a run of the whole prompt, then one
    # generated token) before the timed run, so that neither engine's timed
    # run reads its weights from disk: a machine may drop an idle file's
    # pages from the page cache within a minute (a VM's proactive reclaim,
    # DAMON's pageout, did on the Intel Xeon sandbox: the first goosedump run
    # after a pause prefilled at 22-32 tok/s, reading the file at 0.6 GB/s,
    # where every later one read 63-75).
    model.generate(ids, max_tokens=2, reuse_cache=False, ignore_eos=True)
    # The public generation loop, greedy, end-of-generation ignored: the same
    # work as llama.cpp (and the same call in every goosedump build, for --baseline-python).
    r = model.generate(ids, max_tokens=args.gen + 1, reuse_cache=False, ignore_eos=True)
    return {"prefill_s": r.prefill_seconds, "decode_s": r.decode_seconds, "n_prompt": len(ids),
            "n_decode": r.decode_steps}


def run_llama_bench(binary: str, model: str, n_prompt: int, gen: int, threads: int) -> dict:
    """pp n_prompt and tg gen at depth n_prompt, one repetition each (the
    alternation gives the repetitions); the weights repacked as llama.cpp
    does by default."""
    out = {}
    for key, extra in (("pp", ["-p", str(n_prompt), "-n", "0"]),
                       ("tg", ["-p", "0", "-n", str(gen), "-d", str(n_prompt)])):
        p = subprocess.run([binary, "-m", model, "-t", str(threads), "-r", "1", "-o", "json", *extra],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"llama-bench failed ({p.returncode}): {p.stderr[-2000:]}")
        row = json.loads(p.stdout)[0]
        out[key] = row
    return {"prefill_s": n_prompt / out["pp"]["avg_ts"], "decode_s": gen / out["tg"]["avg_ts"],
            "n_prompt": n_prompt, "n_decode": gen, "build": out["tg"].get("build_commit"),
            "cpu_info": out["tg"].get("cpu_info"), "backends": out["tg"].get("backends")}


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
    the embeddings (one row), the chosen experts of every layer (their bytes
    in the file's own types), the cache."""
    import goosedump
    from goosedump.layout import is_expert_tensor
    m = goosedump.load(model_path)
    c = m.config
    ts = m.file.tensors.values()
    dense = sum(t.nbytes for t in ts if not is_expert_tensor(t.name) and t.name != "token_embd.weight")
    embd = m.file.tensors["token_embd.weight"].nbytes // c.n_vocab
    experts = sum(t.nbytes for t in ts if is_expert_tensor(t.name)) // c.n_expert * c.n_expert_used
    per_pos = c.n_head_kv * (c.head_dim + c.value_dim) * 2
    # the positions attention reads: the last `window` on sliding layers, all on full ones
    kv = sum(per_pos * (min(ctx, c.sliding_window) if c.is_sliding(i) else ctx) for i in range(c.n_layer))
    return dense + embd + experts + kv


def prefill_macs_per_token(model_path: str, n_prompt: int) -> float:
    """Multiply-accumulates a prompt token costs on average: every matrix of
    a layer it passes (q, k, v, output, router, the chosen experts' gate, up
    and down), and attention over the positions before it (the last
    `window` on sliding layers); the output head runs for the last token
    only, as in both engines' prefill."""
    import goosedump
    c = goosedump.load(model_path).config
    D, q, kv = c.n_embd, c.n_head * c.head_dim, c.n_head_kv * (c.head_dim + c.value_dim)
    matrices = D * q + D * kv + c.n_head * c.value_dim * D + D * c.n_expert
    experts = c.n_expert_used * 3 * D * c.n_ff_expert
    attention = 0.0
    for i in range(c.n_layer):
        seen = [min(p + 1, c.sliding_window) if c.is_sliding(i) else p + 1 for p in range(n_prompt)]
        attention += sum(seen) / n_prompt * c.n_head * (c.head_dim + c.value_dim)
    return c.n_layer * (matrices + experts) + attention + D * c.n_vocab / n_prompt


def run_child(cmd: list[str]) -> dict:
    before = others_cpu()
    busy0, _ = cpu_jiffies()
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    busy1, _ = cpu_jiffies()
    own = usage.ru_utime + usage.ru_stime
    during = max(0.0, ((busy1 - busy0) / os.sysconf("SC_CLK_TCK") - own) / wall)
    out, err = p.stdout.read(), p.stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{cmd[:3]} failed: {err[-2000:]}")
    r = json.loads(out.strip().splitlines()[-1])
    r["others_cpu_before"], r["others_cpu_during"] = before, during
    r["contaminated"] = before > 0.15 or during > 0.15
    r["prefill_tps"] = r["n_prompt"] / r["prefill_s"]
    r["decode_tps"] = r["n_decode"] / r["decode_s"]
    r["peak_rss_mib"] = usage.ru_maxrss / 1024
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH", DEFAULT_LLAMA_BENCH))
    ap.add_argument("--expert-cache", default="auto",
                    help="goosedump's expert cache budget (default auto, goosedump's own default: experts in memory "
                         "where they fit, as llama.cpp keeps them)")
    ap.add_argument("--baseline-python", help="compare against the goosedump build of this interpreter")
    ap.add_argument("--child", choices=["goosedump", "llamacpp"])
    ap.add_argument("--ids")
    args = ap.parse_args()
    if args.child == "goosedump":
        print(json.dumps(child_goosedump(args)))
        return 0
    if args.child == "llamacpp":
        print(json.dumps(run_llama_bench(args.llama_bench, args.model, len(json.loads(args.ids)), args.gen,
                                         args.threads)))
        return 0

    print(f"CPU: {cpu_description()}", flush=True)
    ids = prompt_ids(args.model, args.prompt_tokens)
    common = [args.model, "--gen", str(args.gen), "--threads", str(args.threads), "--ids", json.dumps(ids),
              "--expert-cache", args.expert_cache, "--llama-bench", args.llama_bench]
    engines = {"goosedump": [sys.executable, os.path.abspath(__file__), "--child", "goosedump", *common]}
    other = "baseline" if args.baseline_python else "llama.cpp"
    if args.baseline_python:
        engines[other] = [args.baseline_python, os.path.abspath(__file__), "--child", "goosedump", *common]
    elif os.path.exists(args.llama_bench):
        engines[other] = [sys.executable, os.path.abspath(__file__), "--child", "llamacpp", *common]
    else:
        print(f"no llama-bench at {args.llama_bench} (--llama-bench or $LLAMA_BENCH): goosedump only", file=sys.stderr)
    bw_before = bandwidth_gbs(args.threads)
    runs = {e: [] for e in engines}
    for rep in range(args.reps):
        # the order turns each repetition (A B, B A, ...): whatever the first
        # run of a pair meets (the caches another process left, the host's
        # load as it changes) falls on both engines alike
        order = list(engines.items())
        for engine, cmd in (order if rep % 2 == 0 else order[::-1]):
            r = run_child(cmd)
            runs[engine].append(r)
            flag = "  CONTAMINATED" if r["contaminated"] else ""
            print(f"rep {rep + 1} {engine:9s}: prefill {r['prefill_tps']:7.2f} tok/s, decode "
                  f"{r['decode_tps']:6.2f} tok/s, peak RSS {r['peak_rss_mib']:8.0f} MiB; others' CPU "
                  f"{r['others_cpu_before']:.2f} before, {r['others_cpu_during']:.2f} during{flag}", flush=True)
    bw = max(bw_before, bandwidth_gbs(args.threads))
    per_token = decode_bytes_per_token(args.model, args.prompt_tokens + args.gen // 2)
    from goosedump import _kernels
    macs = prefill_macs_per_token(args.model, args.prompt_tokens)
    peak, instruction, per_instruction = _kernels.peak_int16_macs()
    # where the AVX-512 path's many-token products run on AMX's tiles, their peak too (0 elsewhere)
    amx_peak, amx_instruction, _ = _kernels.peak_amx_macs() if hasattr(_kernels, "peak_amx_macs") else (0.0, "", 0)
    if other in runs and runs[other][0].get("build"):
        print(f"llama.cpp build {runs[other][0]['build']}, {runs[other][0].get('backends')}: "
              f"{runs[other][0].get('cpu_info')}")
    print(f"\n{os.path.basename(args.model)}: {args.prompt_tokens}-token prompt, {args.gen} generated, "
          f"{args.threads} threads, {args.reps} alternating rep(s)")
    print(f"memory bandwidth (streaming read, {args.threads} threads): {bw:.1f} GB/s; a decoded token reads "
          f"{per_token / 1e9:.3f} GB -> bound {bw * 1e9 / per_token:.2f} tok/s")
    print(f"a prompt token costs {macs / 1e9:.3f} G multiply-accumulates; goosedump's int16 products "
          f"({_kernels.active_impl()}: {instruction}, {per_instruction} MACs each) peak at {peak / 1e9:.1f} G/s "
          f"on one thread, measured: {args.threads * peak / 1e9:.1f} G/s on {args.threads} -> prefill bound "
          f"{args.threads * peak / macs:.1f} tok/s")
    if amx_peak:
        print(f"its products of 16 tokens and more (every block format but Q2_K, Q3_K, Q6_K) run on AMX's tiles: "
              f"{amx_instruction}, peak at {amx_peak / 1e9:.1f} G/s on one thread, "
              f"{args.threads * amx_peak / 1e9:.1f} G/s on {args.threads}")
    print(f"{'engine':10s} {'prefill tok/s':>18s} {'decode tok/s':>18s} {'peak RSS MiB':>13s} {'of bound':>9s} "
          f"{'prefill GMAC/s':>15s} {'of int16 peak':>14s}")
    # The same runs in the table and the ratios: the pairs whose two runs are
    # both clean (or every pair, said so, where none is); one engine alone, its clean runs.
    pairs, label = [], ""
    if other in runs:
        every = list(zip(runs["goosedump"], runs[other]))
        pairs = [(g, o) for g, o in every if not (g["contaminated"] or o["contaminated"])]
        label = f"{len(pairs)} clean pair(s)" if pairs else f"all {len(every)} pair(s): none clean"
        pairs = pairs or every
    used = {"goosedump": [g for g, _ in pairs], other: [o for _, o in pairs]} if pairs else {}
    summary = {}
    for engine, rs in runs.items():
        clean = used.get(engine) or [r for r in rs if not r["contaminated"]] or rs
        s = {k: statistics.mean(r[k] for r in clean) for k in ("prefill_tps", "decode_tps", "peak_rss_mib")}
        s["prefill_sd"] = statistics.stdev([r["prefill_tps"] for r in clean]) if len(clean) > 1 else 0.0
        s["decode_sd"] = statistics.stdev([r["decode_tps"] for r in clean]) if len(clean) > 1 else 0.0
        s["fraction_of_bound"] = s["decode_tps"] * per_token / (bw * 1e9)
        s["prefill_gmacs"] = s["prefill_tps"] * macs / 1e9
        s["fraction_of_int16_peak"] = s["prefill_tps"] * macs / (args.threads * peak)
        if amx_peak and engine == "goosedump":
            s["fraction_of_amx_peak"] = s["prefill_tps"] * macs / (args.threads * amx_peak)
        s["clean_runs"] = len([r for r in rs if not r["contaminated"]])
        s["runs_used"] = len(clean)
        summary[engine] = s
        print(f"{engine:10s} {s['prefill_tps']:10.2f} ± {s['prefill_sd']:5.2f} {s['decode_tps']:10.2f} ± "
              f"{s['decode_sd']:5.2f} {s['peak_rss_mib']:13.0f} {100 * s['fraction_of_bound']:8.0f}% "
              f"{s['prefill_gmacs']:15.1f} {100 * s['fraction_of_int16_peak']:13.0f}%")
    if "fraction_of_amx_peak" in summary.get("goosedump", {}):
        print(f"goosedump's prefill: {100 * summary['goosedump']['fraction_of_amx_peak']:.0f}% of the AMX peak")
    ratios = {}
    if pairs:
        for key, name in (("prefill_tps", "prefill"), ("decode_tps", "decode"), ("peak_rss_mib", "peak RSS")):
            r = [g[key] / o[key] for g, o in pairs]
            ratios[name] = {"mean": statistics.mean(r), "min": min(r), "max": max(r)}
            print(f"goosedump / {other} {name:9s}: {statistics.mean(r):.2f}x (min {min(r):.2f}, "
                  f"max {max(r):.2f}, {label})")
    print(json.dumps({"cpu": cpu_description(), "summary": summary, "ratios": ratios, "bandwidth_gbs": bw,
                      "decode_bytes_per_token": per_token, "prefill_macs_per_token": macs,
                      "int16_peak_macs_per_thread": peak, "amx_peak_macs_per_thread": amx_peak,
                      "kernels": _kernels.active_impl(),
                      "prompt_tokens": args.prompt_tokens,
                      "gen": args.gen, "threads": args.threads, "reps": args.reps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
