"""Sizes given by users: the expert cache budget (flag or environment)."""
from __future__ import annotations

import os
import re
from typing import Mapping

ENV_EXPERT_CACHE = "GOOSEDUMP_EXPERT_CACHE_SIZE"
DEFAULT_EXPERT_CACHE = "2G"
MIN_SIZE, MAX_SIZE = 1 << 20, 16 << 30
_FORM = "an integer followed by M or G, between 1M and 16G (for example 512M or 2G)"


class SizeError(ValueError):
    pass


def parse_size(text: str, source: str) -> int:
    """Bytes of "512M" / "2G"; `source` names the flag or variable for errors."""
    m = re.fullmatch(r"\s*(\d+)\s*([MG])\s*", text or "")
    if not m:
        raise SizeError(f"{source}={text!r} is not a size: expected {_FORM}")
    n = int(m.group(1)) << (20 if m.group(2) == "M" else 30)
    if not MIN_SIZE <= n <= MAX_SIZE:
        raise SizeError(f"{source}={text!r} is out of range: expected {_FORM}")
    return n


def expert_cache_budget(flag: str | None = None, environ: Mapping[str, str] | None = None) -> int:
    """The expert cache budget: --expert-cache, else $GOOSEDUMP_EXPERT_CACHE_SIZE, else 2G."""
    if flag is not None:
        return parse_size(flag, "--expert-cache")
    env = (os.environ if environ is None else environ).get(ENV_EXPERT_CACHE)
    if env is not None:
        return parse_size(env, ENV_EXPERT_CACHE)
    return parse_size(DEFAULT_EXPERT_CACHE, "default")


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError
