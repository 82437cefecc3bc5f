"""`goosedump chat`: an interactive conversation in the terminal (the reply
printed by goosedump.terminal, as `run` prints it)."""
from __future__ import annotations

import json
import sys
import time

from .chat import TOKENS_KEY, ChatError
from .terminal import DIM, RESET, ReplyPrinter, print_cache, print_profile, print_reply, print_timings

HELP = """commands:
  /effort low|medium|high   set the reasoning effort
  /system TEXT              set the system message (/system alone clears it)
  /reset                    forget the conversation (the system message stays)
  /save FILE                write the conversation as JSON (OpenAI messages)
  /reasoning on|off         show or hide the model's reasoning
  /help                     this list
  /quit                     leave (or Ctrl-D); Ctrl-C stops the current answer"""


class ChatSession:
    def __init__(self, model, *, system: str | None, reasoning_effort: str, date: str | None, sampling,
                 max_tokens: int, show_reasoning: bool, profile: bool = False, out=sys.stdout, err=sys.stderr,
                 reasoning_budget: int | None = None, verbose: bool = False):
        self.model, self.system, self.effort, self.date = model, system, reasoning_effort, date
        self.reasoning_budget = reasoning_budget
        self.sampling, self.max_tokens, self.show_reasoning = sampling, max_tokens, show_reasoning
        self.out, self.err, self.profile, self.verbose = out, err, profile, verbose
        self.history: list[dict] = []

    def messages(self) -> list[dict]:
        return ([{"role": "system", "content": self.system}] if self.system else []) + self.history

    def ask(self, text: str) -> None:
        started = time.perf_counter()
        self.history.append({"role": "user", "content": text})
        try:
            n = self.max_tokens
            if n == -1:     # until the end of generation or the context
                ids = self.model.render_chat(self.messages(), reasoning_effort=self.effort, date=self.date)
                n = max(1, self.model.n_ctx - len(ids))
            stream = self.model.chat_stream(self.messages(), n, reasoning_effort=self.effort,
                                            date=self.date, sampling=self.sampling, profile=self.profile,
                                            reasoning_budget=self.reasoning_budget)
        except (ChatError, ValueError) as e:   # e.g. the conversation outgrew the context
            self.history.pop()
            self.err.write(f"error: {e}\n")
            return
        print_reply(stream, ReplyPrinter(self.out, self.err, self.show_reasoning), interruptible=True)
        r = stream.result
        message = stream.reply.to_message()
        if r.stop_reason == "interrupted":
            # cut short: the next turn renders the tokens as the model wrote
            # them, so they stay in the KV cache instead of being re-tokenized
            message[TOKENS_KEY] = list(r.token_ids)
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
        if name in ("quit", "exit", "q"):
            return False
        if name == "help":
            self.err.write(HELP + "\n")
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
                try:
                    messages = [{k: v for k, v in m.items() if k != TOKENS_KEY} for m in self.messages()]
                    with open(arg, "w", encoding="utf-8") as f:
                        json.dump({"reasoning_effort": self.effort, "messages": messages}, f,
                                  ensure_ascii=False, indent=2)
                    self.err.write(f"saved {len(self.messages())} messages to {arg}\n")
                except OSError as e:
                    self.err.write(f"error: cannot write {arg}: {e.strerror}\n")
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


def run_chat(session: ChatSession, prompt: str = ">>> ") -> int:
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    session.err.write(f"chatting with {session.model.path} (reasoning effort {session.effort}); "
                      f"/help for commands, Ctrl-D to leave\n")
    session.err.flush()
    while True:
        try:
            line = input(prompt)
        except EOFError:
            session.err.write("\n")
            return 0
        except KeyboardInterrupt:
            session.err.write("^C (Ctrl-D or /quit to leave)\n")
            continue
        line = line.strip()
        if not line:
            continue
        if line.startswith("/"):
            if not session.command(line):
                return 0
            continue
        session.ask(line)
