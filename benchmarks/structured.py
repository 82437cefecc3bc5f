"""What structured output costs: per-token mask time and decode tok/s with
and without a JSON schema, side by side in one process (repetitions
alternate, so the machine's drift hits both alike).

    python benchmarks/structured.py MODEL.gguf [--gen 48] [--reps 3] [--threads N]

The constrained run follows a schema that keeps it going for --gen tokens
(an array of at least that many small integers), greedy, so both runs decode
the same number of tokens; the unconstrained one runs with ignore_eos. Mask
time is llguidance's mask plus goosedump's masking of the logits row, timed
around the constraint's calls; the vocabulary's one-time build is reported
apart."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from goosedump.machine import cpu_name

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))




class Timed:
    """A constraint whose calls are timed."""

    def __init__(self, inner):
        self.inner, self.seconds, self.calls = inner, 0.0, 0

    def allowed(self):
        t0 = time.perf_counter()
        m = self.inner.allowed()
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return m

    def advance(self, token):
        t0 = time.perf_counter()
        self.inner.advance(token)
        self.seconds += time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--gen", type=int, default=48, help="tokens decoded per run (default 48)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each, alternating (default 3)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--expert-cache", default="16G", help="expert cache budget (default 16G: in memory)")
    args = ap.parse_args()

    import numpy as np

    import goosedump
    from goosedump import _kernels, structured
    from goosedump.options import Options
    from goosedump.reply_plan import raw_constraint
    from goosedump.sampling import SamplingParams

    model = goosedump.load(args.model, options=Options.from_env(expert_cache=args.expert_cache,
                                                               threads=args.threads))
    tok = model.tokenizer
    print(f"CPU: {cpu_name()} ({os.cpu_count()} cores; kernels: {_kernels.active_impl()}, "
          f"{_kernels.num_threads()} threads)")
    t0 = time.perf_counter()
    structured.vocabulary(tok)
    print(f"llguidance vocabulary of {tok.n_vocab} tokens built in {time.perf_counter() - t0:.2f} s (once per "
          f"process)")
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": args.gen}
    prompt = tok.encode("The numbers:")
    greedy = SamplingParams(temperature=0)
    free_rates, bound_rates, mask_ms = [], [], []
    for rep in range(-1, args.reps):            # rep -1: a warm-up round of both (pages in the weights)
        r = model.generate(prompt, args.gen, sampling=greedy, reuse_cache=False, ignore_eos=True)
        free_rates.append(r.decode_tokens_per_s)
        c = Timed(raw_constraint(tok, json_schema=schema))
        r2 = model.generate(prompt, args.gen, sampling=greedy, reuse_cache=False, constraint=c)
        assert r2.generated_tokens == args.gen, r2.stop_reason
        if rep < 0:
            free_rates.clear()
            continue
        bound_rates.append(r2.decode_tokens_per_s)
        mask_ms.append(1000 * c.seconds / max(c.calls, 1))
        print(f"rep {rep + 1}: unconstrained {free_rates[-1]:.2f} tok/s, with the schema {bound_rates[-1]:.2f} "
              f"tok/s, constraint {mask_ms[-1]:.3f} ms/token", flush=True)
    # the logits row is materialised for a constrained token (no fused argmax): its cost is part of the ratio
    ratio = [b / f for b, f in zip(bound_rates, free_rates)]
    print(f"decode with a schema / without: {statistics.mean(ratio):.3f}x "
          f"(min {min(ratio):.3f}, max {max(ratio):.3f}); constraint "
          f"{statistics.mean(mask_ms):.3f} ms per token against {1000 / statistics.mean(free_rates):.1f} ms per "
          f"token of decode ({100 * statistics.mean(mask_ms) * statistics.mean(free_rates) / 1000:.2f}%)")
    print(f"mask over the vocabulary: {np.dtype(bool).itemsize * tok.n_vocab / 1024:.0f} KiB per token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
