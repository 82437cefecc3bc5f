"""The prompt cache on disk: a prompt seen before (the same system prompt
with another question, the same prompt again, a conversation the server set
aside) prefills only what is new, with keys and values equal bit for bit to
a cold run's; entries that are corrupt, of another model or of another
format are deleted and never used; the cap evicts the least recently used."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import goosedump
from goosedump import _kernels
from goosedump.engine import Engine
from goosedump.options import Options
from goosedump.promptcache import SUFFIX, PromptCache, model_identity, tokens_key
from goosedump.sampling import SamplingParams

SYSTEM = "You are a careful assistant. Answer in one short sentence, and say when you are unsure. " * 3


def chat_prompt(model, question: str) -> list[int]:
    return model.render_chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
                             date="2026-12-01")


@pytest.fixture()
def folder(tmp_path):
    return str(tmp_path / "prompt-cache")


def load(path, folder=None, **kw):
    return goosedump.load(path, options=Options.from_env(prompt_cache=folder or "off", **kw))


def kv_after_prefill(model, prompt):
    """After a prompt's prefill: the first token, and the keys and values of
    every position a next token reads (full layers all, sliding layers their
    window: what a ring holds beyond it is never read)."""
    r = model.generate(prompt, 1)
    c, n, w = model._cache, len(prompt), model.config.sliding_window
    rings = dict(c.rings)
    pos = [np.arange(max(0, n - w), n) if i in rings else np.arange(n) for i in range(len(c.k))]
    return r, [k[p % len(k)].copy() for k, p in zip(c.k, pos)] + [v[p % len(v)].copy() for v, p in zip(c.v, pos)]


def entries(folder):
    return sorted(os.path.join(r, f) for r, _, fs in os.walk(folder) for f in fs if f.endswith(SUFFIX))


def test_a_warm_prompt_equals_a_cold_one_bit_for_bit(tiny_path, folder):
    cold = load(tiny_path)
    first = load(tiny_path, folder)
    prompt_a = chat_prompt(first, "Why is the sky blue?")
    prompt_b = chat_prompt(first, "Name a prime.")
    sampled = SamplingParams(temperature=1.0, seed=7)
    ra = first.generate(prompt_a, 12, sampling=sampled)
    assert ra.cached_tokens == 0 and len(entries(folder)) == 2     # the system prompt's state and the whole prompt
    first.close()
    for prompt in (prompt_a, prompt_b):
        warm = load(tiny_path, folder)                              # a new process would see the same files
        r_warm, kv_warm = kv_after_prefill(warm, prompt)
        r_cold, kv_cold = kv_after_prefill(cold, prompt)
        start, user = warm.tokenizer.special_token("<|start|>"), warm.tokenizer.encode("user")
        boundary = max(i for i in range(len(prompt)) if prompt[i:i + 1 + len(user)] == [start, *user])
        shared = next(i for i, (x, y) in enumerate(zip(prompt + [-1], prompt_a + [-2])) if x != y)
        # the same prompt: all but the last token from disk; another question:
        # the system prompt and the user header (what it shares with the first)
        assert r_warm.cached_tokens == min(shared, len(prompt) - 1) and shared > boundary
        assert all(np.array_equal(w.view(np.uint16), c.view(np.uint16)) for w, c in zip(kv_warm, kv_cold))
        assert warm.generate(prompt, 12, sampling=sampled).token_ids == cold.generate(prompt, 12, sampling=sampled,
                                                                                      reuse_cache=False).token_ids
        warm.close()
    cold.close()


def test_corrupt_stale_and_foreign_entries_are_never_used(tiny_path, folder, tmp_path):
    m = load(tiny_path, folder)
    prompt = chat_prompt(m, "Hello?")
    expect = m.generate(prompt, 8).token_ids          # cold, and kept
    m.close()
    saved = entries(folder)
    assert saved
    corrupt = {}
    for path in saved:                              # a flipped byte in every payload
        with open(path, "r+b") as f:
            f.seek(-100, os.SEEK_END)
            b = f.read(1)
            f.seek(-100, os.SEEK_END)
            f.write(bytes([b[0] ^ 0xFF]))
        with open(path, "rb") as f:
            corrupt[path] = f.read()
    ident_dir = os.path.dirname(saved[0])
    with open(os.path.join(ident_dir, "0" * 32 + SUFFIX), "wb") as f:
        f.write(b"not an entry at all")             # another format
    m = load(tiny_path, folder)
    r = m.generate(prompt, 8)
    assert r.cached_tokens == 0 and r.token_ids == expect
    assert m.prompt_cache.rejected == len(saved) + 1
    for p in saved:                                 # each removed, or replaced by a good one
        if p in entries(folder):
            with open(p, "rb") as f:
                assert f.read() != corrupt[p], p
    m.close()
    m = load(tiny_path, folder)
    assert m.generate(prompt, 8).cached_tokens == len(prompt) - 1 and m.prompt_cache.rejected == 0
    m.close()
    # another model's file (another seed: the same size and metadata) has its own identity
    from goosedump import synth
    other = tmp_path / "other.gguf"
    synth.write_model(other, "tiny", seed=2)
    o = load(str(other), folder)
    assert o.prompt_cache.identity != m.prompt_cache.identity
    assert o.generate(prompt, 4).cached_tokens == 0
    o.close()


def test_a_file_edited_outside_the_samples_is_another_model(tiny_path, tmp_path):
    """The same size, the same three sampled MiB, one byte changed between
    them (a tensor edited in place): another identity, by the file's time."""
    from goosedump.gguf import GGUFFile
    import shutil
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(tiny_path, copy)
    st = os.stat(tiny_path)
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    size, mib = st.st_size, 1 << 20
    assert size > 5 * mib
    assert model_identity(GGUFFile(copy), "i16") == model_identity(GGUFFile(tiny_path), "i16")   # the same bytes
    with open(copy, "r+b") as f:          # a byte of tensor data between the middle sample and the end one
        f.seek(size * 3 // 4)
        b = f.read(1)
        f.seek(size * 3 // 4)
        f.write(bytes([b[0] ^ 0x40]))
    assert model_identity(GGUFFile(copy), "i16") != model_identity(GGUFFile(tiny_path), "i16")


def identity_under(env: dict, path: str) -> str:
    code = ("import sys; from goosedump.gguf import GGUFFile; from goosedump.promptcache import model_identity; "
            "print(model_identity(GGUFFile(sys.argv[1]), 'i16'))")
    out = subprocess.run([sys.executable, "-c", code, path], env={**os.environ, **env}, capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


@pytest.mark.skipif(len(_kernels.available_impls()) < 2, reason="this CPU runs the generic path only")
def test_each_kernel_path_keeps_its_own_entries(tiny_path):
    # Each path sums in its own order: keys and values one wrote are not the
    # other's, so a cache written under one must not serve the other.
    best = identity_under({"GOOSEDUMP_ISA": "auto"}, tiny_path)
    assert best == identity_under({"GOOSEDUMP_ISA": "auto"}, tiny_path)
    assert identity_under({"GOOSEDUMP_ISA": "generic"}, tiny_path) != best
    if "avx2" in _kernels.available_impls():
        # the AVX2 path's two forms: MXFP4 has an arithmetic of its own in the halves' form
        halves = identity_under({"GOOSEDUMP_ISA": "avx2", "GOOSEDUMP_AVX2_HALVES": "1"}, tiny_path)
        assert halves != identity_under({"GOOSEDUMP_ISA": "avx2", "GOOSEDUMP_AVX2_HALVES": "0"}, tiny_path)


def test_the_cap_evicts_the_least_recently_used(tiny_path, folder):
    m = load(tiny_path, folder)
    ident = model_identity(m.file, "i16")
    prompts = [m.tokenizer.encode(f"Entry number {i}: " + "some words to fill the cache " * 8) for i in range(4)]
    one = PromptCache(folder, ident, 1 << 40)
    for p in prompts[:1]:
        m.generate(p, 1)
        one.save_cache(m._cache)
    size = os.path.getsize(entries(folder)[0])
    cap = PromptCache(folder, ident, int(2.5 * size))
    # each entry stamped a second after the last (written ms apart, two could share a clock tick)
    stamp = time.time_ns() - 100 * 10**9
    os.utime(entries(folder)[0], ns=(stamp, stamp))
    for i, p in enumerate(prompts[1:], 1):
        m.generate(p, 1, reuse_cache=False)
        cap.save_cache(m._cache)
        written = os.path.join(os.path.dirname(entries(folder)[0]), tokens_key(p) + SUFFIX)
        os.utime(written, ns=(stamp + i * 10**9,) * 2)
        assert sum(os.path.getsize(e) for e in entries(folder)) <= 2.5 * size
    # the two written last are kept: the first two went, oldest first
    assert {os.path.basename(e) for e in entries(folder)} == {tokens_key(p) + SUFFIX for p in prompts[2:]}
    m.close()


def test_the_server_sets_a_conversation_aside_on_disk(tiny_path, folder):
    m = load(tiny_path, folder)
    engine = Engine(m, max_batch=1)
    try:
        a = m.tokenizer.encode("Conversation A: " + "we talked about the weather in Oslo " * 6)
        ra = engine.submit(a, 6).wait()
        b = m.tokenizer.encode("Conversation B: " + "and then about the trains to Bergen " * 6)
        engine.submit(b, 6).wait()                 # takes A's only cache, after putting it on disk
        a2 = a + ra.token_ids + m.tokenizer.encode(" And tomorrow?")
        r = engine.submit(a2, 6).wait()
        assert r.cached_tokens >= len(a) + len(ra.token_ids) - 1
        assert r.token_ids == m.generate(a2, 6, reuse_cache=False).token_ids
    finally:
        engine.close()
        m.close()


def test_the_cli_keeps_prompts_by_default_and_not_when_told(tiny_path, tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    env.pop("GOOSEDUMP_PROMPT_CACHE", None)
    run = [sys.executable, "-m", "goosedump", "run", tiny_path, "--system", SYSTEM, "-n", "4", "--temp", "0", "--json"]
    outs = []
    for _ in range(2):
        out = subprocess.run(run + ["-p", "Why is the sky blue?"], capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        outs.append(json.loads(out.stdout))
    assert outs[0]["cached_tokens"] == 0 and outs[1]["cached_tokens"] == outs[1]["prompt_tokens"] - 1
    assert outs[0]["token_ids"] == outs[1]["token_ids"]
    assert entries(str(tmp_path / "xdg" / "goosedump" / "prompt-cache"))
    # the summary line says how many came from the cache, its rate is the computed ones'
    out = subprocess.run(run[:-1] + ["-p", "Why is the sky blue?"], capture_output=True, text=True, env=env,
                         timeout=120)
    n, cached = outs[1]["prompt_tokens"], outs[1]["cached_tokens"]
    assert f"[{n} prompt tokens ({cached} from the prompt cache; {n - cached} in " in out.stderr, out.stderr
    out = subprocess.run(run + ["-p", "Why is the sky blue?", "--no-prompt-cache"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert json.loads(out.stdout)["cached_tokens"] == 0
    folder = tmp_path / "mine"
    out = subprocess.run(run + ["-p", "Name a prime.", "--prompt-cache", str(folder)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0 and entries(str(folder))
    out = subprocess.run(run + ["-p", "x", "--prompt-cache-size", "lots"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode != 0 and "--prompt-cache-size" in out.stderr and "Traceback" not in out.stderr


RAW = list(range(1000, 1040))                      # a raw prompt of 40 ids: its whole state is kept


def test_a_header_whose_tokens_were_changed_is_never_used(tiny_path, folder):
    """The checksum covers the payload; a token flipped in the header had
    restored prompt A's state for prompt B (a silently wrong answer). The
    name, its tokens' hash, no longer matches: the entry is deleted."""
    m = load(tiny_path, folder)
    m.generate(RAW, 2)
    m.close()
    (path,) = entries(folder)
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    at = raw.index(b"1039]")
    raw[at:at + 5] = b"1038]"
    with open(path, "wb") as f:
        f.write(bytes(raw))
    other = RAW[:-1] + [1038, 7]
    cold = load(tiny_path).generate(other, 8, reuse_cache=False).token_ids
    m = load(tiny_path, folder)
    r = m.generate(other, 8)
    assert r.cached_tokens == 0 and r.token_ids == cold and m.prompt_cache.rejected == 1
    m.close()


def test_a_header_that_is_no_object_is_deleted(tiny_path, folder):
    cold = load(tiny_path).generate(RAW, 4, reuse_cache=False).token_ids
    for head in (b"[]", b"null", b'"x"'):
        m = load(tiny_path, folder)                 # (each a fresh process's view)
        os.makedirs(m.prompt_cache.folder, exist_ok=True)
        bad = os.path.join(m.prompt_cache.folder, "0123456789abcdef" * 2 + SUFFIX)
        with open(bad, "wb") as f:
            f.write(b"GDKV" + (1).to_bytes(4, "little") + len(head).to_bytes(8, "little") + head)
        assert m.generate(RAW, 4).token_ids == cold           # (a TypeError here had ended every run)
        assert not os.path.exists(bad) and m.prompt_cache.rejected == 1
        m.close()


def test_a_folder_that_fails_turns_the_cache_off_not_the_run(tiny_path, folder):
    """A file where the identity's folder should be (as a read-only or full
    disk, a link loop): the run answers as a cold one, with one note."""
    m = load(tiny_path, folder)
    notes = []
    m.on_note = notes.append
    os.makedirs(folder)
    open(m.prompt_cache.folder, "w").close()
    cold = load(tiny_path).generate(RAW, 6, reuse_cache=False).token_ids
    for _ in range(2):
        r = m.generate(RAW, 6)
        assert r.token_ids == cold
        m._cache.reset()
    assert m.prompt_cache.off and len(notes) == 1 and f"the prompt cache ({folder}) is off for this run" in notes[0]
    m.close()


def test_an_entry_gone_or_unreadable_costs_the_hit_not_the_cache(tiny_path, folder, monkeypatch):
    """Another process evicting an entry while this one reads it, or an
    entry not readable now (too many open files): a cold prefill, the cache
    still on and the entry not deleted as corrupt (a vanished entry had
    turned the cache off for the rest of the process)."""
    from goosedump import promptcache
    load(tiny_path, folder).generate(RAW, 4)
    saved = entries(folder)
    assert saved
    m = load(tiny_path, folder)
    pc = m.prompt_cache
    real_open = open

    def too_many(*a, **kw):
        raise OSError(24, "Too many open files")
    monkeypatch.setattr(promptcache, "open", too_many, raising=False)
    assert m.generate(RAW, 4).cached_tokens == 0
    assert pc.off is None and pc.rejected == 0 and entries(folder) == saved
    monkeypatch.setattr(promptcache, "open", real_open, raising=False)
    pc._folder_mtime = None                   # (the folder unchanged: read it again as a later change would)
    real_load = pc._load

    def evicted_meanwhile(path, cache):
        arrays = real_load(path, cache)
        os.unlink(path)
        return arrays
    monkeypatch.setattr(pc, "_load", evicted_meanwhile)
    m._cache.reset()
    assert m.generate(RAW, 4).cached_tokens == len(RAW) - 1      # read before it went: used
    assert pc.off is None
    monkeypatch.setattr(pc, "_load", real_load)
    m._cache.reset()
    m.generate(RAW, 4)                        # saved again
    m._cache.reset()
    assert m.generate(RAW, 4).cached_tokens == len(RAW) - 1 and pc.off is None
    m.close()


def test_a_model_file_removed_after_loading_still_runs_with_its_cache(tiny_path, folder, tmp_path):
    """The identity reads the time of the file mapped, not of its path then
    (a file removed or replaced after loading had failed the first request)."""
    import shutil
    copy = str(tmp_path / "moved.gguf")
    shutil.copy(tiny_path, copy)
    m = load(copy, folder)
    os.unlink(copy)
    assert m.generate(RAW, 4).cached_tokens == 0 and entries(folder)
    m._cache.reset()
    assert m.generate(RAW, 4).cached_tokens == len(RAW) - 1
    m.close()


def test_an_entry_written_anew_since_it_was_indexed_is_read_as_it_is_now(tiny_path, folder):
    """Another process writes an entry anew (its header's length follows its
    run: another context, another header) in the same tick of the folder's
    clock: the reader takes the header from the file it opens, not the
    offset it had indexed (which had failed the checksum and deleted a
    sound entry)."""
    from goosedump.promptcache import _HEAD
    load(tiny_path, folder).generate(RAW, 4)
    m = load(tiny_path, folder)
    pc = m.prompt_cache
    pc._sync()                                            # indexed as it is now
    path = os.path.join(pc.folder, tokens_key(RAW) + SUFFIX)
    stamp = os.stat(pc.folder).st_mtime_ns
    with open(path, "rb") as f:
        magic, fmt, size = _HEAD.unpack(f.read(_HEAD.size))
        head, payload = json.loads(f.read(size)), f.read()
    longer = json.dumps(head, indent=2).encode()
    with open(path + ".new", "wb") as f:
        f.write(_HEAD.pack(magic, fmt, len(longer)) + longer + payload)
    os.replace(path + ".new", path)
    os.utime(pc.folder, ns=(stamp, stamp))                # within the same tick
    assert m.generate(RAW, 4).cached_tokens == len(RAW) - 1
    assert pc.rejected == 0 and os.path.exists(path)
    m.close()


def test_the_identity_takes_the_engines_code(tiny_path, monkeypatch):
    """An engine edited or rebuilt at the same version (from git) computes
    its own numbers: its Python modules and native extension are hashed
    into the identity, so another build never reads this one's entries."""
    from goosedump import promptcache
    files = promptcache.engine_files()
    names = {os.path.basename(f) for f in files}
    assert {"forward.py", "kvcache.py", "promptcache.py", os.path.basename(_kernels.__file__)} <= names
    assert not any("__pycache__" in f for f in files)
    m = load(tiny_path)
    before = model_identity(m.file, "int16")
    promptcache.engine_digest.cache_clear()
    monkeypatch.setattr(promptcache, "engine_files", lambda: files[:-1])     # as if a file had changed
    assert model_identity(m.file, "int16") != before
    promptcache.engine_digest.cache_clear()
    m.close()


def _write_entry_like(path, size, age):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"\0" * size)
    t = os.path.getmtime(path) - age
    os.utime(path, (t, t))


def test_the_cap_holds_for_every_identity_and_stale_files_go(tiny_path, folder):
    """One LRU order over the folder: an old model's entries age out (the cap
    had held per identity, and old identities' entries stayed forever), its
    emptied folder goes; a killed writer's old temporary file goes, a fresh
    one (a live writer's) stays."""
    m = load(tiny_path, folder)
    one = load(tiny_path, str(os.path.join(folder, "..", "probe")))
    one.generate(RAW, 2)
    size = os.path.getsize(entries(str(os.path.join(folder, "..", "probe")))[0])
    one.close()
    old = os.path.join(folder, "ab" * 12, "cd" * 16 + SUFFIX)
    _write_entry_like(old, size, age=3600)
    os.utime(os.path.dirname(old), (os.path.getmtime(old),) * 2)
    os.makedirs(m.prompt_cache.folder)
    stale, fresh = (os.path.join(m.prompt_cache.folder, n) for n in ("tmpold.tmp", "tmpnew.tmp"))
    _write_entry_like(stale, 10, age=3600)
    _write_entry_like(fresh, 10, age=0)
    m.prompt_cache.cap = int(1.5 * size)
    m.generate(RAW, 2)
    assert entries(folder) == [os.path.join(m.prompt_cache.folder, tokens_key(RAW) + SUFFIX)]
    assert not os.path.exists(os.path.dirname(old))
    assert not os.path.exists(stale) and os.path.exists(fresh)
    m.close()


def test_an_entry_larger_than_the_cap_is_not_written(tiny_path, folder, tmp_path):
    """Its payload within the cap, its whole file not: it had been written,
    then evicted everything, itself too."""
    probe = str(tmp_path / "probe")
    m = load(tiny_path, probe)
    m.generate(RAW, 2)
    size = os.path.getsize(entries(probe)[0])
    m.close()
    m = load(tiny_path, folder)
    small = list(range(3000, 3034))                  # a smaller entry, kept first
    m.prompt_cache.cap = size - 1
    m.generate(small, 2)
    kept = entries(folder)
    assert len(kept) == 1
    m.generate(RAW, 2)                               # its file is one byte over the cap
    assert entries(folder) == kept
    m.close()


def test_a_shorter_context_skips_a_longer_entry_and_keeps_it(tiny_path, folder):
    long = list(range(1000, 1200))
    m = load(tiny_path, folder)
    m.generate(long, 2)
    (entry,) = entries(folder)
    m.close()
    short = goosedump.load(tiny_path, n_ctx=199, options=Options.from_env(prompt_cache=folder))
    prompt = long[:196] + [7]
    r = short.generate(prompt, 2)
    assert r.cached_tokens == 0 and r.token_ids == load(tiny_path).generate(prompt, 2, reuse_cache=False).token_ids
    assert os.path.exists(entry) and short.prompt_cache.rejected == 0
    short.close()


def test_the_prompt_caches_writes_are_no_decode_time(tiny_path, folder, monkeypatch):
    """The entries written at a generation's end (the prompt's state) had
    been counted in decode_seconds and the decode rate."""
    m = load(tiny_path, folder)
    slow = PromptCache._save

    def late(self, *a, **kw):
        time.sleep(0.5)
        return slow(self, *a, **kw)
    monkeypatch.setattr(PromptCache, "_save", late)
    r = m.generate(chat_prompt(m, "Why is the sky blue?"), 3)
    assert entries(folder), "the state was written"
    assert r.decode_seconds < 0.5, r.decode_seconds
