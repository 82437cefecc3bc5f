"""The harmony chat format of gpt-oss: messages in, prompt tokens out, and a
streaming parser for what the model writes back.

A message renders as

    <|start|>{author}[ to={recipient}][<|channel|>{channel}][ {content type}]<|message|>{text}<|end|>

with <|call|> instead of <|end|> for an assistant's tool call. The system and
developer messages carry structured content (identity, date, reasoning
effort, valid channels; instructions and tool signatures written as
TypeScript). The text of each piece is tokenised on its own, without special
tokens, exactly as openai-harmony does: token boundaries follow the pieces,
so the ids equal the official renderer's, not only the text.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable

from .tokenizer import Tokenizer
from .typescript import schema_to_typescript

MODEL_IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."
KNOWLEDGE_CUTOFF = "2024-06"
CHANNELS = ("analysis", "commentary", "final")
REASONING_EFFORTS = ("low", "medium", "high")
CONSTRAIN = "<|constrain|>"
# Formatting tokens: all are single special tokens of o200k_harmony.
START, MESSAGE, END, RETURN, CALL, CHANNEL = ("<|start|>", "<|message|>", "<|end|>", "<|return|>",
                                              "<|call|>", "<|channel|>")
FORMAT_TOKENS = (START, MESSAGE, END, RETURN, CALL, CHANNEL, CONSTRAIN)
ROLES = ("system", "developer", "user", "assistant", "tool")
FUNCTIONS = "functions."   # the namespace of function tools: a call goes to "functions.NAME"
# A header runs a dozen tokens ("<|channel|>commentary to=functions.x
# <|constrain|>json"); one that runs past this was never a header, and its
# tokens stream as the content of a message with no channel. One that names
# a channel or a recipient is a header: a tool's name (64 characters, digits
# a token each) takes it up to HEADER_LIMIT_NAMED.
HEADER_LIMIT = 48
HEADER_LIMIT_NAMED = 128


@dataclass
class Message:
    """One harmony message. For a tool's reply, role is "tool" and name is the
    tool ("functions.get_weather"): the name stands where the role would."""
    role: str
    text: str
    channel: str | None = None
    recipient: str | None = None
    content_type: str | None = None
    name: str | None = None
    # The tokens the model wrote after <|start|>assistant, rendered as they
    # were (an answer cut short: its tokens stay in the KV cache as they are)
    tokens: tuple[int, ...] | None = None


@dataclass
class Tool:
    name: str
    description: str = ""
    parameters: dict | None = None   # a JSON schema


@dataclass
class ResponseFormat:
    """A JSON schema the final answer follows, as the developer message's
    "# Response Formats" section names it (the format's guide)."""
    name: str
    schema: object
    description: str = ""


@dataclass
class SystemContent:
    reasoning_effort: str | None = "medium"
    date: str | None = None          # "Current date: ..." (the conversation's start)
    model_identity: str | None = MODEL_IDENTITY
    knowledge_cutoff: str | None = KNOWLEDGE_CUTOFF
    channels: tuple[str, ...] = CHANNELS


# --- system and developer content -------------------------------------------

def system_text(s: SystemContent, has_function_tools: bool) -> str:
    sections = []
    top = [x for x in (s.model_identity,
                       s.knowledge_cutoff and f"Knowledge cutoff: {s.knowledge_cutoff}",
                       s.date and f"Current date: {s.date}") if x]
    if top:
        sections.append("\n".join(top))
    if s.reasoning_effort:
        sections.append(f"Reasoning: {s.reasoning_effort}")
    if s.channels:
        header = f"# Valid channels: {', '.join(s.channels)}. Channel must be included for every message."
        if has_function_tools:
            header += "\nCalls to these tools must go to the commentary channel: 'functions'."
        sections.append(header)
    return "\n\n".join(sections)


def developer_text(instructions: str | None, tools: list[Tool], response_format: ResponseFormat | None = None) -> str:
    sections = []
    if instructions is not None:
        sections += ["# Instructions", instructions]
    if tools:
        sections.append(tools_section("functions", tools))
    if response_format is not None:
        sections.append(response_formats_section(response_format))
    return "\n\n".join(sections)


def response_formats_section(fmt: ResponseFormat) -> str:
    """The answer's schema at the developer message's end, as the format's
    guide writes it ("# Response Formats", "## {name}", "// {description}",
    the schema as compact JSON): the model reads the schema it was trained
    to answer in, while the sampler's grammar enforces it."""
    comment = "".join(f"// {ln}\n" for ln in _lines(fmt.description))
    schema = json.dumps(fmt.schema, ensure_ascii=False, separators=(",", ":"))
    return f"# Response Formats\n\n## {fmt.name}\n\n{comment}{schema}"


def _lines(text: str) -> list[str]:
    # Rust's str::lines: split on \n, drop one trailing empty line, and a \r
    # before a \n (a last line's own \r, with no \n after it, stays)
    if not text:
        return []
    lines = text.split("\n")
    last = lines.pop()
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in lines]
    return lines + [last] if last else lines


