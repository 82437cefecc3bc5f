"""The reply layer: what the model writes in the harmony format, as the items
OpenAI's APIs return, streamed as events.

Generated token ids go in; out come ("start", item, ""), ("delta", item,
text) and ("end", item, "") events, each item one harmony message of the
reply:
- "reasoning": the analysis channel;
- "content": the final channel, a preamble (commentary to no one) or text
  outside any channel (a model that ignores the format);
- "tool_call": a message to functions.NAME, or to a bare NAME (its text:
  the JSON arguments).
A message the model writes as someone else (a user, a tool) is dropped.

Everything that shows a reply consumes these events: the terminal printer
(goosedump.terminal), the chat-completions chunks and the Responses API's
events (goosedump.server). `Reply` is their fold: content, reasoning_content
and tool_calls as OpenAI-compatible servers return them.
"""
from __future__ import annotations

import json
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Iterator, NamedTuple, Sequence

from . import harmony
from .harmony import FUNCTIONS, HarmonyParser


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def function_name(recipient: str | None, channel: str | None = None, tools: frozenset = frozenset()) -> str | None:
    """NAME of a recipient "functions.NAME", else None. gpt-oss also writes
    a bare `to=NAME` (in long contexts especially, as vLLM found): the name
    of a function the request declares (tools), on the channels calls take,
    is that function's call too (a lone word after the channel is also read
    as a recipient, and is mostly a content type: json, markdown, code)."""
    if recipient and recipient.startswith(FUNCTIONS):
        return recipient[len(FUNCTIONS):]
    if recipient in tools and channel in ("commentary", "analysis"):
        return recipient
    return None


def item_kind(role: str | None, channel: str | None, recipient: str | None,
              tools: frozenset = frozenset()) -> str | None:
    if function_name(recipient, channel, tools) is not None and \
            (role == "assistant" or recipient.startswith(FUNCTIONS)):
        return "tool_call"
    if recipient is not None and not recipient.startswith("<|") and ("." in recipient or recipient == "python"):
        return None    # a call to a tool this API does not serve (browser.search, python): not the answer
    if channel == "analysis":
        return "reasoning"
    if role == "assistant":
        return "content"
    return None        # a message the model wrote as someone else: dropped


@dataclass
class Item:
    """One harmony message of the reply."""
    kind: str               # "reasoning", "content" or "tool_call"
    index: int              # among the reply's items
    seq: int                # among the items of its kind (a tool call's index)
    id: str
    name: str | None = None     # the function of a tool call
    call_id: str | None = None
    text: str = ""          # emitted so far (the whole of it once ended)
    received: str = ""      # the parser's text of the message (before the stop filter)
    cut: bool = False       # ended by the end of generation, not by its own end token
    done: bool = False


class ReplyEvent(NamedTuple):
    what: str        # "start", "delta" or "end"
    item: Item
    text: str = ""


