"""Models by name: a model argument that is not a local file is a Hugging Face
repo id ("ggml-org/gpt-oss-20b-GGUF", optionally ":FILE"), fetched into the
standard Hugging Face cache. Offline, this fails at once with what to
download and where to put it."""
from __future__ import annotations

import os
import re
import socket
from urllib.parse import urlparse

ENV_MODEL = "GOOSEDUMP_MODEL"
DEFAULT_REPO = "ggml-org/gpt-oss-20b-GGUF"
DEFAULT_FILES = {"ggml-org/gpt-oss-20b-GGUF": "gpt-oss-20b-mxfp4.gguf",
                 "ggml-org/gpt-oss-120b-GGUF": "gpt-oss-120b-mxfp4-00001-of-00003.gguf"}
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(:[\w./-]+\.gguf)?$")


class ModelNotFoundError(FileNotFoundError):
    pass


def _hub_reachable(timeout: float = 3.0) -> str | None:
    """None when the Hub's host answers DNS and TCP; else the reason."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False"):
        return "HF_HUB_OFFLINE is set"
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return None
    except OSError as e:
        return f"{host} is not reachable: {e}"


def resolve_model(arg: str | None) -> str:
    """A local path for the model argument (None: $GOOSEDUMP_MODEL, else the default repo)."""
    if arg is None:
        arg = os.environ.get(ENV_MODEL) or DEFAULT_REPO
    if os.path.exists(arg):
        return arg
    if not _REPO_ID.match(arg):
        raise ModelNotFoundError(f"{arg}: no such file (nor a Hugging Face repo id like {DEFAULT_REPO}[:FILE])")
    repo, _, filename = arg.partition(":")
    filename = filename or DEFAULT_FILES.get(repo)
    try:
        import huggingface_hub as hf
    except ImportError:  # pragma: no cover - a declared dependency
        raise ModelNotFoundError(f"{arg}: not a local file, and huggingface_hub is not installed") from None
    if filename is not None:
        cached = hf.try_to_load_from_cache(repo, filename)
        if isinstance(cached, str):
            return cached
    cache_dir = hf.constants.HF_HUB_CACHE
    what = f"{repo}/{filename}" if filename else f"a .gguf file of {repo}"
    offline = _hub_reachable()
    if offline is not None:
        command = " ".join(["hf download", repo] + ([filename] if filename else []))
        raise ModelNotFoundError(
            f"{arg}: not a local file, and the Hugging Face Hub cannot be reached ({offline}). "
            f"Download {what} on a connected machine (`{command}`) and pass the file's path, "
            f"or copy that machine's Hugging Face cache into {cache_dir}.")
    if filename is None:
        ggufs = sorted(f for f in hf.list_repo_files(repo) if f.endswith(".gguf"))
        if len(ggufs) != 1:
            raise ModelNotFoundError(f"{repo} holds {len(ggufs)} .gguf files; name one: {repo}:FILE "
                                     f"({', '.join(ggufs[:8])})")
        filename = ggufs[0]
    # hf_hub_download shows a progress bar and resumes partial downloads.
    return hf.hf_hub_download(repo, filename)
