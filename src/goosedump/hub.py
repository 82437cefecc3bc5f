"""Models by name, the way llama.cpp (`-hf`) and ollama users name them. A
model argument that is not a local file is a Hugging Face repo id:

    REPO                 the repo's MXFP4 file (else its only model, else a list to choose from), as the
                         Hub lists it (offline: as the cache holds it)
    REPO:QUANT           the file (or split set) whose quant tag is QUANT (Q4_K_M, Q8_0, F16, MXFP4,
                         UD-Q4_K_XL...), else whose name carries it as llama.cpp matches it (a whole
                         word, then . or -); case-insensitive
    REPO:FILE.gguf       that file (folders included); a part of a split set brings the whole set
    hf.co/REPO[:QUANT]   ollama's spelling of the same (https://huggingface.co/REPO too)
    gpt-oss:20b          ollama's names of gpt-oss: ggml-org's MXFP4 repos
    FOLDER               a local folder's model, chosen as a repo's is (its own files first, then
                         its subfolders' two deep)

Files come into the standard Hugging Face cache (huggingface_hub), every
part of a split set, and are found there again without the network.
Offline, or when the Hub cannot be reached, this fails at once with what to
download and where to put it."""
from __future__ import annotations

import os
import queue
import re
import socket
import threading
from dataclasses import dataclass
from urllib.parse import urlparse

ENV_MODEL = "GOOSEDUMP_MODEL"
DEFAULT_REPO = "ggml-org/gpt-oss-20b-GGUF"
# What the default repos hold, for a precise offline message before any listing.
KNOWN_FILES = {"ggml-org/gpt-oss-20b-GGUF": ["gpt-oss-20b-mxfp4.gguf"],
               "ggml-org/gpt-oss-120b-GGUF": [f"gpt-oss-120b-mxfp4-0000{k}-of-00003.gguf" for k in (1, 2, 3)]}
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
# llama.cpp's gguf_filename_is_model: these GGUFs are not models
_NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
# ollama's names of the gpt-oss models, and the repos that hold the same MXFP4 files
OLLAMA_NAMES = {"gpt-oss": DEFAULT_REPO, "gpt-oss:latest": DEFAULT_REPO, "gpt-oss:20b": DEFAULT_REPO,
                "gpt-oss:120b": "ggml-org/gpt-oss-120b-GGUF"}
# what ollama and a browser put before a Hugging Face repo id
_HUB_PREFIX = re.compile(r"^(?:https?://)?(?:hf\.co|(?:www\.)?huggingface\.co)/", re.IGNORECASE)
LISTING_TIMEOUT = 60.0      # seconds the Hub's file listing may take (huggingface_hub sets no bound on it)
_TRUE = ("1", "ON", "YES", "TRUE")   # huggingface_hub's reading of a true environment variable


class ModelNotFoundError(FileNotFoundError):
    pass


class AmbiguousModelError(ModelNotFoundError):
    """Several models, none named: the message lists them."""


@dataclass(frozen=True)
class Name:
    repo: str
    file: str | None = None     # REPO:FILE.gguf
    tag: str | None = None      # REPO:QUANT

    def __str__(self) -> str:
        return self.repo + (f":{self.file or self.tag}" if self.file or self.tag else "")


def looks_like_path(arg: str) -> bool:
    """A mistyped path (./x.gguf, models/x.gguf, /abs/x) rather than a repo id."""
    if ":" in arg:
        repo = arg.split(":", 1)[0]
        return not _REPO.match(repo)
    return (arg.startswith((".", "/", "~")) or arg.lower().endswith(".gguf") or arg.count("/") != 1
            or not _REPO.match(arg))


def parse_name(arg: str) -> Name:
    repo, _, sel = arg.partition(":")
    if not _REPO.match(repo) or (":" in arg and not sel):
        raise ModelNotFoundError(f"{arg}: no such file, nor a Hugging Face repo id REPO[:QUANT] or REPO:FILE "
                                 f"(for example {DEFAULT_REPO} or unsloth/gpt-oss-20b-GGUF:Q4_K_M)")
    return named(repo, sel)


