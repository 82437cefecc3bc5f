"""llama.cpp's side of the side-by-side benchmarks: prefill a list of token
ids, then decode greedily for a number of tokens (end-of-generation ignored,
so both engines do the same work). Runs in the llama-cpp-python environment."""
import time


def greedy(model: str, ids: list[int], gen: int, threads: int, repack: bool = True, n_batch: int = 512) -> dict:
    import llama_cpp
    import numpy as np
    if not repack:
        # Keep the weights memory-mapped (a plain mmap runner): llama.cpp's CPU
        # weight repacking copies the experts into anonymous memory.
        default = llama_cpp.llama_model_default_params

        def no_repack():
            p = default()
            p.use_extra_bufts = False
            return p
        import llama_cpp.llama as llama_mod
        llama_cpp.llama_model_default_params = llama_mod.llama_cpp.llama_model_default_params = no_repack
    llm = llama_cpp.Llama(model_path=model, n_ctx=len(ids) + gen, n_threads=threads, n_threads_batch=threads,
                          n_batch=n_batch, verbose=False)
    n_vocab = llm.n_vocab()

    def last_argmax() -> int:
        ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(n_vocab,))))

    t0 = time.perf_counter()
    llm.eval(ids)
    tok = last_argmax()
    t1 = time.perf_counter()
    tokens = [tok]
    for _ in range(gen - 1):
        llm.eval([tok])
        tok = last_argmax()
        tokens.append(tok)
    t2 = time.perf_counter()
    return {"prefill_s": t1 - t0, "decode_s": t2 - t1, "n_prompt": len(ids), "n_decode": gen - 1,
            "tokens": tokens, "stop": "max_tokens"}
