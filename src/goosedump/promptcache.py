"""The prompt cache: KV states of prompt prefixes kept on disk, so that a
prompt seen before (the same system prompt and tools, a conversation the
server set aside, the same command run again) prefills only what is new.

One folder per model identity (the file's bytes sampled and its size, the
engine version, the kernels' path and arithmetic revision, the numerics
option): a file per entry, named by the hash of
its token ids, holding a header (magic, format version, identity, tokens,
per-layer shapes, a checksum of the payload) and each layer's keys and
values for the positions it keeps (full layers every position, sliding
layers their ring's last window). Entries are written whole to a temporary
name and renamed, used least-recently-first, evicted past a byte cap; one
that does not parse, names another identity or fails its checksum is
deleted and never used. Restored, a KV state is the very fp16 the cold run
wrote, so output with it equals a cold run's, bit for bit."""
from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile

import numpy as np

from . import _kernels
from .version import __version__
from .kvcache import KVCache

MAGIC = b"GDKV"
FORMAT = 1
_HEAD = struct.Struct("<4sIQ")     # magic, format, header bytes
SUFFIX = ".kv"
MIN_TOKENS = 32                    # shorter prefixes are quicker to prefill than to look up
MAX_ENTRIES = 256                  # a bound on the headers held and compared per lookup


def default_folder() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "goosedump", "prompt-cache")


def model_identity(gguf, activations: str) -> str:
    """A short hash standing for the model's bytes and what changes the
    numbers: every part's size, modification time and three 1 MiB samples of
    it (its header and metadata, the middle, the end), the engine version,
    the kernels' path and arithmetic revision (each path sums in its own
    order) and the activation precision. (The time: a file of the same size
    edited or written again outside the samples is another model; a copy
    costs the cache, never an answer.)"""
    path = _kernels.active_impl()
    if path == "avx2" and _kernels.cpu_splits_256():
        path += " halves"    # (MXFP4's, Q8_0's and the one-scale small codes' arithmetic of their own there)
    h = hashlib.sha256(f"goosedump {__version__} numerics={_kernels.NUMERICS} path={path} "
                       f"activations={activations}".encode())
    for part in gguf.parts:
        buf, mib = part.buf, 1 << 20
        h.update(struct.pack("<Qq", part.size, os.stat(part.path).st_mtime_ns))
        for start in (0, max(0, part.size // 2 - mib // 2), max(0, part.size - mib)):
            h.update(buf[start:start + mib].tobytes())
    return h.hexdigest()[:24]


def tokens_key(tokens) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype=np.int64).tobytes()).hexdigest()[:32]


def _kept_positions(n: int, cap: int) -> np.ndarray:
    """The positions a layer of `cap` slots holds when filled to n."""
    return np.arange(max(0, n - cap), n)


