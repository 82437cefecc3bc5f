"""`goosedump chat`: an interactive conversation in the terminal, and the
printer that `run` shares with it (reasoning dimmed on stderr, the answer on
stdout, tool calls named)."""
from __future__ import annotations

import json
import signal
import sys
from contextlib import contextmanager

from .chat import ChatError
from .harmony import Delta

DIM, RESET = "\x1b[2m", "\x1b[0m"

HELP = """commands:
  /effort low|medium|high   set the reasoning effort
  /system TEXT              set the system message (/system alone clears it)
  /reset                    forget the conversation (the system message stays)
  /save FILE                write the conversation as JSON (OpenAI messages)
  /reasoning on|off         show or hide the model's reasoning
  /help                     this list
  /quit                     leave (or Ctrl-D); Ctrl-C stops the current answer"""


class ReplyPrinter:
    """Writes deltas as they stream: the answer (final, or text outside any
    channel) to `out`; reasoning to `err`, dimmed when `err` is a terminal,
    or not at all when hidden; a tool call's arguments after its name."""

    def __init__(self, out=sys.stdout, err=sys.stderr, show_reasoning: bool = True, color: bool | None = None):
        self.out, self.err, self.show_reasoning = out, err, show_reasoning
        self.color = err.isatty() if color is None else color
        self._where: tuple | None = None     # (channel, recipient) of the text being written

    def __call__(self, d: Delta) -> None:
        where = (d.channel, d.recipient)
        if d.recipient and d.recipient.startswith("functions."):
            if where != self._where:
                self._close()
                self.err.write(f"[tool call] {d.recipient[len('functions.'):]}(")
            self.err.write(d.text)
        elif d.channel == "analysis":
            if not self.show_reasoning:
                return
            if where != self._where:
                self._close()
                if self.color:
                    self.err.write(DIM)
                else:
                    self.err.write("[reasoning] ")
            self.err.write(d.text)
        else:
            if where != self._where:
                self._close()
            self.out.write(d.text)
            self.out.flush()
        self._where = where
        self.err.flush()

    def _close(self) -> None:
        """End what the previous channel wrote (a dim run, a call's paren)."""
        if self._where is None:
            return
        channel, recipient = self._where
        if recipient and recipient.startswith("functions."):
            self.err.write(")\n")
        elif channel == "analysis" and self.show_reasoning:
            self.err.write((RESET if self.color else "") + "\n")
        self._where = None

    def finish(self) -> None:
        self._close()
        self.out.flush()
        self.err.flush()


@contextmanager
def ctrl_c_cancels(stream):
    """While an answer streams, Ctrl-C asks it to stop before its next token
    (the model's state stays consistent) instead of raising mid-computation."""
    def handler(signum, frame):
        stream.cancel("interrupted")
    old = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


class ChatSession:
    def __init__(self, model, *, system: str | None, reasoning_effort: str, date: str | None, sampling,
                 max_tokens: int, show_reasoning: bool, profile: bool = False, out=sys.stdout, err=sys.stderr):
        self.model, self.system, self.effort, self.date = model, system, reasoning_effort, date
        self.sampling, self.max_tokens, self.show_reasoning = sampling, max_tokens, show_reasoning
        self.out, self.err, self.profile = out, err, profile
        self.history: list[dict] = []

    def messages(self) -> list[dict]:
        return ([{"role": "system", "content": self.system}] if self.system else []) + self.history

    def ask(self, text: str) -> None:
        self.history.append({"role": "user", "content": text})
        try:
            stream = self.model.chat_stream(self.messages(), self.max_tokens, reasoning_effort=self.effort,
                                            date=self.date, sampling=self.sampling, profile=self.profile)
        except (ChatError, ValueError) as e:   # e.g. the conversation outgrew the context
            self.history.pop()
            self.err.write(f"error: {e}\n")
            return
        printer = ReplyPrinter(self.out, self.err, self.show_reasoning)
        with ctrl_c_cancels(stream):
            for d in stream:
                printer(d)
        printer.finish()
        r = stream.result
        self.history.append(stream.reply.to_message())
        note = " [stopped]" if r.stop_reason == "interrupted" else ""
        self.out.write("\n")
        self.err.write(f"{DIM if self.err.isatty() else ''}[{r.generated_tokens} tokens, "
                       f"{r.decode_tokens_per_s:.1f} tok/s, prompt {r.prompt_tokens} "
                       f"({r.cached_tokens} cached), stop: {r.stop_reason}]{note}"
                       f"{RESET if self.err.isatty() else ''}\n")
        if self.profile:
            from .cli import print_cache, print_profile
            print_profile(r.profile, out=self.err)
            print_cache(r.expert_cache, out=self.err)
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
                    with open(arg, "w", encoding="utf-8") as f:
                        json.dump({"reasoning_effort": self.effort, "messages": self.messages()}, f,
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
