"""The prompt cache: KV states of prompt prefixes kept on disk, so that a
prompt seen before (the same system prompt and tools, a conversation the
server set aside, the same command run again) prefills only what is new.

One folder per model identity (the file's bytes sampled and its size, the
engine version and its code's bytes, the kernels' path and arithmetic
revision, the numerics option): a file per entry, named by the hash of
its token ids, holding a header (magic, format version, identity, tokens,
per-layer shapes, a checksum of the payload) and each layer's keys and
values for the positions it keeps (full layers every position, sliding
layers their ring's last window). Entries are written whole to a temporary
name and renamed, used least-recently-first, evicted past a byte cap; one
that does not parse, names another identity, holds tokens its name does
not hash to or fails its checksum is deleted and never used. The byte cap
holds for the whole folder, every identity's entries in one LRU order (old
models' and engine versions' entries age out). A folder that cannot be read
or written turns the cache off for the run, with one note: it costs the
cache, never the run. Restored, a KV state is the very fp16 the cold run
wrote, so output with it equals a cold run's, bit for bit."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import struct
import tempfile
import time

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
IDENTITY = re.compile(r"[0-9a-f]{24}")   # an identity folder's name (model_identity)
STALE_TMP_SECONDS = 600            # a temporary file older than this is a killed writer's
# what an entry whose content fails a check raises as it is read (it is deleted)
BAD_CONTENT = (ValueError, KeyError, TypeError, struct.error, UnicodeDecodeError)


def default_folder() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "goosedump", "prompt-cache")


def engine_files() -> list[str]:
    """The engine's own code, whose bytes model_identity takes: its Python
    modules and its native extension."""
    package = os.path.dirname(os.path.abspath(__file__))
    files = {os.path.join(root, f) for root, dirs, names in os.walk(package) for f in names
             if f.endswith(".py") and "__pycache__" not in root}
    return sorted(files | {os.path.abspath(_kernels.__file__)})


@functools.lru_cache(maxsize=1)
def engine_digest() -> bytes:
    """A hash of engine_files(): an engine rebuilt or edited at the same
    version (from git, say) computes its own numbers, so it is another
    identity (the version and the kernels' revision alone are bumped by
    hand)."""
    h = hashlib.sha256()
    package = os.path.dirname(os.path.abspath(__file__))
    for path in engine_files():
        try:
            with open(path, "rb") as f:
                h.update(os.path.relpath(path, package).encode() + b"\0" + hashlib.sha256(f.read()).digest())
        except OSError:         # (an editor's dangling lock file, .#name.py: no module of the engine)
            continue
    return h.digest()


def model_identity(gguf, activations: str) -> str:
    """A short hash standing for the model's bytes and what changes the
    numbers: every part's size, modification time and three 1 MiB samples of
    it (its header and metadata, the middle, the end), the engine version and
    its code (engine_digest),
    the kernels' path and arithmetic revision (each path sums in its own
    order) and the activation precision. (The time: a file of the same size
    edited or written again outside the samples is another model; a copy
    costs the cache, never an answer.)"""
    path = _kernels.active_impl()
    if path == "avx2" and _kernels.cpu_splits_256():
        path += " halves"    # (MXFP4's, Q8_0's and the one-scale small codes' arithmetic of their own there)
    h = hashlib.sha256(f"goosedump {__version__} numerics={_kernels.NUMERICS} path={path} "
                       f"activations={activations}".encode())
    h.update(engine_digest())
    for part in gguf.parts:
        buf, mib = part.buf, 1 << 20
        h.update(struct.pack("<Qq", part.size, part.mtime_ns))
        for start in (0, max(0, part.size // 2 - mib // 2), max(0, part.size - mib)):
            h.update(buf[start:start + mib].tobytes())
    return h.hexdigest()[:24]


def tokens_key(tokens) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype=np.int64).tobytes()).hexdigest()[:32]


def _kept_positions(n: int, cap: int) -> np.ndarray:
    """The positions a layer of `cap` slots holds when filled to n."""
    return np.arange(max(0, n - cap), n)


class PromptCache:
    def __init__(self, folder: str, identity: str, cap_bytes: int, note=None):
        self.root, self.folder = folder, os.path.join(folder, identity)
        self.identity, self.cap = identity, int(cap_bytes)
        self.restored = self.saved = self.rejected = 0
        self.note = note            # where the one note goes when the folder fails (or None)
        self.off: str | None = None  # why the cache is off for this run (the folder failed), or None
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

    def _switch_off(self, e: OSError) -> None:
        """The folder failed (read-only, full, not a folder, a link loop): the
        run goes on without the cache, and says so once."""
        if self.off is None:
            self.off = str(e)
            if self.note is not None:
                self.note(f"goosedump: the prompt cache ({self.root}) is off for this run: {e}")

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
        # (the mtime read before the listing: an entry written during it moves the folder again)
        self._folder_mtime = mtime
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

    # -- reading
    def _entries(self) -> list[str]:
        try:
            return [os.path.join(self.folder, f) for f in os.listdir(self.folder) if f.endswith(SUFFIX)]
        except FileNotFoundError:
            return []

    def _header(self, path: str) -> dict | None:
        try:
            with open(path, "rb") as f:
                return self._read_header(f, path)
        except OSError:
            # (gone, or not readable now: too many open files, another user's; not corrupt)
            self._drop(path)
            return None
        except BAD_CONTENT:
            self._reject(path)
            return None

    def _read_header(self, f, path: str) -> dict:
        """The header of the entry open in f (left at its payload); raises
        one of BAD_CONTENT where it fails a check."""
        magic, fmt, size = _HEAD.unpack(f.read(_HEAD.size))
        if magic != MAGIC or fmt != FORMAT or size > 64 << 20:
            raise ValueError("not an entry of this format")
        head = json.loads(f.read(size))
        if not isinstance(head, dict):
            raise ValueError("a header that is no object")
        if head["identity"] != self.identity:
            raise ValueError("another model's entry")
        toks, layers = head["tokens"], head["layers"]
        if not (isinstance(toks, list) and all(type(t) is int and 0 <= t < 1 << 31 for t in toks)
                and isinstance(layers, list) and isinstance(head["checksum"], str)):
            raise ValueError("a malformed header")
        # (the checksum covers the payload: a flipped token in the header
        # would restore another prompt's state for this one)
        if os.path.basename(path) != tokens_key(toks) + SUFFIX:
            raise ValueError("tokens its name does not hash to")
        head["offset"] = _HEAD.size + size
        return head

    def _reject(self, path: str) -> None:
        """An entry whose content failed a check: deleted, never used."""
        self.rejected += 1
        self._drop(path)
        try:
            os.unlink(path)
        except OSError:
            pass

    @staticmethod
    def _touch(path: str) -> bool:
        """Mark an entry most recently used; False if it is gone (another
        process evicted it). A folder that cannot be written keeps its order."""
        try:
            os.utime(path)
        except FileNotFoundError:
            return False
        except OSError:
            pass
        return True

    def best(self, prompt, cache: KVCache, than: int = 0) -> tuple[str, dict, int] | None:
        """The entry whose state, put into cache, leaves the longest prefix
        of prompt to reuse (more than `than` tokens, and at least one prompt
        token to run), with that length."""
        self._sync()
        prompt = np.asarray(prompt, dtype=np.int64)
        found = None
        for path in sorted(self._by_start.get(self._start(prompt), ())):
            head, toks, _ = self._index[path]
            if len(toks) > cache.n_ctx:      # another run's longer context: not for this one, yet sound
                continue
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
        if self.off is None:
            try:
                self._restore(prompt, cache)
            except OSError as e:
                self._switch_off(e)
        return cache.reusable(prompt)

    def _restore(self, prompt, cache: KVCache) -> None:
        have = cache.reusable(prompt)
        while True:
            found = self.best(prompt, cache, than=max(have, MIN_TOKENS - 1))
            if found is None:
                return
            path = found[0]
            arrays = self._load(path, cache)
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
        self.restored += 1
        self._touch(path)

    def _load(self, path: str, cache: KVCache) -> list | None:
        """The entry's (keys, values) per layer, checked against its checksum
        and this cache's shapes; None (and the entry deleted) if they fail."""
        n = len(self._index[path][1])
        try:
            with open(path, "rb") as f:
                # the header again, from the file now open (another process may
                # have written the entry anew since it was indexed: its layers'
                # lengths, and so its payload's offset, follow that run's context)
                head = self._read_header(f, path)
                payload = f.read()
            layers = head["layers"]
            if len(layers) != len(cache.k):
                raise ValueError("another model's layers")
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
        except (OSError, MemoryError):        # (gone, unreadable now, or no room to read it: not corrupt)
            self._drop(path)
            return None
        except BAD_CONTENT:
            self._reject(path)
            return None
        return arrays

    # -- writing
    def has(self, tokens) -> bool:
        """Whether an entry holds exactly tokens (then most recently used);
        False with the cache off."""
        if self.off is not None:
            return False
        path = os.path.join(self.folder, tokens_key(tokens) + SUFFIX)
        return os.path.exists(path) and self._touch(path)

    def wants(self, tokens) -> bool:
        """Whether saving tokens would write an entry: the cache on, no entry
        holding them (callers skip snapshotting the KV cache otherwise)."""
        return not self.has(tokens) and self.off is None

    def save(self, tokens, k_layers, v_layers) -> None:
        """Store the state whose layers hold `tokens` (k_layers/v_layers: each
        layer's array, slot = position % its length)."""
        n = len(tokens)
        if n < MIN_TOKENS or self.cap <= 0 or not self.wants(tokens):
            return
        try:
            self._save(tokens, k_layers, v_layers)
        except OSError as e:
            self._switch_off(e)
        except MemoryError:
            pass                              # (no room for a layer's copy now: this entry is not written)

    def _save(self, tokens, k_layers, v_layers) -> None:
        n = len(tokens)
        layers = [(len(k), list(k.shape[1:]), list(v.shape[1:])) for k, v in zip(k_layers, v_layers)]
        payload_bytes = sum(len(_kept_positions(n, len(k))) * (k.itemsize * int(np.prod(k.shape[1:])) +
                                                              v.itemsize * int(np.prod(v.shape[1:])))
                            for k, v in zip(k_layers, v_layers))

        def header(checksum: str) -> bytes:
            return json.dumps({"identity": self.identity, "engine": __version__, "tokens": [int(t) for t in tokens],
                               "layers": layers, "checksum": checksum}).encode()
        head = header("0" * 32)               # (the checksum's place: the same length once it is known)
        if _HEAD.size + len(head) + payload_bytes > self.cap:
            return                            # (written, it would only evict everything, itself too)
        os.makedirs(self.folder, exist_ok=True)
        try:
            fd, tmp = tempfile.mkstemp(dir=self.folder, suffix=".tmp")
        except FileNotFoundError:             # (another process's eviction took the folder just made)
            os.makedirs(self.folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, suffix=".tmp")
        self._sweep()
        try:
            with os.fdopen(fd, "wb") as f:
                # a layer at a time (a long prompt's state is hundreds of MB: one
                # copy of it whole, then another joined, had been held), the
                # checksum summed as it goes and written in its place at the end
                f.write(_HEAD.pack(MAGIC, FORMAT, len(head)))
                f.write(head)
                digest = hashlib.blake2b(digest_size=16)
                for k, v in zip(k_layers, v_layers):
                    slots = _kept_positions(n, len(k)) % len(k)
                    for part in (np.ascontiguousarray(k[slots]), np.ascontiguousarray(v[slots])):
                        digest.update(part)
                        f.write(part)
                f.seek(_HEAD.size)
                f.write(header(digest.hexdigest()))
            os.replace(tmp, os.path.join(self.folder, tokens_key(tokens) + SUFFIX))
        except BaseException:
            try:
                os.unlink(tmp)                # (a full disk: no half-written file left behind)
            except OSError:
                pass
            raise
        self.saved += 1
        self._sync()                          # (the folder moved: the new entry's header joins the index)
        self._evict()

    def _sweep(self) -> None:
        """Remove the temporary files of writers killed mid-write (older than
        STALE_TMP_SECONDS: a live writer's is seconds old)."""
        now = time.time()
        try:
            names = os.listdir(self.folder)
        except OSError:
            return
        for name in names:
            if name.endswith(".tmp"):
                path = os.path.join(self.folder, name)
                try:
                    if now - os.stat(path).st_mtime > STALE_TMP_SECONDS:
                        os.unlink(path)
                except OSError:
                    pass

    def save_cache(self, cache: KVCache) -> None:
        self.save(cache.tokens[:cache.n], cache.k, cache.v)

    def _all_entries(self) -> list[tuple[float, int, str]]:
        """(last use, bytes, path) of every identity's entries in the folder."""
        out = []
        for name in os.listdir(self.root):
            folder = os.path.join(self.root, name)
            if not IDENTITY.fullmatch(name) or not os.path.isdir(folder):
                continue
            try:
                names = os.listdir(folder)
            except OSError:                   # (another user's, or one just removed: not this run's failure)
                continue
            for f in names:
                if f.endswith(SUFFIX):
                    try:
                        st = os.stat(os.path.join(folder, f))
                    except OSError:
                        continue
                    out.append((st.st_mtime, st.st_size, os.path.join(folder, f)))
        return out

    def _evict(self) -> None:
        """Remove the least recently used entries, of any identity, while the
        folder's entries pass the cap (or this identity's pass MAX_ENTRIES);
        then the other identities' folders it emptied."""
        entries = self._all_entries()
        total = sum(size for _, size, _ in entries)
        own = sum(1 for *_, path in entries if os.path.dirname(path) == self.folder)
        if total <= self.cap and own <= MAX_ENTRIES:
            return
        emptied = set()
        for _, size, path in sorted(entries):
            if total <= self.cap and own <= MAX_ENTRIES:
                break
            mine = os.path.dirname(path) == self.folder
            if total <= self.cap and not mine:
                continue                      # (only this identity's count is over: its own go)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass                          # (another process took it: gone all the same)
            except OSError:
                continue                      # (not ours to remove: it still counts)
            self._drop(path)
            total -= size
            own -= mine
            emptied.add(os.path.dirname(path))
        for folder in emptied - {self.folder}:
            try:
                os.rmdir(folder)              # (only an empty one goes)
            except OSError:
                pass