def named(repo: str, sel: str = "") -> Name:
    """repo with what follows its colon: a FILE (ends .gguf), a QUANT tag, or nothing."""
    if not sel:
        return Name(repo)
    return Name(repo, file=sel) if sel.lower().endswith(".gguf") else Name(repo, tag=sel)


def is_model(path: str) -> bool:
    base = os.path.basename(path).lower()
    return base.endswith(".gguf") and not any(x in base for x in _NOT_MODELS)


def split_set(path: str, files=()) -> list[str]:
    """Every part of path's split set, named as path names them (just [path]
    if not split): all count of them, whether files holds them or not (a set
    partly downloaded is not the set)."""
    m = _SPLIT.match(path)
    if m is None:
        return [path]
    return [path[:m.start("no")] + f"{k:05d}" + path[m.end("no"):] for k in range(1, int(m["count"]) + 1)]


def is_later_part(path: str) -> bool:
    m = _SPLIT.match(path)
    return m is not None and int(m["no"]) != 1


def choose(name: Name, files: list[str], sizes: dict[str, int] | None = None) -> list[str]:
    """The repo files the name stands for (a split set's parts in order),
    from the repo's file list; a clear error naming the choices otherwise."""
    models = [f for f in files if is_model(f)]
    if name.file is not None:
        if name.file not in files:
            raise ModelNotFoundError(f"{name.repo} has no file {name.file}; its models: {describe(models, sizes)}")
        return split_set(name.file, files)
    firsts = [f for f in models if not is_later_part(f)]
    if name.tag is not None:
        # the file whose tag is the name's (as `list` names it) first: F16 is not BF16's
        tagged = [f for f in firsts if (quant_tag(f) or "").upper() == name.tag.upper()]
        if len(tagged) > 1:         # (two models of one quant, a 20b's and a 120b's: the first had been taken)
            raise AmbiguousModelError(f"{len(tagged)} models of {name.repo} carry the quant tag {name.tag!r}; "
                                      f"name one as {name.repo}:FILE: {describe(tagged, sizes)}")
        if tagged:
            return split_set(tagged[0], files)
        # then llama.cpp's reading (TAG then . or -), the tag a whole word of the name
        pattern = re.compile(r"(?:^|[-._/])" + re.escape(name.tag) + r"[.-]", re.IGNORECASE)
        for f in firsts:
            if pattern.search(f):
                return split_set(f, files)
        raise ModelNotFoundError(f"no file of {name.repo} carries the quant tag {name.tag!r}; its models: "
                                 f"{describe(models, sizes)}")
    mxfp4 = [f for f in firsts if _is_mxfp4(f)]
    if mxfp4:
        return split_set(mxfp4[0], files)
    if len(firsts) == 1:
        return split_set(firsts[0], files)
    if not firsts:
        raise ModelNotFoundError(f"{name.repo} holds no GGUF model (files: {', '.join(files[:12]) or 'none'})")
    tags = sorted({t for f in firsts if (t := quant_tag(f))})
    raise AmbiguousModelError(f"{name.repo} holds {len(firsts)} models; name one, as {name.repo}:QUANT "
                             f"({', '.join(tags[:12]) or 'QUANT'}) or {name.repo}:FILE: {describe(models, sizes)}")


def _is_mxfp4(path: str) -> bool:
    """A file named as an MXFP4 one (its name, not its folders')."""
    return re.search(r"mxfp4[.-]", os.path.basename(path), re.IGNORECASE) is not None


def quant_tag(path: str) -> str | None:
    """The quant tag in a file name (gpt-oss-20b-Q4_K_M.gguf -> Q4_K_M), as llama.cpp reads it."""
    base = os.path.basename(path)
    m = _SPLIT.match(base)
    stem = m["prefix"] if m else base[:-5]
    t = re.search(r"[-.]((?:UD-)?[A-Za-z0-9_]+)$", stem)
    return t.group(1).upper() if t else None