def tools_section(namespace: str, tools: list[Tool]) -> str:
    body = [f"## {namespace}\n", f"namespace {namespace} {{\n"]
    for t in tools:
        body += [f"// {ln}" for ln in _lines(t.description)]
        if t.parameters is not None:
            body.append(f"type {t.name} = (_: {schema_to_typescript(t.parameters, '')}) => any;\n")
        else:
            body.append(f"type {t.name} = () => any;\n")
    body.append(f"}} // namespace {namespace}")
    return "# Tools\n\n" + "\n".join(body)


# --- rendering ----------------------------------------------------------------

class Renderer:
    """Harmony messages to token ids with a tokenizer that holds the harmony
    special tokens."""

    def __init__(self, tokenizer: Tokenizer):
        self.tok = tokenizer
        self.special = {t: tokenizer.special_token(t) for t in FORMAT_TOKENS}

    def text(self, s: str) -> list[int]:
        return self.tok.encode(s)           # ordinary text: special tokens are not recognised

    def message(self, m: Message) -> list[int]:
        sp, text = self.special, self.text
        if m.tokens is not None:
            return [sp[START]] + text(m.role) + list(m.tokens) + [sp[END]]
        if m.role == "tool":
            if not m.name:
                raise ValueError("a tool message needs the tool's name (such as 'functions.get_weather')")
            ids = [sp[START]] + text(m.name)
        else:
            ids = [sp[START]] + text(m.role)
            if m.name:
                ids += text(f":{m.name}")
        if m.recipient is not None and m.recipient != "all":
            ids += text(f" to={m.recipient}")
        if m.channel is not None:
            ids += [sp[CHANNEL]] + text(m.channel)
        if m.content_type is not None:
            if m.content_type.startswith(CONSTRAIN):
                rest = m.content_type[len(CONSTRAIN):]
                ids += text(" ") + [sp[CONSTRAIN]] + (text(rest) if rest else [])
            else:
                ids += text(f" {m.content_type}")
        ids += [sp[MESSAGE]] + text(m.text)
        ids.append(sp[CALL] if m.role == "assistant" and m.recipient is not None else sp[END])
        return ids

    def conversation(self, messages: Iterable[Message], next_role: str | None = "assistant") -> list[int]:
        ids: list[int] = []
        for m in messages:
            ids += self.message(m)
        if next_role is not None:
            ids += [self.special[START]] + self.text(next_role)
        return ids


def drop_finished_reasoning(messages: list[Message]) -> list[Message]:
    """The format's rule for earlier turns: reasoning (the analysis channel)
    of every turn that ended in a final answer is dropped; reasoning after
    the last final answer (a turn still calling tools) is kept.
    openai-harmony's auto_drop_analysis agrees when the conversation holds
    one earlier answer; with several it keeps the later turns' reasoning,
    which the format's own guide says to drop, so we follow the guide."""
    last_final = max((i for i, m in enumerate(messages) if m.role == "assistant" and m.channel == "final"),
                     default=-1)
    return [m for i, m in enumerate(messages) if not (i < last_final and m.channel == "analysis")]


# --- parsing ------------------------------------------------------------------

@dataclass
class Delta:
    """New text of the message being written, with where it goes."""
    text: str
    channel: str | None
    recipient: str | None


