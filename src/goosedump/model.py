"""A loaded model: the file, its config, its tokenizer and the layout of its
weights (what is dense, what streams through the expert cache)."""
from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass

from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from . import _kernels
from .budget import expert_cache_budget
from .config import ModelConfig, check_tensors, read_config
from .experts import PIECES as EXPERT_PIECES
from .experts import ExpertStore, slot_layout
from .forward import PREFILL_BATCH, KVCache, Transformer, kv_positions
from .generate import Generation, GenerationResult, check_context
from .gguf import GGUFFile
from .sampling import GREEDY, SamplingParams
from .tokenizer import Tokenizer

if TYPE_CHECKING:
    from .chat import ChatStream

DEFAULT_CTX = 4096


@dataclass(frozen=True)
class WeightLayout:
    dense_bytes: int           # memory-mapped, resident while running
    expert_bytes: int          # all experts of all layers
    expert_slot_bytes: int     # one expert's six pieces: one cache slot
    n_expert_slots: int        # layers x experts
    by_type: dict              # ggml type name -> (tensor count, bytes)


def weight_layout(f: GGUFFile, c: ModelConfig) -> WeightLayout:
    by_type: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    expert = 0
    for t in f.tensors.values():
        by_type[t.type_name][0] += 1
        by_type[t.type_name][1] += t.nbytes
        if t.name.split(".", 2)[-1] in EXPERT_PIECES:
            expert += t.nbytes
    total = sum(b for _, b in by_type.values())
    _, slot = slot_layout(f, c)
    return WeightLayout(total - expert, expert, slot, c.n_layer * c.n_expert,
                        {k: tuple(v) for k, v in sorted(by_type.items())})


@dataclass(frozen=True)
class MemoryEstimate:
    dense: int
    expert_cache: int
    expert_slots: int          # slots the budget holds
    experts_in_place: bool     # the budget covers every expert: no copies
    kv_cache: int
    scratch: int

    @property
    def total(self) -> int:
        return self.dense + self.expert_cache + self.kv_cache + self.scratch


def estimate_memory(c: ModelConfig, layout: WeightLayout, budget: int, ctx: int) -> MemoryEstimate:
    """What a run needs: dense weights, the expert cache (whole slots within
    the budget; all experts in place when it covers them), the fp16 KV cache
    (as KVCache allocates it) and prefill scratch buffers."""
    in_place = budget >= layout.n_expert_slots * layout.expert_slot_bytes   # as the store decides
    slots = layout.n_expert_slots if in_place else budget // layout.expert_slot_bytes
    per_pos = c.n_head_kv * (c.head_dim + c.value_dim) * 2
    kv = sum(per_pos * kv_positions(c, i, ctx) for i in range(c.n_layer))
    T = PREFILL_BATCH
    acts = T * (4 * c.n_embd + c.n_head * (c.head_dim + c.value_dim) + 2 * c.n_ff_expert) * 4
    scores = T * c.n_head * ctx * 4
    logits = c.n_vocab * 4 * 2
    experts = layout.expert_bytes if in_place else slots * layout.expert_slot_bytes   # in place: mapped
    return MemoryEstimate(layout.dense_bytes, experts, slots, in_place, kv, acts + scores + logits)


class Model:
    """`goosedump.load(path)` returns this."""

    def __init__(self, path: str | os.PathLike, n_ctx: int | None = None, threads: int | None = None,
                 expert_cache: str | int | None = None, page_cache: bool = False):
        self.path = os.fspath(path)
        self.file = GGUFFile(self.path)
        self.config: ModelConfig = read_config(self.file)
        check_tensors(self.file, self.config)
        self.tokenizer = Tokenizer(self.file)
        self.layout = weight_layout(self.file, self.config)
        if n_ctx is not None and not 1 <= n_ctx <= self.config.context_length:
            raise ValueError(f"n_ctx must be between 1 and the model's context length "
                             f"{self.config.context_length}, got {n_ctx}")
        self.n_ctx = n_ctx or min(DEFAULT_CTX, self.config.context_length)
        if threads is not None:
            if threads < 0:
                raise ValueError(f"threads must be 0 (one per core) or more, got {threads}")
            _kernels.set_num_threads(threads)
        # The expert cache budget: bytes, a size such as "2G", or None for
        # $GOOSEDUMP_EXPERT_CACHE_SIZE, else 2G.
        self.expert_budget = expert_cache if isinstance(expert_cache, int) else expert_cache_budget(expert_cache)
        self.page_cache = page_cache
        self._store: ExpertStore | None = None
        self._transformer: Transformer | None = None
        self._cache: KVCache | None = None

    @property
    def store(self) -> ExpertStore:
        if self._store is None:
            self._store = ExpertStore(self.file, self.config, self.expert_budget, page_cache=self.page_cache)
        return self._store

    @property
    def transformer(self) -> Transformer:
        if self._transformer is None:
            store = self.store
            self._transformer = Transformer(self.file, self.config, store)
            # Map the weights read in place now rather than fault page by page
            # inside the first tokens: the dense ones always, the experts too
            # when the budget covers them all.
            for t in self.file.tensors.values():
                if store.in_place or t.name.split(".", 2)[-1] not in EXPERT_PIECES:
                    self.file.populate(t.offset, t.offset + t.nbytes)
        return self._transformer

    def new_cache(self, n_ctx: int | None = None) -> KVCache:
        return KVCache(self.config, n_ctx or self.n_ctx)

    def _prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            # Raw text prompts may spell special tokens ("<|start|>..."), as in llama.cpp.
            return self.tokenizer.encode(prompt, allow_special=True)
        ids = [int(t) for t in prompt]
        bad = [t for t in ids if not 0 <= t < self.config.n_vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{self.config.n_vocab - 1})")
        return ids

    def generate_stream(self, prompt: str | Sequence[int], max_tokens: int = 256,
                        time_budget: float | None = None, profile: bool = False,
                        sampling: SamplingParams | None = None, reuse_cache: bool = True,
                        ignore_eos: bool = False) -> Generation:
        """Generation as an iterator of text pieces (each whole code points);
        its `.result` is the GenerationResult once exhausted. sampling: None
        for greedy. reuse_cache: keep the KV cache of the prefix this prompt
        shares with the previous generation's tokens (a conversation's next
        turn prefills only what is new)."""
        ids = self._prompt_ids(prompt)
        check_context(len(ids), max_tokens, self.n_ctx)
        if self._cache is None:
            self._cache = self.new_cache()
        return Generation(self.transformer, self.tokenizer, self._cache, ids, max_tokens, time_budget,
                          profile=profile, sampling=sampling or GREEDY, reuse_cache=reuse_cache,
                          ignore_eos=ignore_eos)

    def generate(self, prompt: str | Sequence[int], max_tokens: int = 256, time_budget: float | None = None,
                 on_text: Callable[[str], None] | None = None, profile: bool = False,
                 sampling: SamplingParams | None = None, reuse_cache: bool = True,
                 ignore_eos: bool = False) -> GenerationResult:
        """Generation from text (a raw completion) or token ids; greedy unless
        sampling says otherwise. Stops on an end-of-generation token,
        max_tokens, a repetition loop or the time budget (seconds).
        profile=True fills result.profile with where time, memory and
        routing went."""
        gen = self.generate_stream(prompt, max_tokens, time_budget, profile, sampling, reuse_cache, ignore_eos)
        for piece in gen:
            if on_text is not None:
                on_text(piece)
        assert gen.result is not None
        return gen.result

    def chat_stream(self, messages: Sequence[dict], max_tokens: int = 1024, *, reasoning_effort: str = "medium",
                    tools: Sequence[dict] | None = None, date: str | None = None,
                    sampling: SamplingParams | None = None, time_budget: float | None = None,
                    profile: bool = False, chat_format: str = "auto") -> "ChatStream":
        """A chat turn: the conversation rendered (render_chat), then generated
        and parsed as it streams. Iterate for harmony.Delta pieces (text with
        its channel); `.reply` and `.result` are set at the end."""
        from .chat import ChatStream
        ids = self.render_chat(messages, reasoning_effort=reasoning_effort, tools=tools, date=date,
                               chat_format=chat_format)
        return ChatStream(self.generate_stream(ids, max_tokens, time_budget, profile, sampling), self.tokenizer)

    def chat(self, messages: Sequence[dict], max_tokens: int = 1024, **kw) -> "ChatStream":
        """chat_stream run to its end: `.reply` (content, reasoning_content,
        tool_calls) and `.result` (tokens, timings)."""
        stream = self.chat_stream(messages, max_tokens, **kw)
        for _ in stream:
            pass
        return stream

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits at every position of tokens [T, V], from a fresh cache."""
        cache = self.new_cache(max(len(tokens), 1))
        return self.transformer.forward(np.asarray(tokens), cache, logits="all")

    @property
    def chat_template(self) -> str | None:
        return self.file.get("tokenizer.chat_template")

    def render_chat(self, messages: Sequence[dict], *, reasoning_effort: str = "medium",
                    tools: Sequence[dict] | None = None, date: str | None = None,
                    chat_format: str = "auto") -> list[int]:
        """Prompt tokens for an OpenAI-style conversation (see goosedump.chat):
        harmony for gpt-oss models, the GGUF's chat template otherwise or with
        chat_format="template". date is YYYY-MM-DD (default today)."""
        from .chat import render_chat
        return render_chat(self.tokenizer, self.chat_template, messages, reasoning_effort=reasoning_effort,
                           tools=tools, date=date, chat_format=chat_format)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
        self.file.close()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        c = self.config
        return (f"Model({self.path!r}, {c.n_layer} layers, {c.n_expert} experts, "
                f"hidden {c.n_embd}, vocab {c.n_vocab})")


def load(path: str | os.PathLike, n_ctx: int | None = None, threads: int | None = None,
         expert_cache: str | int | None = None, page_cache: bool = False) -> Model:
    """Open a GPT-OSS GGUF file: metadata, config, tensor checks, tokenizer.
    n_ctx: the context a generation may fill (default min(4096, the model's));
    threads: threads for the kernels (default one per core); expert_cache: the
    expert cache budget in bytes or as "2G" (default $GOOSEDUMP_EXPERT_CACHE_SIZE,
    else 2G; a budget covering every expert uses them in place); page_cache:
    leave the experts' pages in the OS page cache after reading them."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{os.fspath(path)}: no such file")
    return Model(path, n_ctx=n_ctx, threads=threads, expert_cache=expert_cache, page_cache=page_cache)