def describe(files: list[str], sizes: dict[str, int] | None) -> str:
    from .budget import format_bytes
    out = []
    for f in files:
        if is_later_part(f):
            continue
        parts = split_set(f, files)
        size = sum((sizes or {}).get(p, 0) for p in parts)
        extra = f", {len(parts)} parts" if len(parts) > 1 else ""
        out.append(f"{f} ({format_bytes(size)}{extra})" if size else f"{f}{' (' + extra[2:] + ')' if extra else ''}")
    return "; ".join(out) or "none"


# --- the cache ----------------------------------------------------------------------

def _hf():
    try:
        import huggingface_hub as hf
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - a declared dependency
        raise ModelNotFoundError("huggingface_hub is not installed: pass a local .gguf file") from None
    return hf, constants


def cached_files(repo: str) -> dict[str, str]:
    """Repo path -> local path of the repo's files in the Hugging Face cache
    (the snapshot refs/main points at), without the network."""
    _, constants = _hf()
    folder = os.path.join(constants.HF_HUB_CACHE, "models--" + repo.replace("/", "--"))
    try:
        with open(os.path.join(folder, "refs", "main"), encoding="utf-8") as f:
            commit = f.read().strip()
    except OSError:
        return {}
    snap = os.path.join(folder, "snapshots", commit)
    out = {}
    for root, _, names in os.walk(snap):
        for n in names:
            local = os.path.join(root, n)
            if os.path.exists(local):           # a link to a blob that is there
                out[os.path.relpath(local, snap).replace(os.sep, "/")] = local
    return out


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """None when the Hub's host answers; else the reason."""
    # as huggingface_hub reads them: the first of the two that is set, true
    var = "HF_HUB_OFFLINE" if os.environ.get("HF_HUB_OFFLINE") else "TRANSFORMERS_OFFLINE"
    if os.environ.get(var, "").upper() in _TRUE:
        return f"{var} is set"
    _, constants = _hf()
    url = urlparse(constants.ENDPOINT)
    host = url.hostname or "huggingface.co"
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as e:
        return f"{host} is not reachable: {e}"


def _offline_error(arg: str, name: Name, why: str) -> ModelNotFoundError:
    _, constants = _hf()
    known = KNOWN_FILES.get(name.repo, [])
    if name.file:
        files, command = [name.file], f"hf download {name.repo} {name.file}"
    elif name.tag:
        files, command = [], f"hf download {name.repo} --include '*{name.tag}*'"
    elif known:
        files, command = known, f"hf download {name.repo} " + " ".join(known)
    else:
        files, command = [], f"hf download {name.repo} --include '*mxfp4*'"
    what = " and ".join(f"{name.repo}/{f}" for f in files) if files else \
        f"the {name.tag or 'MXFP4'} file(s) of {name.repo}"
    return ModelNotFoundError(
        f"{arg}: not a local file, and the Hugging Face Hub cannot be reached ({why}). Download {what} on a "
        f"connected machine (`{command}`) and pass the file's path (the first part of a split set), or copy "
        f"that machine's Hugging Face cache into {constants.HF_HUB_CACHE}.")


def resolve_model(arg: str | None, download: bool = True) -> str:
    """A local path for the model argument (None: $GOOSEDUMP_MODEL, else the
    default repo): the file, or the first part of a split set, downloading
    what the cache lacks."""
    try:
        return _resolve(arg, download)
    except ModelNotFoundError as e:
        if arg is None and os.environ.get(ENV_MODEL):     # (the user typed no model: say where it came from)
            raise ModelNotFoundError(f"${ENV_MODEL}: {e}") from None
        raise


def default_name() -> str:
    """The model named when none is: $GOOSEDUMP_MODEL, else the default repo."""
    return os.environ.get(ENV_MODEL) or DEFAULT_REPO


