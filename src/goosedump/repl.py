"""`goosedump chat`: an interactive conversation in the terminal (the reply
printed by goosedump.terminal, as `run` prints it)."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

from .chat import TOKENS_KEY, ChatError, _text
from .harmony import CHANNEL, END, HEADER_LIMIT, HEADER_LIMIT_NAMED, MESSAGE, START
from .limits import MAX_FLAG_FILE
from .result import ContextOverflowError
from .terminal import DIM, RESET, ReplyPrinter, print_cache, print_profile, print_reply, print_timings

HELP = """commands:
  /effort low|medium|high   set the reasoning effort
  /system TEXT              set the system message (/system alone clears it)
  /reset                    forget the conversation (the system message stays)
  /save FILE                write the conversation as JSON (OpenAI messages)
  /load FILE                go on with a conversation /save wrote
  /reasoning on|off         show or hide the model's reasoning
  /help                     this list
  /quit                     leave (or Ctrl-D); Ctrl-C stops the current answer
ollama's spellings:
  /set parameter NAME VALUE temperature, top_p, top_k, min_p, seed, num_predict, repeat_penalty,
                            repeat_last_n, presence_penalty, frequency_penalty
  /set system TEXT          /system TEXT
  /set think [low|medium|high], /set nothink   reason (at that effort), or answer at once
  /set hidethinking, /set nohidethinking       /reasoning off, on
  /set format json, /set noformat              the answer a JSON object, or free
  /set verbose, /set quiet  timings after each answer, or not
  /show info|parameters|system                 the model, the sampling, the system message
  /clear                    /reset;  /bye  /quit;  /?  /help
  \"\"\" ... \"\"\"               a message of several lines"""

MAX_CONVERSATION = MAX_FLAG_FILE   # bytes /load reads at most, as run's -f files

# ollama's parameter names -> SamplingParams' (num_predict is the token limit)
PARAMETERS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed",
              "repeat_penalty": "repetition_penalty", "repeat_last_n": "repeat_last_n",
              "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty", "num_predict": None}


def interrupted_tokens(tok, ids) -> list[int]:
    """An interrupted answer's tokens as the next turn renders them, between
    <|start|>assistant and <|end|>: without a header the interrupt cut
    before its <|message|> (the header of a message after a <|start|>, or
    the first message's once it names a channel; longer runs of text are
    the parser's text, shown, and kept) and without an <|end|> of their own
    (the renderer adds it). A harmony message is a header, <|message|> and
    its text: `<|start|>assistant<|end|>` or a bare header is not one."""
    ids = list(ids)
    start, message, end, channel = (tok.special_token(t) for t in (START, MESSAGE, END, CHANNEL))
    last = max((i for i, t in enumerate(ids) if t == start), default=-1)
    tail = ids[last + 1:]
    # (the parser's own bound on a header: longer where it names a channel or recipient)
    limit = HEADER_LIMIT_NAMED if channel in tail or " to=" in " " + tok.decode(tail) else HEADER_LIMIT
    if message not in tail and len(tail) <= limit and (last >= 0 or channel in tail or not tail):
        ids = ids[:max(last, 0)]
    return ids[:-1] if ids and ids[-1] == end else ids

