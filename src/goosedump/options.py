"""Runtime settings, read once from flags and the environment into one frozen
object that the model, the forward pass and the expert store are given.
Nothing else reads the environment for these.

| setting       | flag             | environment                   | default             |
|---------------|------------------|-------------------------------|---------------------|
| threads       | --threads        |                               | one per core        |
| expert_cache  | --expert-cache   | GOOSEDUMP_EXPERT_CACHE_SIZE   | auto (see budget)   |
| page_cache    | --page-cache     |                               | off (direct reads)  |
| huge_pages    | --no-huge-pages  | GOOSEDUMP_HUGE_PAGES          | on (see residency)  |
| activations   |                  | GOOSEDUMP_ACTIVATIONS         | i16                 |
| read_threads  |                  | GOOSEDUMP_READ_THREADS        | 4                   |
| prefetch      |                  |                               | on                  |
| (kernels)     |                  | GOOSEDUMP_ISA                 | auto (generic, avx2, avx512, neon)|
| prompt_cache  | --prompt-cache   | GOOSEDUMP_PROMPT_CACHE        | off (the CLI: on)   |
| prompt_cache_bytes | --prompt-cache-size | GOOSEDUMP_PROMPT_CACHE_SIZE | 4G             |
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from . import _kernels
from .budget import AUTO, SizeError, expert_cache_budget, parse_size
from .machine import cpu_name

ENV_ACTIVATIONS = "GOOSEDUMP_ACTIVATIONS"
ENV_READ_THREADS = "GOOSEDUMP_READ_THREADS"
ENV_PROMPT_CACHE = "GOOSEDUMP_PROMPT_CACHE"
ENV_ISA = "GOOSEDUMP_ISA"      # read by the kernels (csrc/cpu.cpp); checked here for a clear error
ISAS = ("auto", "generic", "avx2", "avx512", "neon")
ENV_PROMPT_CACHE_SIZE = "GOOSEDUMP_PROMPT_CACHE_SIZE"
ENV_HUGE_PAGES = "GOOSEDUMP_HUGE_PAGES"
ON = ("on", "yes", "1")
OFF = ("off", "none", "no", "0", "")
# Precision of activations inside quantized products (csrc/matmul.h): "i16"
# (chosen by benchmarks/activation_precision.py: within a factor 2-4 of fp32's
# agreement with the reference, at 1.5-2.4x its speed) or "f32".
ACTIVATIONS = ("i16", "f32")


@dataclass(frozen=True)
class Options:
    # bytes of expert slots (covering every expert: used in place), or "auto":
    # decided from the memory available once the model is known (Model.expert_budget)
    expert_cache: int | str = AUTO
    threads: int | None = None    # kernel threads; None: leave the pool as it is (one per core), 0: one per core
    page_cache: bool = False      # read experts through the OS page cache and leave them there
    prefetch: bool = True         # read the next layer's likely experts while this one computes
    activations: str = "i16"
    read_threads: int = 4         # expert reads in flight at once
    # tokens a prompt's pass takes layer by layer (each streamed expert read
    # once per layer for all of them; ~12 KiB of activations per token)
    prefill_tokens: int = 4096
    # the folder of KV states of prompt prefixes kept on disk (goosedump.promptcache), None: off
    prompt_cache: str | None = None
    prompt_cache_bytes: int = 4 << 30
    # re-read resident weights that the page cache holds in 4 KiB pages into
    # 2 MiB ones (goosedump.residency)
    huge_pages: bool = True
    # KV caches the run may hold at once (serve: --max-batch), each a context's: auto counts them all
    kv_caches: int = 1

    def __post_init__(self):
        if self.activations not in ACTIVATIONS:
            raise ValueError(f"activations must be one of {', '.join(ACTIVATIONS)}, got {self.activations!r}")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 0):
            raise ValueError(f"threads must be 0 (one per core) or more, got {self.threads!r}")
        if not isinstance(self.read_threads, int) or self.read_threads < 1:
            raise ValueError(f"read_threads must be at least 1, got {self.read_threads!r}")
        if self.expert_cache != AUTO and (not isinstance(self.expert_cache, int) or self.expert_cache < 1):
            raise ValueError(f"expert_cache must be a positive number of bytes or 'auto', got "
                             f"{self.expert_cache!r}")

    @classmethod
    def from_env(cls, *, expert_cache: str | int | None = None, threads: int | None = None,
                 page_cache: bool = False, prefetch: bool = True, prompt_cache: str | None = None,
                 prompt_cache_size: str | None = None, huge_pages: bool | None = None,
                 env: Mapping[str, str] | None = None) -> "Options":
        """Flags first, then the environment, then the defaults. Errors name
        the flag or the variable. prompt_cache: a folder or "off"."""
        env = os.environ if env is None else env
        folder = prompt_cache if prompt_cache is not None else env.get(ENV_PROMPT_CACHE)
        folder = None if folder is None or folder.strip().lower() in OFF else os.path.expanduser(folder)
        if prompt_cache_size is not None:
            cache_bytes = parse_size(prompt_cache_size, "--prompt-cache-size")
        elif env.get(ENV_PROMPT_CACHE_SIZE) and folder is not None:     # (read where there is a cache)
            cache_bytes = parse_size(env[ENV_PROMPT_CACHE_SIZE], ENV_PROMPT_CACHE_SIZE)
        else:
            cache_bytes = 4 << 30
        budget = expert_cache if isinstance(expert_cache, int) else expert_cache_budget(expert_cache, env)
        acts = env.get(ENV_ACTIVATIONS, "i16")
        if acts not in ACTIVATIONS:
            raise ValueError(f"{ENV_ACTIVATIONS}={acts!r}: expected one of {', '.join(ACTIVATIONS)}")
        isa = env.get(ENV_ISA, "auto")
        if isa not in ISAS:
            raise ValueError(f"{ENV_ISA}={isa!r}: expected one of {', '.join(ISAS)}")
        here = ["auto", *_kernels.available_impls()]
        if isa not in here:
            raise ValueError(f"{ENV_ISA}={isa!r}: this CPU ({cpu_name()}) cannot run it; expected one of "
                             f"{', '.join(here)}")
        raw = env.get(ENV_READ_THREADS, "4")
        try:
            read_threads = int(raw)
        except ValueError:
            read_threads = 0
        if read_threads < 1:
            raise ValueError(f"{ENV_READ_THREADS}={raw!r}: expected an integer of at least 1")
        if huge_pages is None:
            raw = (env.get(ENV_HUGE_PAGES) or "on").strip().lower()   # (set but empty: the default)
            if raw not in ON + OFF:
                raise ValueError(f"{ENV_HUGE_PAGES}={env[ENV_HUGE_PAGES]!r}: expected on or off")
            huge_pages = raw in ON
        return cls(expert_cache=budget, threads=threads, page_cache=page_cache, prefetch=prefetch,
                   activations=acts, read_threads=read_threads, prompt_cache=folder, prompt_cache_bytes=cache_bytes,
                   huge_pages=huge_pages)


__all__ = ["Options", "SizeError", "ENV_ACTIVATIONS", "ENV_READ_THREADS", "ENV_PROMPT_CACHE",
           "ENV_PROMPT_CACHE_SIZE", "ENV_HUGE_PAGES"]