def _resolve(arg: str | None, download: bool) -> str:
    arg = default_name() if arg is None else arg
    if os.path.isfile(arg):
        return arg
    if os.path.lexists(arg) and not os.path.isdir(arg):
        # (a FIFO's open would wait for a writer; a dangling link is no "no such file")
        raise ModelNotFoundError(f"{arg}: " + ("a symbolic link to a file that does not exist "
                                               f"({os.readlink(arg)})" if os.path.islink(arg) and
                                               not os.path.exists(arg) else
                                               "not a regular file (a pipe, device or socket), not a GGUF model"))
    folder, _, sel = (arg, "", "") if os.path.isdir(arg) else arg.partition(":")
    if os.path.isdir(folder):                # FOLDER, FOLDER:QUANT, FOLDER:FILE
        local = _in_folder(folder, sel)
        if local is not None or not (_REPO.match(folder) or arg.lower() in OLLAMA_NAMES):
            if local is None:
                raise ModelNotFoundError(f"{folder}: a folder holding no GGUF model")
            return local
    arg = OLLAMA_NAMES.get(arg.lower(), arg)
    arg = _HUB_PREFIX.sub("", arg)                # hf.co/ORG/REPO:QUANT, as ollama names Hub models
    if looks_like_path(arg):
        raise ModelNotFoundError(f"{arg}: no such file" + (
            " (ollama's gpt-oss names are gpt-oss:20b and gpt-oss:120b)" if arg.lower().startswith("gpt-oss:")
            else ""))
    name = parse_name(arg)
    cached = cached_files(name.repo)
    choice_error = None
    try:
        wanted = choose(name, sorted(cached)) if cached else None
    except AmbiguousModelError as e:
        wanted, choice_error = None, e      # several cached (offline, the choices)
    except ModelNotFoundError:
        wanted = None                       # the cache may hold only part of the repo: ask the Hub
    have = bool(wanted) and all(w in cached for w in wanted)
    # A bare REPO is its MXFP4 file, else its only model: the only model cached is the repo's only one
    # only if the Hub says so (another quant pulled first had stood for the repo); offline it is taken.
    if have and (name.file or name.tag or _is_mxfp4(wanted[0])):
        return cached[wanted[0]]
    why = hub_unreachable()
    if why is not None:
        if have:
            return cached[wanted[0]]
        if choice_error is not None:
            # several models cached, none named: those are the choices there are
            raise ModelNotFoundError(f"{choice_error} (in the Hugging Face cache; the Hub cannot be reached: "
                                     f"{why})") from None
        raise _offline_error(arg, name, why)
    if not download:
        if have:
            return cached[wanted[0]]
        raise ModelNotFoundError(f"{arg}: not in the Hugging Face cache")
    try:
        return download_model(name)[0]
    except ModelNotFoundError as e:
        if not have:
            raise
        # (the Hub answered but would not list the repo: gone, private, a lapsed token, a 5xx, a timeout)
        import sys
        print(f"goosedump: note: {e}; using the model in the Hugging Face cache, {wanted[0]}", file=sys.stderr)
        return cached[wanted[0]]


def _in_folder(folder: str, sel: str = "") -> str | None:
    """The model in a local folder (as `hf download --local-dir` leaves one),
    chosen as a repo's is (sel: a QUANT or FILE, as after REPO:); None if it
    holds no GGUF model."""
    files = _folder_files(folder)
    if not any(is_model(f) for f in files):
        return None
    top = [f for f in files if "/" not in f]
    if any(is_model(f) for f in top) and not sel:
        files = top         # (a folder's own models before its subfolders')
    wanted = choose(named(folder.rstrip("/"), sel), files)
    missing = [w for w in wanted if w not in files]
    if missing:
        raise ModelNotFoundError(f"{folder}: the split set of {wanted[0]} lacks {', '.join(missing)}")
    return os.path.join(folder, wanted[0])