@dataclass
class HarmonyParser:
    """Splits generated tokens into messages as they stream. Starts inside the
    header of an assistant message (the prompt ends with <|start|>assistant).
    <|end|>, <|return|> and <|call|> end a message; generation itself stops
    on <|return|> (an answer) or <|call|> (a tool call).

    Malformed output never raises: text outside a message opens an implicit
    assistant message, a header that never reaches <|message|> becomes a
    message whose text is what follows its channel (streamed once it runs
    past HEADER_LIMIT tokens, HEADER_LIMIT_NAMED where it names a channel
    or recipient; cut by the end of generation while naming a recipient,
    an empty message to it), an unknown role is read
    as a tool's name (as openai-harmony does)."""
    tokenizer: Tokenizer
    role: str | None = "assistant"
    messages: list[Message] = field(default_factory=list)

    def __post_init__(self):
        tok = self.tokenizer
        self._start, self._message = tok.special_token(START), tok.special_token(MESSAGE)
        self._stops = {tok.special_token(t) for t in (END, RETURN, CALL)}
        self._channel = tok.special_token(CHANNEL)
        self._header: list[int] | None = [] if self.role is not None else None
        self._current: Message | None = None   # the message being written: its header read, its text to come
        self._text: list[str] = []
        self._decoder = tok.stream_decoder()
        self.tokens: list[int] = []
        # Text of a message that never reached <|message|>: it could not
        # stream, so close() leaves it here for the caller to show.
        self.unstreamed: Delta | None = None
        # header tokens (the last fed among them) whose text the last feed
        # made a message's: a header run past HEADER_LIMIT
        self.adopted = 0

    @property
    def channel(self) -> str | None:
        return self._current.channel if self._current else None

    @property
    def recipient(self) -> str | None:
        return self._current.recipient if self._current else None

    @property
    def current_role(self) -> str | None:
        """The role of the message being written (None between messages)."""
        return self._current.role if self._current else None

    @property
    def text(self) -> str:
        """The text of the message being written, so far."""
        return "".join(self._text)

    @property
    def in_message(self) -> bool:
        return self._current is not None

    def feed(self, token: int) -> Delta | None:
        """One generated token; returns the text it adds to the current
        message's content, if any."""
        token = int(token)
        self.tokens.append(token)
        self.adopted = 0
        if self._current is not None:                 # inside a message's content
            if token in self._stops:
                self._finish()
                return None
            piece = self._decoder.add(token)
            if not piece:
                return None
            self._text.append(piece)
            return Delta(piece, self._current.channel, self._current.recipient)
        if self._header is None:                      # between messages
            if token == self._start:
                self._header = []
                return None
            self._header = []                         # malformed: text with no <|start|>
            self.role = self.role or "assistant"
        if token == self._message:
            self._current = self._parse_header(self._header, self.role)
            self._header, self.role = None, None
            return None
        if token in self._stops:                      # a header that never reached <|message|>
            self._finish_header_only()
            return None
        self._header.append(token)
        if len(self._header) > HEADER_LIMIT and not (len(self._header) <= HEADER_LIMIT_NAMED and self._named()):
            self._current = Message(self.role or self._header_role(), "")
            self.adopted = len(self._header)
            text = "".join(self._decoder.add(t) for t in self._header)
            self._header, self.role = None, None
            if text:
                self._text.append(text)
                return Delta(text, None, None)
        return None

    def close(self) -> list[Message]:
        """End of generation: a message left open is closed as it stands; a
        header cut before its <|message|> that names a recipient is an empty
        message (a tool call cut short), not text."""
        if self._current is not None:
            self._finish()
        elif self._header and self._names_recipient():
            self.messages.append(self._parse_header(self._header, self.role))
            self._header, self.role = None, None
        elif self._header:
            self._finish_header_only()
        return self.messages

    def _named(self) -> bool:
        """Whether the header so far names a channel or a recipient."""
        return self._channel in self._header or self._names_recipient()

    def _names_recipient(self) -> bool:
        return " to=" in " " + self.tokenizer.decode(self._header)

    def _finish(self) -> None:
        self._text.append(self._decoder.flush())
        self._current.text = "".join(self._text)
        self.messages.append(self._current)
        self._current, self._text, self._header = None, [], None
        self._decoder = self.tokenizer.stream_decoder()

    def _header_role(self) -> str:
        """The role a header after <|start|> names by its first word, as a
        full header's is read: a role, or an unknown word a tool's name (a
        message the model writes as someone else, which the reply drops)."""
        return _parse_header_text(self.tokenizer.decode(self._header), None, recipient_and_type=False)[0].role

    def _finish_header_only(self) -> None:
        # (role None: after <|start|>, the header's first word is its role, as in a full header; an unknown
        # one a tool's name, as openai-harmony reads it)
        h, rest = _parse_header_text(self.tokenizer.decode(self._header), self.role, recipient_and_type=False)
        h.text = rest
        self.messages.append(h)
        if rest:
            self.unstreamed = Delta(rest, h.channel, h.recipient)
        self._header, self.role = None, None

    def _parse_header(self, ids: list[int], role: str | None) -> Message:
        h, rest = _parse_header_text(self.tokenizer.decode(ids), role, recipient_and_type=True)
        if rest:   # stray words in the header: keep them in the content type rather than fail
            h.content_type = " ".join(x for x in (rest, h.content_type) if x)
        return h


def _parse_header_text(text: str, role: str | None, recipient_and_type: bool) -> tuple[Message, str]:
    """openai-harmony's header grammar: the channel follows <|channel|>; the
    rest splits on whitespace into role, recipient ("to=...") and content
    type."""
    channel = None
    i = text.find(CHANNEL)
    if i >= 0:
        after = text[i + len(CHANNEL):]
        end = next((j for j, ch in enumerate(after) if ch.isspace() or ch == "<"), len(after))
        channel = after[:end] or None
        text = text[:i] + after[end:]
    text = text.strip()
    if CONSTRAIN in text:
        text = text.replace(CONSTRAIN, " " + CONSTRAIN).strip()
    parts = text.split()
    name = None
    if role is None:
        first = parts[0] if parts else "assistant"
        if first in ROLES:
            role = first
        else:                                          # a tool speaking under its own name
            role, name = "tool", first
            if parts:
                parts.pop(0)
    if parts and parts[0] == role:
        parts.pop(0)
    recipient = content_type = None
    to = next((k for k, x in enumerate(parts) if x.startswith("to=")), None)
    if recipient_and_type and to is not None:       # the recipient wherever it stands; the last word the type
        recipient = parts.pop(to)[3:]
        if parts:
            content_type = parts.pop()
    elif recipient_and_type and parts:
        n = len(parts)
        last = parts.pop()
        if last.startswith("to="):
            recipient = last[3:]
        elif n == 1:
            recipient = last
        else:
            content_type = last
            r = parts.pop()
            recipient = r[3:] if r.startswith("to=") else r
    return Message(role, "", channel, recipient, content_type, name), " ".join(parts)