class StopFilter:
    """Stop strings over a text that arrives in pieces: text that could be the
    start of a stop string is held back until the next piece decides."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.held = ""
        self.hit = False
        self.matched: str | None = None    # the stop string that ended the text

    def push(self, piece: str) -> str:
        """The part of held + piece that is safe to emit; sets .hit and
        .matched (and drops the rest) when a stop string appears."""
        buf = self.held + piece
        found = [(i, s) for i, s in ((buf.find(s), s) for s in self.stops) if i >= 0]
        if found:
            at, self.matched = min(found, key=lambda f: f[0])
            self.held, self.hit = "", True
            return buf[:at]
        keep = 0      # the longest tail of buf that begins some stop string
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), keep, -1):
                if s.startswith(buf[-n:]):
                    keep = n
                    break
        self.held = buf[len(buf) - keep:]
        return buf[:len(buf) - keep]

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


@dataclass
class Reply:
    """What the assistant said, split as OpenAI-compatible servers return it."""
    content: str = ""
    reasoning_content: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    messages: list[harmony.Message] = field(default_factory=list)   # the parsed harmony messages

    @classmethod
    def fold(cls, items: Iterable[Item], messages: Sequence[harmony.Message] = ()) -> "Reply":
        """The reply of a stream's items: content joined, reasoning items
        joined by a newline, tool calls in order."""
        items = list(items)
        return cls("".join(i.text for i in items if i.kind == "content"),
                   "\n".join(i.text for i in items if i.kind == "reasoning"),
                   [{"id": i.call_id, "type": "function", "function": {"name": i.name, "arguments": i.text}}
                    for i in items if i.kind == "tool_call"],
                   list(messages))

    def to_message(self) -> dict:
        """The reply as an assistant message for the next turn's history."""
        m: dict = {"role": "assistant", "content": self.content}
        if self.reasoning_content:
            m["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            m["tool_calls"] = self.tool_calls
        return m


def call_arguments(item: Item) -> dict | None:
    """A tool call item's arguments as an object, for the APIs that return
    them so (ollama's, Anthropic's); None where they are not one: cut by the
    token limit before they closed."""
    try:
        args = json.loads(item.text)
    except json.JSONDecodeError:
        return None
    return args if isinstance(args, dict) else None


def new_item(kind: str, index: int, seq: int, recipient: str | None, channel: str | None = None,
             tools: frozenset = frozenset()) -> Item:
    item = Item(kind, index, seq, new_id({"reasoning": "rs_", "content": "msg_", "tool_call": "fc_"}[kind]))
    if kind == "tool_call":
        item.name, item.call_id = function_name(recipient, channel, tools), new_id("call_")
    return item


def reply_from_messages(messages: Sequence[harmony.Message], tools: Sequence[str] = ()) -> Reply:
    """The reply of whole harmony messages, split as a stream of them is
    (tools: the functions the request declares)."""
    items: list[Item] = []
    counts: Counter = Counter()
    tools = frozenset(tools)
    for m in messages:
        kind = item_kind(m.role, m.channel, m.recipient, tools)
        if kind is not None:
            items.append(new_item(kind, len(items), counts[kind], m.recipient, m.channel, tools))
            items[-1].text = m.text
            counts[kind] += 1
    return Reply.fold(items, messages)


class ReplyStream:
    """Generated token ids of a harmony reply in, ReplyEvents out (`feed`,
    then `close` at the end of generation). Stop strings cut the content
    (`stopped` then says so); `prefix`: tokens of the reply already in the
    prompt (a forced tool call's header, a prefill the reply continues):
    parsed, never sent. Bound to a generation, iterating runs it and gives
    its events, and `cancel()` stops it."""

    def __init__(self, tokenizer, stop: list[str] | None = None, prefix: Sequence[int] = (), generation=None,
                 tools: Sequence[str] = ()):
        self.tools = frozenset(tools)       # the functions the request declares (function_name's bare names)
        self.parser = HarmonyParser(tokenizer)
        for t in prefix:
            self.parser.feed(t)
        self.stop = StopFilter(stop) if stop else None
        self.generation = generation
        self.items: list[Item] = []
        self._by_message: dict[int, Item | None] = {}   # parser message index -> its item
        self._counts: Counter = Counter()
        self._ended = len(self.parser.messages)   # parser messages whose items are ended (the prefix's: none)
        self._open_at, self._prefilled = self._ended, self.parser.text   # the message a prefix left open
        self.stopped = False       # a stop string ended the reply
        self.reasoning_tokens = 0
        # the item the last token fed is text of (None: markup), and how many
        # tokens up to it became its text then (more than 1: a run-on header)
        self.token_item: Item | None = None
        self.token_count = 0

    # -- bound to a generation
    def __iter__(self) -> Iterator[ReplyEvent]:
        for token, _ in self.generation.events():
            if token is not None:
                yield from self.feed(token)
                if self.stopped and self.generation.cancelled is None:
                    self.generation.cancel("stop")
        yield from self.close()

    def cancel(self, reason: str = "cancelled") -> None:
        self.generation.cancel(reason)

    @property
    def result(self):
        return self.generation.result

    # -- the reply so far
    @property
    def reply(self) -> Reply:
        return Reply.fold(self.items, self.parser.messages)

    @property
    def content(self) -> str:
        return self.reply.content

    @property
    def reasoning(self) -> str:
        return self.reply.reasoning_content

    @property
    def tool_calls(self) -> list[dict]:
        return self.reply.tool_calls

    # -- tokens in, events out
    def feed(self, token: int) -> list[ReplyEvent]:
        self.token_item, self.token_count = None, 0
        if self.stopped:
            return []
        body = self.parser.in_message
        if body and self.parser.channel == "analysis":
            self.reasoning_tokens += 1
        d = self.parser.feed(token)
        out = self._end_finished()
        i = len(self.parser.messages)
        if self.parser.in_message and i not in self._by_message:
            p = self.parser                # the header just read
            out += self._start(i, item_kind(p.current_role, p.channel, p.recipient, self.tools), p.recipient,
                               p.channel)
        if d is not None and d.text and self._by_message.get(i) is not None:
            out += self._delta(self._by_message[i], d.text)
        if body and self.parser.in_message and self._by_message.get(i) is not None:
            self.token_item, self.token_count = self._by_message[i], 1    # text of message i (not its end mark)
        elif self.parser.adopted and self._by_message.get(i) is not None:
            self.token_item, self.token_count = self._by_message[i], self.parser.adopted
        return out

    def close(self) -> list[ReplyEvent]:
        """The end of generation: the message left open ends here."""
        if self.stopped:
            return []
        n = len(self.parser.messages)
        self.parser.close()
        out = self._end_finished()
        for k in range(n, len(self.parser.messages)):
            item = self._by_message.get(k)
            if item is not None:
                item.cut = True
        return out

    def _start(self, i: int, kind: str | None, recipient: str | None, channel: str | None) -> list[ReplyEvent]:
        if kind is None:
            self._by_message[i] = None
            return []
        item = new_item(kind, len(self.items), self._counts[kind], recipient, channel, self.tools)
        if i == self._open_at:
            item.received = self._prefilled    # the prefill's text is the prompt's, not the reply's
        self._counts[kind] += 1
        self.items.append(item)
        self._by_message[i] = item
        return [ReplyEvent("start", item)]

    def _delta(self, item: Item, text: str) -> list[ReplyEvent]:
        item.received += text
        if item.kind == "content" and self.stop is not None:
            text = self.stop.push(text)
            if self.stop.hit:
                self.stopped = True
                out = [ReplyEvent("delta", item, text)] if text else []
                item.text += text
                for it in self.items:        # everything open ends at the stop
                    if not it.done:
                        it.done = True
                        out.append(ReplyEvent("end", it))
                return out
        if not text:
            return []
        item.text += text
        return [ReplyEvent("delta", item, text)]

    def _end_finished(self) -> list[ReplyEvent]:
        """End the items of messages the parser has finished, sending what the
        parser added at their end (a held-back byte sequence, a header-only
        message's text) as a last delta."""
        out = []
        while self._ended < len(self.parser.messages) and not self.stopped:
            i = self._ended
            msg = self.parser.messages[i]
            self._ended += 1
            if i not in self._by_message:
                out += self._start(i, item_kind(msg.role, msg.channel, msg.recipient, self.tools), msg.recipient,
                                   msg.channel)
            item = self._by_message[i]
            if item is None:
                continue
            if msg.text.startswith(item.received) and len(msg.text) > len(item.received):
                out += self._delta(item, msg.text[len(item.received):])
            if self.stopped:
                break
            if item.kind == "content" and self.stop is not None:
                tail = self.stop.flush()
                if tail:
                    item.text += tail
                    out.append(ReplyEvent("delta", item, tail))
            item.done = True
            out.append(ReplyEvent("end", item))
        return out