FOLDER_DEPTH = 2       # subfolders a local folder's models are looked for in (a repo's quant folders)


def _folder_files(folder: str) -> list[str]:
    """A local folder's files, as paths relative to it: its own and those of
    its subfolders FOLDER_DEPTH deep at most (unsloth's repos keep a split
    quant in a folder of its own; `inspect /` had walked the whole disk),
    hidden folders (.cache, .git) left out."""
    out = []
    for root, dirs, names in os.walk(folder):
        rel = os.path.relpath(root, folder)
        depth = 0 if rel == "." else rel.count(os.sep) + 1
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if depth < FOLDER_DEPTH else []
        out += [(n if rel == "." else os.path.join(rel, n)).replace(os.sep, "/") for n in names]
    return sorted(out)


def _listing(hf, repo: str) -> list:
    """The repo's files from the Hub, in a thread bounded by LISTING_TIMEOUT:
    huggingface_hub's client waits without a bound, and a host that takes
    the connection and never answers (a captive portal, a stalled proxy)
    had hung `pull` for good."""
    out: queue.Queue = queue.Queue()

    def fetch():
        try:
            out.put((True, [f for f in hf.list_repo_tree(repo, recursive=True) if hasattr(f, "size")]))
        except BaseException as e:       # (handed to the caller's thread)
            out.put((False, e))
    threading.Thread(target=fetch, daemon=True).start()
    try:
        ok, value = out.get(timeout=LISTING_TIMEOUT)
    except queue.Empty:
        raise ModelNotFoundError(f"{repo}: the Hugging Face Hub took the connection but did not answer in "
                                 f"{LISTING_TIMEOUT:g} s (a proxy or captive portal?)") from None
    if not ok:
        raise value
    return value


def download_model(name: Name) -> list[str]:
    """Download the files the name stands for (progress bars on a terminal);
    their local paths, first part first."""
    hf, _ = _hf()
    from huggingface_hub import errors
    try:
        listing = _listing(hf, name.repo)
        sizes = {f.path: f.size for f in listing}
        wanted = choose(name, sorted(sizes), sizes)
        return [hf.hf_hub_download(name.repo, f) for f in wanted]
    except errors.RepositoryNotFoundError:
        raise ModelNotFoundError(f"{name}: no such repo on the Hugging Face Hub (or it is private: log in with "
                                 f"`hf auth login`)") from None
    except errors.HfHubHTTPError as e:
        raise ModelNotFoundError(f"{name}: the Hugging Face Hub answered: {e}") from None
    except OSError as e:
        raise ModelNotFoundError(f"{name}: download failed: {e}") from None


def cached_models() -> list[dict]:
    """The GGUF models in the Hugging Face cache: name, local path, bytes,
    parts (one entry per file or split set)."""
    hf, constants = _hf()
    out = []
    if not os.path.isdir(constants.HF_HUB_CACHE):
        return out
    for entry in sorted(os.listdir(constants.HF_HUB_CACHE)):
        if not entry.startswith("models--"):
            continue
        repo = entry[len("models--"):].replace("--", "/", 1)
        files = cached_files(repo)
        names = sorted(files)
        # a set's first part, present or not (a set missing it is listed, as incomplete)
        firsts = sorted({split_set(f)[0] for f in names if is_model(f)})
        tags = [quant_tag(f) for f in firsts]
        for f, tag in zip(firsts, tags):
            parts = split_set(f, names)
            if tags.count(tag) > 1:
                tag = None          # (two models of one quant: each named by its file, the name `pull` takes)
            out.append({"name": f"{repo}:{tag}" if tag else f"{repo}:{f}", "repo": repo, "file": f,
                        "path": files.get(f), "parts": len(parts),
                        "bytes": sum(os.path.getsize(files[p]) for p in parts if p in files),
                        "complete": all(p in files for p in parts)})
    return out