class PromptCache:
    def __init__(self, folder: str, identity: str, cap_bytes: int):
        self.folder = os.path.join(folder, identity)
        self.identity, self.cap = identity, int(cap_bytes)
        self.restored = self.saved = self.rejected = 0
        # The headers in memory, each file's read once: path -> (header, tokens,
        # bytes), and the paths by their first MIN_TOKENS tokens (an entry can
        # only serve a prompt that starts with them). Brought up to the folder
        # when its mtime moves (other processes write it too).
        self._index: dict[str, tuple[dict, np.ndarray, int]] = {}
        self._by_start: dict[str, set[str]] = {}
        self._folder_mtime: int | None = None

    # -- the index
    @staticmethod
    def _start(tokens) -> str | None:
        if len(tokens) < MIN_TOKENS:
            return None
        return hashlib.blake2b(np.asarray(tokens[:MIN_TOKENS], dtype=np.int64).tobytes(), digest_size=8).hexdigest()

    def _add(self, path: str, head: dict, size: int) -> None:
        toks = np.asarray(head.pop("tokens"), dtype=np.int64)     # held once, as an array
        self._index[path] = (head, toks, size)
        key = self._start(toks)
        if key is not None:
            self._by_start.setdefault(key, set()).add(path)

    def _drop(self, path: str) -> None:
        entry = self._index.pop(path, None)
        if entry is not None:
            key = self._start(entry[1])
            if key in self._by_start:
                self._by_start[key].discard(path)

    def _sync(self) -> None:
        try:
            mtime = os.stat(self.folder).st_mtime_ns
        except FileNotFoundError:
            self._index.clear()
            self._by_start.clear()
            self._folder_mtime = None
            return
        if mtime == self._folder_mtime:
            return
        names = set(self._entries())
        for gone in set(self._index) - names:
            self._drop(gone)
        for path in names - set(self._index):
            head = self._header(path)
            if head is not None:
                try:
                    self._add(path, head, os.path.getsize(path))
                except OSError:
                    pass
        try:
            self._folder_mtime = os.stat(self.folder).st_mtime_ns
        except FileNotFoundError:
            self._folder_mtime = None

    # -- reading
    def _entries(self) -> list[str]:
        try:
            return [os.path.join(self.folder, f) for f in os.listdir(self.folder) if f.endswith(SUFFIX)]
        except FileNotFoundError:
            return []

    def _header(self, path: str) -> dict | None:
        try:
            with open(path, "rb") as f:
                magic, fmt, size = _HEAD.unpack(f.read(_HEAD.size))
                if magic != MAGIC or fmt != FORMAT or size > 64 << 20:
                    raise ValueError("not an entry of this format")
                head = json.loads(f.read(size))
            if head["identity"] != self.identity:
                raise ValueError("another model's entry")
            toks, layers = head["tokens"], head["layers"]
            if not (isinstance(toks, list) and all(type(t) is int and 0 <= t < 1 << 31 for t in toks)
                    and isinstance(layers, list) and isinstance(head["checksum"], str)):
                raise ValueError("a malformed header")
            head["offset"] = _HEAD.size + size
            return head
        except (OSError, ValueError, KeyError, struct.error, UnicodeDecodeError):
            self._reject(path)
            return None

    def _reject(self, path: str) -> None:
        self.rejected += 1
        self._drop(path)
        try:
            os.unlink(path)
        except OSError:
            pass

    def best(self, prompt, cache: KVCache, than: int = 0) -> tuple[str, dict, int] | None:
        """The entry whose state, put into cache, leaves the longest prefix
        of prompt to reuse (more than `than` tokens, and at least one prompt
        token to run), with that length."""
        self._sync()
        prompt = np.asarray(prompt, dtype=np.int64)
        found = None
        for path in sorted(self._by_start.get(self._start(prompt), ())):
            head, toks, _ = self._index[path]
            n = min(len(toks), len(prompt) - 1)
            differ = np.flatnonzero(toks[:n] != prompt[:n])
            shared = int(differ[0]) if len(differ) else n
            if not cache.can_rewind(shared, len(toks)):
                continue
            if shared > than and (found is None or shared > found[2]):
                found = (path, head, shared)
        return found

    def restore(self, prompt, cache: KVCache) -> int:
        """Put the best entry's state into cache when it leaves more of
        prompt to reuse than cache holds now (an entry that fails its checks
        is deleted and the next best tried); returns the prefix cache can
        now reuse."""
        have = cache.reusable(prompt)
        while True:
            found = self.best(prompt, cache, than=max(have, MIN_TOKENS - 1))
            if found is None:
                return have
            path, head, _ = found
            arrays = self._load(path, head, cache)
            if arrays is not None:
                break
        toks = self._index[path][1]
        n = len(toks)
        cache.truncate(0)
        for (ka, va), k, v in zip(arrays, cache.k, cache.v):
            # the last positions, as many as both the entry and this layer hold
            keep = min(len(ka), len(k))
            pos = np.arange(n - keep, n)
            k[pos % len(k)] = ka[len(ka) - keep:]
            v[pos % len(v)] = va[len(va) - keep:]
        cache.n, cache.tokens = n, toks.tolist()
        cache.save_window()
        os.utime(path)                        # most recently used
        self.restored += 1
        return cache.reusable(prompt)

    def _load(self, path: str, head: dict, cache: KVCache) -> list | None:
        """The entry's (keys, values) per layer, checked against its checksum
        and this cache's shapes; None (and the entry deleted) if they fail."""
        n, layers = len(self._index[path][1]), head["layers"]
        try:
            if len(layers) != len(cache.k) or n > cache.n_ctx:
                raise ValueError("another model's layers, or a longer context than this run's")
            with open(path, "rb") as f:
                f.seek(head["offset"])
                payload = f.read()
            if hashlib.blake2b(payload, digest_size=16).hexdigest() != head["checksum"]:
                raise ValueError("checksum")
            arrays, at = [], 0
            for (cap, kshape, vshape), k, v in zip(layers, cache.k, cache.v):
                rows = len(_kept_positions(n, cap))
                ka = np.frombuffer(payload, np.float16, rows * int(np.prod(kshape)), at).reshape(rows, *kshape)
                at += ka.nbytes
                va = np.frombuffer(payload, np.float16, rows * int(np.prod(vshape)), at).reshape(rows, *vshape)
                at += va.nbytes
                if ka.shape[1:] != k.shape[1:] or va.shape[1:] != v.shape[1:]:
                    raise ValueError("shape")
                arrays.append((ka, va))
            if at != len(payload):
                raise ValueError("size")
        except (OSError, ValueError, TypeError):
            self._reject(path)
            return None
        return arrays

    # -- writing
    def has(self, tokens) -> bool:
        path = os.path.join(self.folder, tokens_key(tokens) + SUFFIX)
        if os.path.exists(path):
            os.utime(path)
            return True
        return False

    def save(self, tokens, k_layers, v_layers) -> None:
        """Store the state whose layers hold `tokens` (k_layers/v_layers: each
        layer's array, slot = position % its length)."""
        n = len(tokens)
        if n < MIN_TOKENS or self.cap <= 0 or self.has(tokens):
            return
        parts, layers = [], []
        for k, v in zip(k_layers, v_layers):
            slots = _kept_positions(n, len(k)) % len(k)
            parts += [np.ascontiguousarray(k[slots]), np.ascontiguousarray(v[slots])]
            layers.append((len(k), list(k.shape[1:]), list(v.shape[1:])))
        payload = b"".join(p.tobytes() for p in parts)
        head = json.dumps({"identity": self.identity, "engine": __version__, "tokens": [int(t) for t in tokens],
                           "layers": layers, "checksum": hashlib.blake2b(payload, digest_size=16).hexdigest()}).encode()
        if len(payload) > self.cap:
            return
        try:
            os.makedirs(self.folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(_HEAD.pack(MAGIC, FORMAT, len(head)))
                f.write(head)
                f.write(payload)
            path = os.path.join(self.folder, tokens_key(tokens) + SUFFIX)
            os.replace(tmp, path)
        except OSError:
            return                            # a full or read-only disk costs the cache, not the run
        self.saved += 1
        self._sync()                          # (the folder moved: the new entry's header joins the index)
        self._evict()

    def save_cache(self, cache: KVCache) -> None:
        self.save(cache.tokens[:cache.n], cache.k, cache.v)

    def _evict(self) -> None:
        """Remove the least recently used entries past the cap."""
        if sum(size for _, _, size in self._index.values()) <= self.cap and len(self._index) <= MAX_ENTRIES:
            return
        entries = []
        for path in self._entries():
            try:
                st = os.stat(path)
            except OSError:
                continue
            entries.append((st.st_mtime, st.st_size, path))
        total, count = sum(e[1] for e in entries), len(entries)
        for _, size, path in sorted(entries):
            if total <= self.cap and count <= MAX_ENTRIES:
                break
            count -= 1
            try:
                os.unlink(path)
            except OSError:
                pass
            self._drop(path)
            total -= size