class ChatSession:
    def __init__(self, model, *, system: str | None, reasoning_effort: str, date: str | None, sampling,
                 max_tokens: int, show_reasoning: bool, profile: bool = False, out=sys.stdout, err=sys.stderr,
                 reasoning_budget: int | None = None, verbose: bool = False):
        self.model, self.system, self.effort, self.date = model, system, reasoning_effort, date
        self.reasoning_budget = reasoning_budget
        self.sampling, self.max_tokens, self.show_reasoning = sampling, max_tokens, show_reasoning
        self.out, self.err, self.profile, self.verbose = out, err, profile, verbose
        self.history: list[dict] = []
        self.response_format: dict | None = None

    def messages(self) -> list[dict]:
        return ([{"role": "system", "content": self.system}] if self.system else []) + self.history

    def ask(self, text: str) -> None:
        started = time.perf_counter()
        self.history.append({"role": "user", "content": text})
        try:
            # the answer takes what the context leaves, at most num_predict (-1: all of it)
            n = self.model.n_ctx if self.max_tokens == -1 else self.max_tokens
            stream = self.model.chat_stream(self.messages(), n, reasoning_effort=self.effort,
                                            date=self.date, sampling=self.sampling, profile=self.profile,
                                            reasoning_budget=self.reasoning_budget,
                                            response_format=self.response_format, fit_context=True)
            print_reply(stream, ReplyPrinter(self.out, self.err, self.show_reasoning), interruptible=True)
        except ContextOverflowError as e:
            self.history.pop()
            self.err.write(f"error: the conversation is full: its prompt takes {e.n_prompt} tokens of the "
                           f"context's {e.n_ctx} (-c/--ctx): /clear to start over\n")
            return
        except (ChatError, ValueError, MemoryError) as e:   # the turn fails; the chat goes on
            self.history.pop()
            self.err.write(f"error: {e}\n")
            return
        r = stream.result
        message = stream.reply.to_message()
        if r.stop_reason == "interrupted":
            # cut short: the next turn renders the tokens as the model wrote
            # them, so they stay in the KV cache instead of being re-tokenized
            message[TOKENS_KEY] = interrupted_tokens(self.model.tokenizer, r.token_ids)
        if message.get(TOKENS_KEY) != []:       # (an answer stopped before its first message: nothing to keep)
            self.history.append(message)
        self.out.write("\n")
        self.err.write(f"{DIM if self.err.isatty() else ''}[{r.generated_tokens} tokens, "
                       f"{r.decode_tokens_per_s:.1f} tok/s, prompt {r.prompt_tokens} "
                       f"({r.cached_tokens} cached), stop: {r.stop_reason}]"
                       f"{RESET if self.err.isatty() else ''}\n")
        if self.profile:
            print_profile(r.profile, out=self.err)
            print_cache(r.expert_cache, out=self.err)
        if self.verbose:
            print_timings(r, time.perf_counter() - started, out=self.err)
        self.out.flush()
        self.err.flush()

    def command(self, line: str) -> bool:
        """A /command; False means leave."""
        name, _, arg = line[1:].partition(" ")
        arg = arg.strip()
        if name in ("quit", "exit", "q", "bye"):
            return False
        name = {"clear": "reset", "?": "help"}.get(name, name)
        if name == "help":
            self.err.write(HELP + "\n")
        elif name == "set":
            self.set(arg)
        elif name == "show":
            self.show(arg)
        elif name == "load":
            if not arg:
                self.err.write("usage: /load FILE\n")
            else:
                self.load(arg)
        elif name == "effort":
            if arg not in ("low", "medium", "high"):
                self.err.write(f"usage: /effort low|medium|high (now {self.effort})\n")
            else:
                self.effort = arg
                self.err.write(f"reasoning effort: {arg}\n")
        elif name == "system":
            self.system = arg or None
            self.err.write(f"system message: {arg!r}\n" if arg else "system message cleared\n")
        elif name == "reset":
            self.history = []
            self.err.write("conversation cleared\n")
        elif name == "save":
            if not arg:
                self.err.write("usage: /save FILE\n")
            else:
                self.save(arg)
        elif name == "reasoning":
            if arg not in ("on", "off"):
                self.err.write("usage: /reasoning on|off\n")
            else:
                self.show_reasoning = arg == "on"
                self.err.write(f"reasoning {'shown' if self.show_reasoning else 'hidden'}\n")
        else:
            self.err.write(f"unknown command /{name}; /help lists them\n")
        self.err.flush()
        return True


    # -- ollama's /set, /show, and /load
    def set(self, arg: str) -> None:
        what, _, rest = arg.partition(" ")
        rest = rest.strip()
        if what == "parameter":
            name_value = rest.split(None, 1)
            if len(name_value) == 2:
                self.set_parameter(*name_value)
            else:
                self.err.write("usage: /set parameter NAME VALUE\n")
        elif what == "system":
            self.command(f"/system {rest}")
        elif what == "think" and rest in ("", "low", "medium", "high"):
            self.reasoning_budget = None
            if rest:
                self.effort = rest
            self.err.write(f"reasoning on (effort {self.effort})\n")
        elif what == "nothink":
            self.reasoning_budget = 0
            self.err.write("reasoning off: the answer comes at once\n")
        elif what in ("hidethinking", "nohidethinking"):
            self.command("/reasoning " + ("off" if what == "hidethinking" else "on"))
        elif what == "format" and rest == "json":
            self.response_format = {"type": "json_object"}
            self.err.write("answers are JSON objects\n")
        elif what == "noformat":
            self.response_format = None
            self.err.write("answers are free text\n")
        elif what in ("verbose", "quiet"):
            self.verbose = what == "verbose"
            self.err.write(f"timings {'on' if self.verbose else 'off'}\n")
        else:
            self.err.write(f"unknown /set {arg}; /help lists what /set takes\n")

    def set_parameter(self, name: str, value: str) -> None:
        if name not in PARAMETERS:
            hint = " (start goosedump chat with -c/--ctx)" if name == "num_ctx" else ""
            self.err.write(f"unknown parameter {name}{hint}; one of {', '.join(PARAMETERS)}\n")
            return
        kind = float if name in ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty",
                                 "frequency_penalty") else int
        try:
            number = kind(value)
        except ValueError:
            self.err.write(f"error: {name} takes {'a number' if kind is float else 'a whole number'}, "
                           f"got {value!r}\n")
            return
        try:
            if name == "num_predict":
                if number == 0 or number < -1:
                    raise ValueError(f"num_predict must be -1 (no limit) or at least 1, got {number}")
                self.max_tokens = number
            else:
                seed = name == "seed" and number == -1        # ollama's -1: a fresh seed each time
                self.sampling = dataclasses.replace(self.sampling, **{PARAMETERS[name]: None if seed else number})
        except ValueError as e:         # SamplingError is one
            self.err.write(f"error: {name}: {e}\n")
            return
        self.err.write(f"set {name} to {value}\n")

    def show(self, what: str) -> None:
        if what == "info":
            c = self.model.config
            self.err.write(f"model {self.model.path}: {c.n_layer} layers, {c.n_expert} experts (top "
                           f"{c.n_expert_used}), hidden {c.n_embd}, vocabulary {c.n_vocab}, context "
                           f"{self.model.n_ctx} of {c.context_length} tokens\n")
        elif what == "parameters":
            s = self.sampling
            self.err.write(f"temperature {s.temperature}, top_p {s.top_p}, top_k {s.top_k}, min_p {s.min_p}, "
                           f"repeat_penalty {s.repetition_penalty}, "
                           f"repeat_last_n {'unset' if s.repeat_last_n is None else s.repeat_last_n}, "
                           f"presence_penalty {s.presence_penalty}, "
                           f"frequency_penalty {s.frequency_penalty}, seed {'random' if s.seed is None else s.seed}, "
                           f"num_predict {self.max_tokens}, reasoning effort {self.effort}"
                           f"{', no reasoning' if self.reasoning_budget == 0 else ''}\n")
        elif what == "system":
            self.err.write(f"{self.system}\n" if self.system else "no system message\n")
        else:
            self.err.write("usage: /show info|parameters|system\n")

    def save(self, arg: str) -> None:
        """The conversation as JSON, written whole or not at all (a temporary
        file renamed into place: a failure leaves no half-written file)."""
        path = os.path.expanduser(arg)
        messages = [{k: v for k, v in m.items() if k != TOKENS_KEY} for m in self.messages()]
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            text = json.dumps({"reasoning_effort": self.effort, "messages": messages}, ensure_ascii=False, indent=2)
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
            self.err.write(f"saved {len(messages)} messages to {arg}\n")
        except OSError as e:
            self.err.write(f"error: cannot write {arg}: {e.strerror or e}\n")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def load(self, arg: str) -> None:
        """A conversation /save wrote: its messages (a system message first
        becomes the system message) and reasoning effort."""
        path = os.path.expanduser(arg)
        try:
            if os.path.exists(path) and not os.path.isfile(path):
                raise ValueError("not a file")
            if os.path.getsize(path) > MAX_CONVERSATION:
                raise ValueError(f"more than {MAX_CONVERSATION >> 20} MiB")
            with open(path, encoding="utf-8") as f:
                saved = json.load(f)
            if not isinstance(saved, dict) or "messages" not in saved:
                raise ValueError('expected a JSON object with "messages"')
            messages = saved["messages"]
            if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
                raise ValueError("its messages are not a list of messages with roles")
            effort = saved.get("reasoning_effort", self.effort)
            if effort not in ("low", "medium", "high"):
                raise ValueError(f"its reasoning_effort {effort!r} is not low, medium or high")
            n_vocab = self.model.tokenizer.n_vocab
            for i, m in enumerate(messages):
                ids = m.get(TOKENS_KEY)
                if isinstance(ids, list) and not all(type(t) is int and 0 <= t < n_vocab for t in ids):
                    raise ValueError(f"messages[{i}].{TOKENS_KEY} holds ids outside the vocabulary (0..{n_vocab - 1})")
            system = _text(messages[0].get("content"), "messages[0]") \
                if messages and messages[0]["role"] == "system" else None
            # the conversation as the chat will render it, so a bad message is said now, not at every turn
            # (an empty one, as /save writes after /clear, renders nothing yet)
            if messages:
                ids = self.model.render_chat(messages, reasoning_effort=effort, date=self.date)
                if len(ids) >= self.model.n_ctx:
                    raise ValueError(f"it takes {len(ids)} tokens, the whole context of {self.model.n_ctx} (-c/--ctx)")
        except OSError as e:
            self.err.write(f"error: cannot read {arg}: {e.strerror or e}\n")
            return
        except (ChatError, ValueError, KeyError, TypeError, MemoryError) as e:
            self.err.write(f"error: {arg} is not a conversation /save wrote: {e}\n")
            return
        self.system = system
        self.history = messages[1:] if system is not None else messages
        self.effort = effort
        self.err.write(f"loaded {len(messages)} messages from {arg}\n")


