"""Sizes given by users: the expert cache budget (flag or environment), and
"auto": the budget decided from the memory actually available."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping

ENV_EXPERT_CACHE = "GOOSEDUMP_EXPERT_CACHE_SIZE"
AUTO = "auto"
DEFAULT_EXPERT_CACHE = AUTO
MIN_SIZE, MAX_SIZE = 1 << 20, 1024 << 30
_FORM = "auto, or an integer followed by M or G, between 1M and 1024G (for example 512M or 2G)"
# Kept free of everything the run itself needs: the rest of the process
# (Python, the tokenizer, libraries) and the OS's own use of the limit.
MARGIN_BYTES, MARGIN_SHARE = 768 << 20, 0.05


class SizeError(ValueError):
    pass


def parse_size(text: str, source: str, auto_too: bool = False) -> int:
    """Bytes of "512M" / "2G"; `source` names the flag or variable for errors
    (auto_too: the flag takes auto as well, decided by its caller)."""
    form = _FORM if auto_too else _FORM.removeprefix("auto, or ")
    if isinstance(text, str) and text.strip().lower() == AUTO:
        raise SizeError(f"{source}={text!r}: auto is not a size here: expected {form}")
    m = re.fullmatch(r"\s*(\d+)\s*([MG])\s*", text or "")
    if not m:
        raise SizeError(f"{source}={text!r} is not a size: expected {form}")
    n = int(m.group(1)) << (20 if m.group(2) == "M" else 30)
    if not MIN_SIZE <= n <= MAX_SIZE:
        raise SizeError(f"{source}={text!r} is out of range: expected {form}")
    return n


def expert_cache_budget(flag: str | None = None, environ: Mapping[str, str] | None = None) -> int | str:
    """The expert cache budget: --expert-cache, else $GOOSEDUMP_EXPERT_CACHE_SIZE, else auto: bytes, or
    AUTO (decided by auto_budget once the model's sizes are known)."""
    for text, source in ((flag, "--expert-cache"),
                         ((os.environ if environ is None else environ).get(ENV_EXPERT_CACHE), ENV_EXPERT_CACHE)):
        if text is not None:
            return AUTO if text.strip().lower() == AUTO else parse_size(text, source, auto_too=True)
    return AUTO


# --- what the machine has -------------------------------------------------------

def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except OSError:
        return None


def _stat(text: str | None) -> dict[str, int]:
    out = {}
    for line in (text or "").splitlines():
        k, _, v = line.partition(" ")
        if v.strip().isdigit():
            out[k] = int(v)
    return out


def _cgroup_available(root: str = "/sys/fs/cgroup", proc: str = "/proc/self/cgroup") -> tuple[int, str] | None:
    """(bytes the process's memory cgroup can still take, its limit's file),
    counting its reclaimable page cache as available; None without a limit.
    Every cgroup from the process's own up to the root counts, the tightest
    room wins: a limit is often set on a parent (a slice, a pod) and its
    children left unlimited, and the leaf alone had read as no limit."""
    best = None
    for line in (_read(proc) or "").splitlines():
        hid, ctrl, path = (line.split(":", 2) + ["", ""])[:3]
        parts = [p for p in path.strip().split("/") if p]
        if hid == "0" and ctrl == "":          # v2: memory.max, memory.current, memory.stat
            base, files = root, ("memory.max", "memory.current", "inactive_file", "active_file")
        elif "memory" in ctrl.split(","):      # v1: memory.limit_in_bytes, memory.usage_in_bytes
            base, files = os.path.join(root, "memory"), ("memory.limit_in_bytes", "memory.usage_in_bytes",
                                                         "total_inactive_file", "total_active_file")
        else:
            continue
        for k in range(len(parts), -1, -1):    # the process's cgroup, then each parent
            d = os.path.join(base, *parts[:k])
            limit = (_read(os.path.join(d, files[0])) or "").strip()
            if not limit.isdigit() or int(limit) >= 1 << 60:     # (none here, or v1's "unlimited")
                continue
            used = int((_read(os.path.join(d, files[1])) or "0").strip() or 0)
            st = _stat(_read(os.path.join(d, "memory.stat")))
            free = int(limit) - used + st.get(files[2], 0) + st.get(files[3], 0)
            if best is None or free < best[0]:
                best = (max(0, free), os.path.join(d, files[0]))
    return best


def available_memory() -> tuple[int, str]:
    """(bytes this process can still use, where that figure comes from): the
    smaller of the memory cgroup's room (limit less usage, plus its
    reclaimable page cache) and the system's MemAvailable."""
    st = {k: v * 1024 for k, v in _stat((_read("/proc/meminfo") or "").replace(":", "").replace(" kB", "")).items()}
    avail = st.get("MemAvailable")
    where = "MemAvailable"
    group = _cgroup_available()
    if group is not None and (avail is None or group[0] < avail):
        avail, where = group[0], f"the memory cgroup's limit ({group[1]})"
    if avail is None:
        import psutil
        avail, where = int(psutil.virtual_memory().available), "psutil"
    return avail, where


@dataclass(frozen=True)
class AutoBudget:
    budget: int          # bytes of expert cache
    in_memory: bool      # every expert used in place
    available: int
    source: str          # where `available` came from
    note: str            # one line for the user

    @property
    def warning(self) -> str | None:
        return None if self.in_memory or "warning" not in self.note else self.note


def auto_budget(expert_bytes: int, slot_bytes: int, fixed_bytes: int, per_token_bytes: int,
                min_bytes: int, available: int | None = None, source: str = "") -> AutoBudget:
    """The budget where nothing is said: every expert in memory when they fit
    beside what the run needs anyway (fixed_bytes: dense weights, KV cache,
    scratch) and a margin; else the room left, streamed. per_token_bytes:
    one token's experts (top-k x layers x slot), below which a cache holds
    less than a token and its hit rate collapses; min_bytes: the least the
    store can work with (top-k slots)."""
    if available is None:
        available, source = available_memory()
    margin = MARGIN_BYTES + int(MARGIN_SHARE * available)
    room = available - fixed_bytes - margin
    fb = format_bytes
    if room >= expert_bytes:
        return AutoBudget(expert_bytes, True, available, source,
                          f"experts in memory ({fb(expert_bytes)}, with {fb(fixed_bytes)} for the rest of the run; "
                          f"{fb(available)} available by {source})")
    budget = max(min_bytes, room // slot_bytes * slot_bytes)
    note = (f"expert cache {fb(budget)} ({budget // slot_bytes} slots), streaming the rest of the experts' "
            f"{fb(expert_bytes)} ({fb(available)} available by {source}, {fb(fixed_bytes)} for dense weights, "
            f"KV cache and scratch)")
    warning = cliff_warning(budget, per_token_bytes)
    return AutoBudget(budget, False, available, source, note + (f"; {warning}" if warning else ""))


def cliff_warning(budget: int, per_token_bytes: int) -> str | None:
    """Said of a streamed budget that holds less than one token's experts:
    each token then evicts what the next would reuse."""
    if budget >= per_token_bytes:
        return None
    fb = format_bytes
    return (f"warning: an expert cache of {fb(budget)} is less than one token's experts ({fb(per_token_bytes)}): "
            f"expect a hit rate near 0 and every token to read about {fb(per_token_bytes)}; "
            f"{fb(per_token_bytes * 2)} or more avoids the cliff")


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError
