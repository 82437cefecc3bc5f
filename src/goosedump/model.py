"""The front door: `goosedump.load(path)` opens a GGUF file and returns a Model,
which holds its config, tokenizer and weight layout, builds the forward pass
(goosedump.forward) and the expert store on first use, and generates through
the one step loop (goosedump.generate) with its own KV cache, kept from one
generation to the next so a conversation's next turn prefills only what is
new."""
from __future__ import annotations

import os
import threading
from typing import Callable, Sequence

import numpy as np

from . import _kernels
from .budget import AUTO, cliff_warning
from .config import ModelConfig, check_tensors, read_config
from .experts import ExpertStore
from .forward import Transformer
from .generate import Generation, GenerationResult, Stepper, check_prompt
from .gguf import GGUFError, GGUFFile
from .kvcache import KVCache
from .layout import auto_expert_budget, is_expert_tensor, weight_layout
from .options import Options
from .result import STOP_CANCELLED
from .reply import ReplyStream
from .sampling import SamplingParams
from .tokenizer import Tokenizer

DEFAULT_CTX = 4096


class Model:
    """`goosedump.load(path)` returns this."""

    def __init__(self, path: str | os.PathLike, n_ctx: int | None = None, options: Options | None = None):
        self.path = os.fspath(path)
        self.options = options or Options.from_env()
        self.file = GGUFFile(self.path)
        self.config: ModelConfig = read_config(self.file)
        check_tensors(self.file, self.config)
        self.tokenizer = Tokenizer(self.file)
        template = self.file.fields.get("tokenizer.chat_template")
        if template is not None and not isinstance(template.value, str):
            raise GGUFError(f"{self.path}: tokenizer.chat_template is {template.type.name}, expected a string "
                            "(a Jinja template)")
        self.layout = weight_layout(self.file, self.config)
        if n_ctx is not None and not 1 <= n_ctx <= self.config.context_length:
            raise ValueError(f"n_ctx must be between 1 and the model's context length "
                             f"{self.config.context_length}, got {n_ctx}")
        self.n_ctx = n_ctx or min(DEFAULT_CTX, self.config.context_length)
        if self.options.threads is not None:
            _kernels.set_num_threads(self.options.threads)   # the kernels' pool is one per process
        self._budget: int | None = None if self.options.expert_cache == AUTO else self.options.expert_cache
        self.budget_note: str | None = None   # what --expert-cache auto decided, and why
        self._store: ExpertStore | None = None
        self._transformer: Transformer | None = None
        self._stepper: Stepper | None = None
        self._prompt_cache = None
        self._cache: KVCache | None = None
        # the generation the cache is now that of, and the lock its steps take (generate_stream)
        self._cache_user: Generation | None = None
        self._cache_lock = threading.Lock()
        self._closed = False
        self.on_note: Callable[[str], None] | None = None   # where notes on loading go (the CLI: stderr)

    @property
    def expert_budget(self) -> int:
        """Bytes of expert cache: the option's, or with auto (the default)
        every expert in memory where they fit beside the rest of the run at
        this n_ctx, else the memory left (goosedump.budget.auto_budget).
        Decided once, when first needed."""
        if self._budget is None:
            auto = auto_expert_budget(self.config, self.layout, self.n_ctx, self.options.prefill_tokens,
                                      kv_caches=self.options.kv_caches)
            self._budget, self.budget_note = auto.budget, auto.note
        elif self.budget_note is None and self._budget < self.layout.n_expert_slots * self.layout.expert_slot_bytes:
            c = self.config
            self.budget_note = cliff_warning(self._budget, c.n_expert_used * c.n_layer * self.layout.expert_slot_bytes)
        return self._budget

    @property
    def store(self) -> ExpertStore:
        if self._store is None:
            o = self.options
            self._store = ExpertStore(self.file, self.config, self.expert_budget, page_cache=o.page_cache,
                                      read_threads=o.read_threads)
        return self._store

    @property
    def transformer(self) -> Transformer:
        if self._transformer is None:
            store = self.store
            self._transformer = Transformer(self.file, self.config, store, self.options)
            # Map the weights read in place now rather than fault page by page
            # inside the first tokens.
            for t in self._resident_tensors():
                self.file.populate_tensor(t)
            if self.options.huge_pages:
                self.reread_in_huge_pages()
        return self._transformer

    def _resident_tensors(self):
        """The tensors read in place from the map: the dense ones always, the
        experts too when the budget covers them all."""
        return [t for t in self.file.tensors.values() if self.store.in_place or not is_expert_tensor(t.name)]

    def reread_in_huge_pages(self) -> list:
        """The resident weights (the dense ones, and the experts when used in
        place) that the page cache holds in 4 KiB pages read again into 2 MiB
        ones (goosedump.residency), file by file; what was done
        (residency.Reread), each also said through on_note."""
        ranges: dict[int, list[tuple[int, int]]] = {}
        for t in self._resident_tensors():
            ranges.setdefault(t.part, []).append((t.offset, t.offset + t.nbytes))
        done = []
        for k, rs in sorted(ranges.items()):
            r = self.file.parts[k].reread_in_huge_pages(rs, self.on_note)
            if r is not None:
                done.append(r)
                if self.on_note is not None:
                    self.on_note(r.note())
        return done

    @property
    def stepper(self) -> Stepper:
        if self._stepper is None:
            self._stepper = Stepper(self.transformer, self.tokenizer, self.n_ctx, self.prompt_cache)
        return self._stepper

    @property
    def prompt_cache(self):
        """The prompt cache on disk (goosedump.promptcache) that
        options.prompt_cache names, or None."""
        o = self.options
        if o.prompt_cache is None:
            return None
        if self._prompt_cache is None:
            from .promptcache import PromptCache, model_identity
            self._prompt_cache = PromptCache(o.prompt_cache, model_identity(self.file, o.activations),
                                             o.prompt_cache_bytes, note=self._note)
        return self._prompt_cache

    def _note(self, text: str) -> None:
        """A note through on_note (set later than the prompt cache may be made), or to the log."""
        if self.on_note is not None:
            self.on_note(text)
        else:
            import logging
            logging.getLogger("goosedump").warning(text)

    def new_cache(self, n_ctx: int | None = None) -> KVCache:
        return KVCache(self.config, n_ctx or self.n_ctx)

    def generate_stream(self, prompt: str | Sequence[int], max_tokens: int = 256,
                        time_budget: float | None = None, profile: bool = False,
                        sampling: SamplingParams | None = None, reuse_cache: bool = True,
                        ignore_eos: bool = False, record_routing: bool = False, grammar: str | None = None,
                        json_schema: dict | str | None = None, constraint=None,
                        logprobs: int | None = None, prompt_logprobs: int | None = None) -> Generation:
        """Generation as an iterator of text pieces (each whole code points;
        `.events()` for (token id, piece) pairs); its `.result` is the
        GenerationResult once exhausted. sampling: None for greedy.
        reuse_cache: keep the KV cache of the prefix this prompt shares with
        the previous generation's tokens (a conversation's next turn prefills
        only what is new). record_routing: the result's `routing` lists the
        experts chosen per token and layer. grammar (GBNF or Lark text) or
        json_schema: the output follows it from its first token
        (goosedump.structured); constraint: a mask of one's own (allowed()
        -> bool [n_vocab], advance(token)). logprobs: the result's `logprobs`
        (and the generation's `token_logprobs` as it goes) give each generated
        token's log-probability and this many most likely alternatives
        (goosedump.logprobs; 0: none). prompt_logprobs: the result's
        `prompt_logprobs` give the same of each prompt token after the first
        (given the tokens before it; the whole prompt is then computed, no
        cached prefix reused)."""
        self._check_open()
        if isinstance(prompt, str):
            # Raw text prompts may spell special tokens ("<|start|>..."), as in llama.cpp.
            prompt = self.tokenizer.encode(prompt, allow_special=True)
        if grammar is not None or json_schema is not None:
            if constraint is not None:
                raise ValueError("give grammar, json_schema or constraint, one of them")
            from .reply_plan import raw_constraint
            constraint = raw_constraint(self.tokenizer, grammar, json_schema)
        gen = self.stepper.new(prompt, max_tokens, sampling, profile=profile, record_routing=record_routing,
                               time_budget=time_budget, reuse_cache=reuse_cache, ignore_eos=ignore_eos,
                               constraint=constraint, logprobs=logprobs, prompt_logprobs=prompt_logprobs)
        if self._cache is None:
            self._cache = self.new_cache()
        gen = self.stepper.drive(gen, self._cache)
        inner = gen._drive

        def step(g: Generation) -> None:
            # One cache serves the model's generations, one at a time: a step of one whose cache another
            # has written since (a stream set aside for another, two threads) would read the other's state,
            # and two had both given wrong tokens without a word. Whichever steps ends the other first,
            # cancelled: it stops with stop_reason "cancelled", its state not kept.
            with self._cache_lock:
                if g.done:
                    return
                user = self._cache_user
                if user is not g and user is not None and not user.done:
                    user.keep = False
                    user.cancel(STOP_CANCELLED)
                    self.stepper.finish(user, STOP_CANCELLED)
                self._cache_user = g
                inner(g)
        gen._drive = step
        return gen

    def generate(self, prompt: str | Sequence[int], max_tokens: int = 256, time_budget: float | None = None,
                 on_text: Callable[[str], None] | None = None, profile: bool = False,
                 sampling: SamplingParams | None = None, reuse_cache: bool = True,
                 ignore_eos: bool = False, record_routing: bool = False, grammar: str | None = None,
                 json_schema: dict | str | None = None, constraint=None,
                 logprobs: int | None = None, prompt_logprobs: int | None = None) -> GenerationResult:
        """Generation from text (a raw completion) or token ids; greedy unless
        sampling says otherwise. Stops on an end-of-generation token,
        max_tokens, a repetition loop or the time budget (seconds).
        profile=True fills result.profile with where time, memory and
        routing went."""
        gen = self.generate_stream(prompt, max_tokens, time_budget, profile, sampling, reuse_cache, ignore_eos,
                                   record_routing, grammar, json_schema, constraint, logprobs, prompt_logprobs)
        for piece in gen:
            if on_text is not None:
                on_text(piece)
        assert gen.result is not None
        return gen.result

    def chat_stream(self, messages: Sequence[dict], max_tokens: int = 1024, *, reasoning_effort: str = "medium",
                    tools: Sequence[dict] | None = None, date: str | None = None,
                    sampling: SamplingParams | None = None, time_budget: float | None = None,
                    profile: bool = False, chat_format: str = "auto", record_routing: bool = False,
                    tool_choice=None, response_format: dict | None = None, reasoning_budget: int | None = None,
                    grammar: str | None = None, json_schema: dict | str | None = None,
                    logprobs: int | None = None, continue_final_message: bool = False,
                    fit_context: bool = False) -> ReplyStream:
        """A chat turn: the conversation rendered (render_chat), then generated
        and parsed as it streams. Iterate for reply events (goosedump.reply:
        start, delta and end of reasoning, content and tool calls); `.reply`
        and `.result` are set at the end. tool_choice and response_format as
        OpenAI's (a named or required call; a JSON schema for the answer;
        tools with "strict": true constrain their arguments), grammar /
        json_schema as llama.cpp's; reasoning_budget ends the reasoning after
        so many tokens (0: none). Constraints apply where the harmony format
        says: the reasoning stays free (goosedump.structured).
        continue_final_message: a last assistant message is the reply's start
        (its content the answer's, or its reasoning only), which the reply
        continues; the reply holds what follows it. fit_context: max_tokens
        at most what the context leaves the prompt (else a prompt and
        max_tokens past the context are a ContextOverflowError)."""
        from .chat import ChatError, has_harmony_tokens, prefill_tokens, split_prefill
        from .reply_plan import plan_reply, tool_names
        harmony = chat_format != "template" and has_harmony_tokens(self.tokenizer)
        history, last = split_prefill(messages) if continue_final_message else (list(messages), None)
        if continue_final_message and last is None and not (messages and isinstance(messages[-1], dict)
                                                             and messages[-1].get("role") == "assistant"):
            raise ChatError("continue_final_message needs an assistant message last, the start of the reply")
        start = prefill_tokens(self.tokenizer, last, f"messages[{len(messages) - 1}]") if last is not None else None
        plan = plan_reply(self.tokenizer, tools, tool_choice, response_format, reasoning_budget, grammar,
                          json_schema, harmony, prefill=start)
        ids = self.render_chat(history, reasoning_effort=reasoning_effort, tools=plan.tools, date=date,
                               chat_format=chat_format, response_format=plan.response_format)
        prompt = ids + plan.prefix
        if fit_context:
            max_tokens = min(max_tokens, max(1, self.n_ctx - len(prompt)))
        gen = self.generate_stream(prompt, max_tokens, time_budget, profile, sampling,
                                   record_routing=record_routing, constraint=plan.gate(self.tokenizer),
                                   logprobs=logprobs)
        return ReplyStream(self.tokenizer, prefix=plan.prefix, generation=gen, tools=tool_names(plan.tools))

    def chat(self, messages: Sequence[dict], max_tokens: int = 1024, **kw) -> ReplyStream:
        """chat_stream run to its end: `.reply` (content, reasoning_content,
        tool_calls) and `.result` (tokens, timings)."""
        stream = self.chat_stream(messages, max_tokens, **kw)
        for _ in stream:
            pass
        return stream

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits at every position of tokens [T, V], from a fresh cache."""
        self._check_open()
        ids = check_prompt(tokens, self.config.n_vocab)
        cache = self.new_cache(max(len(ids), 1))
        tr = self.transformer
        return tr.head.logits(tr.forward(np.asarray(ids, dtype=np.int64), cache))

    @property
    def chat_template(self) -> str | None:
        return self.file.get("tokenizer.chat_template")

    def render_chat(self, messages: Sequence[dict], *, reasoning_effort: str = "medium",
                    tools: Sequence[dict] | None = None, date: str | None = None,
                    chat_format: str = "auto", model_identity: str | None = None,
                    response_format=None) -> list[int]:
        """Prompt tokens for an OpenAI-style conversation (see goosedump.chat):
        harmony for gpt-oss models, the GGUF's chat template otherwise or with
        chat_format="template". date is YYYY-MM-DD (default today);
        model_identity replaces the system message's "You are ChatGPT, ...";
        response_format: the answer's schema for the developer message, as
        OpenAI's response_format or a harmony.ResponseFormat (a ReplyPlan's)."""
        from .chat import render_chat
        if isinstance(response_format, dict):     # OpenAI's form, as chat() takes it
            from .reply_plan import format_grammar, rendered_format
            format_grammar(response_format)        # (checked: a PlanError names what is wrong)
            response_format = rendered_format(response_format)
        elif response_format is not None and not hasattr(response_format, "schema"):
            raise ValueError(f"response_format must be OpenAI's form (a dict: {{'type': 'json_schema', ...}}) or a "
                             f"harmony.ResponseFormat, got {response_format!r}")
        return render_chat(self.tokenizer, self.chat_template, messages, reasoning_effort=reasoning_effort,
                           tools=tools, date=date, chat_format=chat_format, model_identity=model_identity,
                           response_format=response_format)

    def close(self) -> None:
        self._closed = True
        if self._store is not None:
            self._store.close()
        self.file.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self.path}: the model is closed (load it again)")

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        c = self.config
        return (f"Model({self.path!r}, {c.n_layer} layers, {c.n_expert} experts, "
                f"hidden {c.n_embd}, vocab {c.n_vocab})")


def load(path: str | os.PathLike, n_ctx: int | None = None, threads: int | None = None,
         expert_cache: str | int | None = None, page_cache: bool = False, options: Options | None = None) -> Model:
    """Open a GPT-OSS GGUF file: metadata, config, tensor checks, tokenizer.
    n_ctx: the context a generation may fill (default min(4096, the model's));
    threads: threads for the kernels (default one per core); expert_cache: the
    expert cache budget in bytes, as "2G" or "auto" (default
    $GOOSEDUMP_EXPERT_CACHE_SIZE, else auto; a budget covering every expert
    uses them in place); page_cache:
    leave the experts' pages in the OS page cache after reading them. options:
    all runtime settings at once (goosedump.options.Options), instead of
    threads, expert_cache and page_cache."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{os.fspath(path)}: no such file")
    if n_ctx is not None and (isinstance(n_ctx, bool) or not isinstance(n_ctx, int)):
        raise ValueError(f"n_ctx must be a whole number of tokens, got {n_ctx!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or not 0 <= threads <= 4096):
        raise ValueError(f"threads must be a number of threads from 0 (one per core) to 4096, got {threads!r}")
    if expert_cache is not None and (isinstance(expert_cache, bool) or not isinstance(expert_cache, (int, str))):
        raise ValueError(f"expert_cache must be a number of bytes, a size such as '2G', or 'auto'; "
                         f"got {expert_cache!r}")
    if not isinstance(page_cache, bool):
        raise ValueError(f"page_cache must be True or False, got {page_cache!r}")
    if options is not None and (threads is not None or expert_cache is not None or page_cache):
        # (they had been dropped without a word)
        raise ValueError("give options, or threads, expert_cache and page_cache, not both: options holds them "
                         "(dataclasses.replace(options, threads=...))")
    if options is None:
        options = Options.from_env(expert_cache=expert_cache, threads=threads, page_cache=page_cache)
    return Model(path, n_ctx=n_ctx, options=options)