def read_message(first: str, more) -> str:
    """A message as typed: \"\"\" opens one of several lines (more() reads
    the next), up to the line that ends with \"\"\"; else the line itself."""
    if not first.startswith('"""'):
        return first
    text = first[3:]
    if text.endswith('"""') and len(first) >= 6:
        return text[:-3]
    lines = [text] if text else []
    while True:
        line = more()
        if line.rstrip().endswith('"""'):
            lines.append(line.rstrip()[:-3])
            return "\n".join(lines)
        lines.append(line)


def typed(prompt: str) -> str:
    """A line as input() reads it, bytes that are not UTF-8 (which reach it
    as lone surrogates) as U+FFFD: they could not be written back (/save)."""
    line = input(prompt)
    try:
        line.encode("utf-8")
        return line
    except UnicodeEncodeError:
        return line.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def run_chat(session: ChatSession, prompt: str = ">>> ", first: str | None = None) -> int:
    """The chat in the terminal (or from piped lines); first: a message
    answered before the first line is read."""
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    # bytes that are not UTF-8 reach typed() as lone surrogates whatever the
    # locale (a strict one had made input() raise, ending the chat)
    if hasattr(sys.stdin, "reconfigure"):
        sys.stdin.reconfigure(errors="surrogateescape")
    # (piped in, no prompts: they would go into the answers on stdout)
    piped = not sys.stdin.isatty()
    more = "" if piped else "... "
    prompt = "" if piped else prompt
    ended = False

    def next_line() -> str:
        """A message's next line; piped in, at the input's end, what was typed
        is sent (on a terminal Ctrl-D leaves, the message dropped)."""
        nonlocal ended
        try:
            return typed(more)
        except EOFError:
            if not piped:
                raise
            ended = True
            return '"""'

    session.err.write(f"chatting with {session.model.path} (reasoning effort {session.effort}); "
                      f"/help for commands, Ctrl-D to leave\n")
    session.err.flush()
    if first is not None and first.strip():
        if not piped:
            session.err.write(f"{prompt}{first}\n")
        try:
            session.ask(first)
        except KeyboardInterrupt:
            session.err.write("^C (Ctrl-D or /quit to leave)\n")
    while True:
        # a line, then (a message opened by \"\"\") its further lines; Ctrl-D
        # leaves, Ctrl-C drops what is being typed
        try:
            line = typed(prompt).strip()
            if line.startswith("/"):
                if not session.command(line):
                    return 0
                continue
            text = read_message(line, next_line)
        except EOFError:
            session.err.write("\n")
            return 0
        except KeyboardInterrupt:
            session.err.write("^C (Ctrl-D or /quit to leave)\n")
            continue
        if text.strip():
            session.ask(text)
        if ended:
            session.err.write("\n")
            return 0
