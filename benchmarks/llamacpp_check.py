"""Load synthetic models in llama.cpp and generate a few tokens: proof that
`goosedump synth` writes files llama.cpp accepts as gpt-oss.

Needs llama-cpp-python (build it once, outside the repo, e.g.
`CMAKE_ARGS="-DGGML_NATIVE=ON" pip wheel --no-deps -w ~/.cache/goosedump/wheels llama-cpp-python`
and install that wheel into a separate virtual environment). Not part of the
test suite: the build takes a long time on 2 cores.

usage: python benchmarks/llamacpp_check.py MODEL.gguf [MODEL.gguf ...] [--tokens N]
"""
import argparse
import json
import sys
import time


def check(path: str, n_tokens: int, threads: int) -> dict:
    from llama_cpp import Llama
    t0 = time.perf_counter()
    llm = Llama(model_path=path, n_ctx=256, n_threads=threads, verbose=False, use_mmap=True)
    load_s = time.perf_counter() - t0
    prompt = "The quick brown fox"
    ids = llm.tokenize(prompt.encode(), add_bos=False, special=False)
    t0 = time.perf_counter()
    out = llm.create_completion(prompt, max_tokens=n_tokens, temperature=0.0)
    gen_s = time.perf_counter() - t0
    return {
        "model": path,
        "arch": llm.metadata.get("general.architecture"),
        "n_vocab": llm.n_vocab(),
        "prompt_token_ids": ids,
        "generated_tokens": out["usage"]["completion_tokens"],
        "text": out["choices"][0]["text"],
        "load_seconds": round(load_s, 2),
        "generate_seconds": round(gen_s, 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    ok = True
    for path in args.models:
        try:
            r = check(path, args.tokens, args.threads)
            print(json.dumps(r, ensure_ascii=False))
            ok &= r["arch"] == "gpt-oss" and r["generated_tokens"] > 0
        except Exception as e:  # report and go on to the next model
            print(json.dumps({"model": path, "error": f"{type(e).__name__}: {e}"}))
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
