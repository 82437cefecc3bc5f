"""goosedump and llama.cpp side by side on one GGUF file: the same prompt
(token ids), the same number of greedy tokens, the same threads. Each engine
runs in its own process (so peak RSS is its own), alternating, and the script
prints prefill and decode tokens/s and peak RSS per run and their ratios.

llama.cpp comes from llama-cpp-python, built outside the repo (see README) and
installed in its own environment: pass its interpreter with --llama-python.

usage: python benchmarks/real_size.py MODEL.gguf [--prompt-tokens 512] [--gen 64] [--threads 2]
           [--reps 1] [--llama-python ~/.cache/goosedump/llama-venv/bin/python]
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
    import numpy as np

    import goosedump
    ids = json.loads(args.ids)
    model = goosedump.load(args.model, n_ctx=len(ids) + args.gen, threads=args.threads)
    r = model.generate(ids, max_tokens=args.gen)
    del np
    return {"prefill_s": r.prefill_seconds, "decode_s": r.decode_seconds, "n_prompt": r.prompt_tokens,
            "n_decode": r.decode_steps, "tokens": r.token_ids, "stop": r.stop_reason}


def child_llamacpp(args) -> dict:
    import llama_cpp
    import numpy as np
    ids = json.loads(args.ids)
    llm = llama_cpp.Llama(model_path=args.model, n_ctx=len(ids) + args.gen, n_threads=args.threads,
                          n_threads_batch=args.threads, n_batch=512, verbose=False)
    n_vocab = llm.n_vocab()

    def last_argmax() -> int:
        ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(n_vocab,))))

    t0 = time.perf_counter()
    llm.eval(ids)
    tok = last_argmax()
    t1 = time.perf_counter()
    tokens = [tok]
    for _ in range(args.gen - 1):   # greedy, end-of-generation ignored: same work as goosedump
        llm.eval([tok])
        tok = last_argmax()
        tokens.append(tok)
    t2 = time.perf_counter()
    return {"prefill_s": t1 - t0, "decode_s": t2 - t1, "n_prompt": len(ids), "n_decode": args.gen - 1,
            "tokens": tokens, "stop": "max_tokens"}


def run_child(python: str, engine: str, model: str, ids: list[int], gen: int, threads: int) -> dict:
    cmd = [python, os.path.abspath(__file__), "--child", engine, model, "--gen", str(gen),
           "--threads", str(threads), "--ids", json.dumps(ids)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(p.pid, 0)
    out, err = p.stdout.read(), p.stderr.read()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(f"{engine} failed ({p.returncode}): {err[-2000:]}")
    r = json.loads(out.strip().splitlines()[-1])
    r["peak_rss_mib"] = usage.ru_maxrss / 1024
    r["prefill_tps"] = r["n_prompt"] / r["prefill_s"]
    r["decode_tps"] = r["n_decode"] / r["decode_s"]
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--llama-python", default=os.path.expanduser("~/.cache/goosedump/llama-venv/bin/python"))
    ap.add_argument("--child", choices=["goosedump", "llamacpp"])
    ap.add_argument("--ids")
    args = ap.parse_args()
    if args.child:
        fn = child_goosedump if args.child == "goosedump" else child_llamacpp
        print(json.dumps(fn(args)))
        return 0

    ids = prompt_ids(args.model, args.prompt_tokens)
    engines = {"goosedump": sys.executable}
    if os.path.exists(args.llama_python):
        engines["llama.cpp"] = args.llama_python
    else:
        print(f"no llama.cpp interpreter at {args.llama_python}: goosedump only", file=sys.stderr)
    runs = {e: [] for e in engines}
    for rep in range(args.reps):
        for engine, python in engines.items():
            r = run_child(python, "goosedump" if engine == "goosedump" else "llamacpp", args.model, ids,
                          args.gen, args.threads)
            runs[engine].append(r)
            print(f"rep {rep + 1} {engine:9s}: prefill {r['prefill_tps']:7.2f} tok/s, decode "
                  f"{r['decode_tps']:6.2f} tok/s, peak RSS {r['peak_rss_mib']:8.0f} MiB", flush=True)
    print(f"\n{os.path.basename(args.model)}: {args.prompt_tokens}-token prompt, {args.gen} generated, "
          f"{args.threads} threads, {args.reps} rep(s)")
    print(f"{'engine':10s} {'prefill tok/s':>14s} {'decode tok/s':>13s} {'peak RSS MiB':>13s}")
    summary = {}
    for engine, rs in runs.items():
        s = {k: statistics.mean(r[k] for r in rs) for k in ("prefill_tps", "decode_tps", "peak_rss_mib")}
        summary[engine] = s
        print(f"{engine:10s} {s['prefill_tps']:14.2f} {s['decode_tps']:13.2f} {s['peak_rss_mib']:13.0f}")
    if "llama.cpp" in runs:
        g, lc = summary["goosedump"], summary["llama.cpp"]
        print(f"goosedump / llama.cpp: prefill {g['prefill_tps'] / lc['prefill_tps']:.2f}x, decode "
              f"{g['decode_tps'] / lc['decode_tps']:.2f}x, peak RSS {g['peak_rss_mib'] / lc['peak_rss_mib']:.2f}x")
        same = sum(a == b for a, b in zip(runs["goosedump"][0]["tokens"], runs["llama.cpp"][0]["tokens"]))
        print(f"greedy tokens equal to llama.cpp's: {same} of {args.gen} (random weights: expect drift)")
    print(json.dumps({"summary": summary, "prompt_tokens": args.prompt_tokens, "gen": args.gen,
                      "threads": args.threads}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
