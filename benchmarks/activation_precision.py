"""How precise must activations be inside the quantized products? For each
precision (fp32, int16 blocks, and llama.cpp-style int8 blocks emulated in
numpy), the agreement of goosedump's logits and greedy tokens with the
transformers reference on the tiny reference models of tests/test_reference.py,
and the kernels' speed. The engine's default (goosedump.options.Options.activations)
was chosen from this table.

usage: python benchmarks/activation_precision.py
"""
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))


def agreement(acts: str) -> list[tuple]:
    """Run in a child: i8 replaces the kernels' matmul by one that rounds activations first."""
    code = f"""
import sys, json, numpy as np, torch
sys.path.insert(0, {os.path.join(HERE, '..', 'tests')!r})
from test_reference import CONFIGS, hf_logits, fp16_kv_cache
from hf_reference import build
import goosedump, goosedump.weights as F
from goosedump import synth
from goosedump.options import Options
ACTS = {'f32' if acts == 'i8' else acts!r}
vocab = synth.small_vocab()
out = []
if {acts == 'i8'!r}:   # llama.cpp's choice: activations rounded to int8 per 32-block
    def q8(x):
        b = x.reshape(x.shape[0], -1, 32)
        d = np.abs(b).max(-1, keepdims=True) / 127
        return (np.round(b / np.where(d == 0, 1, d)) * d).reshape(x.shape).astype(np.float32)
    matmul, argmax = F._kernels.matmul, F._kernels.matvec_argmax
    class K:   # every product's activations: the dense matrices', the experts' (both layers), the head's argmax
        def __getattr__(self, n):
            return getattr(F._kernels_real, n)
        @staticmethod
        def matmul(fmt, w, x, out, bias=None, impl="auto", acts="f32"):
            return matmul(fmt, w, np.ascontiguousarray(q8(x)), out, bias, impl, "f32")
        @staticmethod
        def matvec_argmax(fmt, w, x, impl="auto", acts="f32"):
            return argmax(fmt, w, np.ascontiguousarray(q8(x[None])[0]), impl, "f32")
        @staticmethod
        def moe(gate_fmt, gate, gate_bias, up_fmt, up, up_bias, down_fmt, down, down_bias, h, experts, weights,
                out, alpha, limit, impl="auto", acts="f32"):
            # the kernel's expert, each product's input rounded first: gate and
            # up (gate clamped above, up both ways), g sigmoid(alpha g) (u + 1), down
            def product(fmt, w, b, x):
                y = np.empty((1, w.shape[0]), np.float32)
                matmul(fmt, w, np.ascontiguousarray(q8(x)), y, b, impl, "f32")
                return y
            for t in range(h.shape[0]):
                acc = np.zeros(h.shape[1], np.float32)
                for j in range(experts.shape[1]):
                    e = experts[t, j]
                    g = np.minimum(product(gate_fmt, gate[e], gate_bias[e], h[t:t + 1]), np.float32(limit))
                    u = np.clip(product(up_fmt, up[e], up_bias[e], h[t:t + 1]), -limit, limit).astype(np.float32)
                    a = (g / (1 + np.exp(-alpha * g)) * (u + 1)).astype(np.float32)
                    acc += np.float32(weights[t, j]) * product(down_fmt, down[e], down_bias[e], a)[0]
                out[t] = acc
    F._kernels_real = F._kernels
    F._kernels = K()
for name, (cfg, n) in sorted(CONFIGS.items()):
    path = {tempfile.mkdtemp()!r} + '/' + name + '.gguf'
    torch.manual_seed(0)
    hf = build(cfg, vocab, path, seed=len(name))
    model = goosedump.load(path, n_ctx=512, options=Options(activations=ACTS))
    prompt = np.random.default_rng(1).integers(0, model.config.n_vocab, n).tolist()
    ours = model.logits(prompt)
    with fp16_kv_cache(hf):
        ref = hf_logits(hf, prompt)
    r = model.generate(prompt, max_tokens=40)
    with torch.no_grad():
        g = hf.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False, pad_token_id=0)[0, n:].tolist()
    same = next((i for i, (a, b) in enumerate(zip(r.token_ids, g)) if a != b), min(len(g), len(r.token_ids)))
    out.append((name, float(np.abs(ours - ref).max() / np.abs(ref).max()), same))
print(json.dumps(out))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(res.stderr[-3000:])
    import json
    return json.loads(res.stdout.strip().splitlines()[-1])


def speed() -> dict:
    import numpy as np

    from goosedump import _kernels
    rng = np.random.default_rng(0)
    out = {}
    for fmt, rb in (("mxfp4", 1530), ("q8_0", 3060)):
        w = rng.integers(0, 256, (2880 * 8, rb), dtype=np.uint8)   # 8 experts' worth: past the caches
        if fmt == "mxfp4":
            w[:, ::17] = 120
        else:
            w.reshape(w.shape[0], -1, 34)[:, :, :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        x = rng.standard_normal((1, 2880)).astype(np.float32)
        y = np.empty((1, w.shape[0]), np.float32)
        for acts in ("f32", "i16"):
            _kernels.matmul(fmt, w, x, y, None, "auto", acts)
            t = time.perf_counter()
            for _ in range(10):
                _kernels.matmul(fmt, w, x, y, None, "auto", acts)
            out[(fmt, acts)] = w.nbytes * 10 / (time.perf_counter() - t) / 1e9
    return out


def main() -> int:
    print("agreement with transformers (fp16 KV cache emulated in the reference):")
    print(f"{'activations':12s} {'config':28s} {'max |dlogit| / max|logit|':>26s} {'greedy tokens equal':>20s}")
    for acts in ("f32", "i16", "i8"):
        for name, err, same in agreement(acts):
            print(f"{acts:12s} {name:28s} {err:26.2e} {same:>17d}/40")
    from goosedump import _kernels
    print(f"\nmatrix-vector speed, 2880 x 23040 weights, {_kernels.num_threads()} threads:")
    for (fmt, acts), gbs in speed().items():
        print(f"  {fmt:6s} {acts}: {gbs:6.2f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
