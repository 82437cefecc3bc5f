"""The o200k_harmony vocabulary (GPT-OSS's tokenizer), taken from the PyPI
package quicktok-v1, and its GGUF form as llama.cpp's converter writes it:
GPT-2 byte-level token strings, token types and the HF-style merges list."""
from __future__ import annotations

import functools

import numpy as np

N_MERGEABLE = 199_998   # ids below are BPE ranks; ids from here on are special
N_VOCAB = 201_088
O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


@functools.lru_cache(maxsize=1)
def byte_to_unicode() -> tuple[str, ...]:
    """GPT-2's reversible map of the 256 bytes to printable characters."""
    printable = [b for b in range(256) if ord("!") <= b <= ord("~") or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF]
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return tuple(out[b] for b in range(256))


def to_gpt2_string(b: bytes) -> str:
    table = byte_to_unicode()
    return "".join(table[x] for x in b)


@functools.lru_cache(maxsize=1)
def harmony_token_bytes() -> tuple[bytes, ...]:
    """Bytes of all 201,088 tokens by id (special tokens as their text)."""
    try:
        import quicktok
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise RuntimeError("the o200k_harmony vocabulary comes from the package quicktok-v1: "
                           "pip install quicktok-v1") from e
    enc = quicktok.get_encoding("o200k_harmony")
    if enc.n_vocab != N_VOCAB:
        raise RuntimeError(f"quicktok's o200k_harmony has {enc.n_vocab} tokens, expected {N_VOCAB}")
    return tuple(enc.decode_single_token_bytes(i) for i in range(N_VOCAB))


def tiktoken_file_bytes(token_bytes=None) -> bytes:
    """The o200k_base.tiktoken file (base64 token and rank per line) that
    tiktoken and openai-harmony load; sha256 O200K_BASE_SHA256."""
    import base64
    tb = harmony_token_bytes() if token_bytes is None else token_bytes
    return b"".join(base64.b64encode(b) + b" %d\n" % i for i, b in enumerate(tb[:N_MERGEABLE]))


def hf_merges(token_bytes: tuple[bytes, ...], n_mergeable: int) -> list[str]:
    """Every split (left, right) of every token into two tokens, ordered by the
    token's rank then the parts' ranks: the merges list that the HF conversion
    of a tiktoken vocabulary (and so llama.cpp's converter) writes."""
    ranks = {b: i for i, b in enumerate(token_bytes[:n_mergeable])}
    merges = []
    for rank, tok in enumerate(token_bytes[:n_mergeable]):
        local = []
        for k in range(1, len(tok)):
            left, right = tok[:k], tok[k:]
            rl, rr = ranks.get(left), ranks.get(right)
            if rl is not None and rr is not None:
                local.append((rl, rr, left, right))
        local.sort()
        merges.extend((left, right) for _, _, left, right in local)
    return [to_gpt2_string(a) + " " + to_gpt2_string(b) for a, b in merges]


N_ADDED = 21            # the HF tokenizer's added tokens: ids 199998..200018


@functools.lru_cache(maxsize=1)
def gguf_vocab():
    """(tokens, token_types, merges) as llama.cpp's converter stores them.
    Normal tokens are GPT-2 strings (type 1); the 21 tokens the HF tokenizer
    adds (<|startoftext|> .. <|endofprompt|>) are their text (type 3,
    CONTROL); ids past them, which the HF tokenizer lacks, are "[PAD<id>]"
    (type 5, UNUSED)."""
    tb = harmony_token_bytes()
    n_special = N_MERGEABLE + N_ADDED
    tokens = [to_gpt2_string(b) if i < N_MERGEABLE else b.decode("utf-8") if i < n_special else f"[PAD{i}]"
              for i, b in enumerate(tb)]
    ids = np.arange(len(tb))
    types = np.select([ids < N_MERGEABLE, ids < n_special], [1, 3], 5).astype(np.int32)
    return tokens, types, hf_merges(tb, N_MERGEABLE)
