"""Independent references, built offline."""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import tempfile

from goosedump.vocab import O200K_BASE_SHA256, tiktoken_file_bytes

O200K_BASE_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"


def write_tiktoken_vocab(folder: str) -> str:
    """o200k_base.tiktoken from quicktok-v1's vocabulary, checked against the
    published sha256; also placed where tiktoken's cache looks for it."""
    data = tiktoken_file_bytes()
    assert hashlib.sha256(data).hexdigest() == O200K_BASE_SHA256
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "o200k_base.tiktoken"), "wb") as f:
        f.write(data)
    with open(os.path.join(folder, hashlib.sha1(O200K_BASE_URL.encode()).hexdigest()), "wb") as f:
        f.write(data)
    return folder


@functools.lru_cache(maxsize=1)
def tiktoken_harmony():
    """tiktoken's own o200k_harmony encoding (its pattern, its special
    tokens), fed the vocabulary offline through tiktoken's file cache."""
    folder = write_tiktoken_vocab(tempfile.mkdtemp(prefix="goosedump-tiktoken-"))
    old = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = folder
    try:
        import tiktoken
        enc = tiktoken.get_encoding("o200k_harmony")
    finally:
        if old is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = old
        shutil.rmtree(folder, ignore_errors=True)     # (read whole: every test run had left 7 MB in /tmp)
    assert enc.n_vocab == 201088
    return enc


@functools.lru_cache(maxsize=1)
def harmony_encoding():
    """openai-harmony's HARMONY_GPT_OSS encoding, its vocabulary given offline
    (TIKTOKEN_ENCODINGS_BASE is where it looks for o200k_base.tiktoken)."""
    folder = write_tiktoken_vocab(tempfile.mkdtemp(prefix="goosedump-harmony-"))
    old = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = folder
    try:
        import openai_harmony
        return openai_harmony.load_harmony_encoding(openai_harmony.HarmonyEncodingName.HARMONY_GPT_OSS)
    finally:
        if old is None:
            del os.environ["TIKTOKEN_ENCODINGS_BASE"]
        else:
            os.environ["TIKTOKEN_ENCODINGS_BASE"] = old
        shutil.rmtree(folder, ignore_errors=True)     # (read whole, as above)
