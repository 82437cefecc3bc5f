"""Constrained decoding: output that follows a JSON schema or a grammar, by
llguidance's masks over goosedump's own vocabulary.

A raw completion (`generate(..., grammar=...)`) is constrained from its first
token. A chat reply is constrained only where the harmony format says so
(`Gate`): the reasoning (the analysis channel) stays free; the final
channel's text follows `response_format` from its <|message|> on, a strict
tool call's arguments follow the tool's parameters schema from theirs; the
message headers are kept to the ones the request allows (a forced tool call
can only be that call), and the tokens that end a message (<|return|>,
<|call|>) are allowed exactly when the grammar accepts. An optional
reasoning budget ends the analysis after so many tokens.

The vocabulary's llguidance tokenizer takes about a second to build: it is
built once per tokenizer and kept.
"""
from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .sampling import NoTokenLeft

_VOCABS: dict[int, Any] = {}
_VOCABS_LOCK = threading.Lock()
# Compact JSON (no free whitespace): a small model can otherwise write
# whitespace for ever where a schema allows it.
JSON_OPTIONS = {"whitespace_flexible": False}


class ConstraintError(ValueError):
    """A schema or grammar that cannot constrain output; the message says why."""


def _llg():
    try:
        import llguidance
        import llguidance.numpy  # noqa: F401
    except ImportError:  # pragma: no cover - a declared dependency
        raise ConstraintError("structured output needs llguidance (pip install llguidance)") from None
    return llguidance


class _Vocab:
    """What llguidance needs of a tokenizer: every token's bytes, the special
    ones, and encoding (goosedump's own BPE)."""

    def __init__(self, tok):
        self.eos_token_id = tok.eos_id if tok.eos_id is not None else 0
        self.bos_token_id = None
        self.tokens = [tok.token_bytes(i) for i in range(tok.n_vocab)]
        self.special_token_ids = sorted(tok.special_ids)
        self._tok = tok

    def __call__(self, s) -> list[int]:
        return self._tok.encode(s.decode("utf-8", errors="replace") if isinstance(s, bytes) else s)


def vocabulary(tok):
    """The llguidance tokenizer of goosedump's tokenizer (built once)."""
    llg = _llg()
    with _VOCABS_LOCK:
        ll = _VOCABS.get(id(tok))
        if ll is None:
            ends = [tok.special_token(t) for t in ("<|return|>", "<|end|>", "<|call|>") if _has(tok, t)]
            ll = llg.LLTokenizer(llg.TokenizerWrapper(_Vocab(tok)), eos_token=ends or None)
            _VOCABS[id(tok)] = ll
            tok._llg_keepalive = ll       # the id stays this tokenizer's while it lives
        return ll


def _has(tok, text: str) -> bool:
    try:
        tok.special_token(text)
        return True
    except KeyError:
        return False


# --- grammars -------------------------------------------------------------------

def schema_grammar(schema: dict | str, where: str = "schema") -> str:
    """The llguidance grammar of a JSON schema (a dict or its JSON text)."""
    llg = _llg()
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ConstraintError(f"{where} is not valid JSON: {e}") from None
    if not isinstance(schema, dict):
        raise ConstraintError(f"{where} must be a JSON object (a JSON schema), got {type(schema).__name__}")
    try:
        grammar = llg.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
    except ValueError as e:
        raise ConstraintError(f"{where}: {e}") from None
    return _checked(grammar, where)


def any_json_object() -> str:
    return schema_grammar({"type": "object"}, "json_object")


def text_grammar(text: str, kind: str = "auto", where: str = "grammar") -> str:
    """A grammar given as text: GBNF (llama.cpp's), Lark (llguidance's) or a
    regular expression; "auto" tells GBNF (`::=`) from Lark."""
    llg = _llg()
    if not isinstance(text, str) or not text.strip():
        raise ConstraintError(f"{where} is empty")
    if kind == "auto":
        kind = "gbnf" if "::=" in text else "lark"
    try:
        if kind == "gbnf":
            from llguidance.gbnf_to_lark import gbnf_to_lark
            lark = gbnf_to_lark(_unicode_escapes(text, where))
        elif kind == "regex":
            return _checked(llg.LLMatcher.grammar_from_regex(text), where)
        elif kind == "lark":
            lark = text
        else:
            raise ConstraintError(f"{where}: grammar kind must be gbnf, lark or regex, got {kind!r}")
    except ConstraintError:
        raise
    except Exception as e:      # the converter's own error names the line
        raise ConstraintError(f"{where} is not valid {kind.upper()}: {e}") from None
    return _checked(llg.LLMatcher.grammar_from_lark(lark), where)


_ESCAPE = re.compile(r"(\\\\)|\\u([0-9a-fA-F]{4})|\\U([0-9a-fA-F]{8})")


def _unicode_escapes(text: str, where: str) -> str:
    """GBNF's \\uXXXX and \\UXXXXXXXX as llama.cpp reads them: llguidance's
    converter strips the leading zeros of the hex digits and reads on (\\u0041BC
    became U+41BC), so they become \\xHH below 256 and the character itself above."""
    def one(m):
        if m[1]:
            return m[1]
        c = int(m[2] or m[3], 16)
        if 0xD800 <= c <= 0xDFFF or c > 0x10FFFF:
            raise ConstraintError(f"{where}: {m[0]} is not a character (a surrogate or past U+10FFFF)")
        return f"\\x{c:02x}" if c < 0x100 else chr(c)
    return _ESCAPE.sub(one, text)


def as_grammar(text: str, where: str = "grammar") -> str:
    """A grammar from the user's text (GBNF or Lark), or one this module
    built already (llguidance's JSON form), checked."""
    if isinstance(text, str) and text.lstrip().startswith("{"):
        try:
            built = json.loads(text)
        except json.JSONDecodeError:
            built = None
        if isinstance(built, dict) and "grammars" in built:
            return _checked(text, where)
    return text_grammar(text, where=where)


def _checked(grammar: str, where: str) -> str:
    llg = _llg()
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ConstraintError(f"{where} cannot constrain output: {messages[0] if messages else 'invalid'}")
    return grammar


# --- masks ----------------------------------------------------------------------

class Matcher:
    """One grammar's state as tokens are consumed; `allowed()` is a boolean
    mask over the vocabulary."""

    def __init__(self, tok, grammar: str):
        llg = _llg()
        self.ll = vocabulary(tok)
        self.m = llg.LLMatcher(self.ll, grammar)
        if self.m.is_error():
            raise ConstraintError(f"grammar cannot constrain output: {self.m.get_error()}")
        self.n_vocab = tok.n_vocab
        self._bits = llg.numpy.allocate_token_bitmask(1, self.ll.vocab_size)

    def allowed(self) -> np.ndarray:
        _llg().numpy.fill_next_token_bitmask(self.m, self._bits)
        if self.m.is_error():
            # (llguidance's mask is then the end-of-sequence token alone, which read as the grammar's acceptance
            # ended the text short of it, as a success: a grammar no text can go on with is the request's fault)
            why = self.m.get_error().splitlines()
            raise NoTokenLeft(f"the grammar allows no token here (no text can complete it): "
                              f"{why[0] if why else 'no reason given'}")
        return np.unpackbits(self._bits.view(np.uint8), bitorder="little")[:self.n_vocab].astype(bool)

    def consume(self, token: int) -> None:
        if not self.m.consume_token(int(token)):
            why = self.m.get_error().splitlines()    # its first line says why; a state dump follows
            raise ConstraintError(f"the grammar refused token {token}: {why[0] if why else 'no reason given'}")

    @property
    def accepting(self) -> bool:
        return self.m.is_accepting()


@dataclass
class ReplySpec:
    """What a chat reply may hold: `final` the final channel's grammar (None:
    free text; FORBIDDEN: no final answer, a tool call must come), `tools`
    name -> the arguments' grammar (None: free), `reasoning_budget` the
    analysis tokens allowed (None: no limit)."""
    final: str | None = None
    tools: dict[str, str | None] = field(default_factory=dict)
    reasoning_budget: int | None = None
    allow_final: bool = True


class Gate:
    """A chat reply's constraint, token by token: which tokens may come next
    (`allowed()`: a boolean mask, or None for no constraint) and `advance`.
    Starts where the prompt leaves off: after <|start|>assistant, in the
    header (or, with `prefix`, after the tokens already in the prompt)."""

    def __init__(self, tok, spec: ReplySpec, prefix: list[int] = ()):
        self.tok, self.spec = tok, spec
        sp = tok.special_token
        self.END, self.RETURN, self.CALL = sp("<|end|>"), sp("<|return|>"), sp("<|call|>")
        self.START = sp("<|start|>")
        self.n_vocab = tok.n_vocab
        normal = np.ones(self.n_vocab, bool)
        normal[list(tok.special_ids)] = False
        if len(tok.unused_ids):
            normal[tok.unused_ids] = False
        self._normal = normal
        self.reasoning = 0
        self._forced: list[int] = []            # tokens the format fixes next
        self._body: tuple[str, Matcher | None] | None = None
        self._node: dict | None = None
        self._enter_header()
        for t in prefix:
            self.advance(t)

    # -- headers as a trie of token sequences
    def _headers(self) -> dict:
        enc = lambda s: self.tok.encode(s, allow_special=True)   # noqa: E731
        seqs: list[tuple[list[int], tuple]] = []
        if self.spec.reasoning_budget is None or self.reasoning < self.spec.reasoning_budget:
            seqs.append((enc("<|channel|>analysis<|message|>"), ("analysis", None)))
        if self.spec.allow_final:
            seqs.append((enc("<|channel|>final<|message|>"), ("final", self.spec.final)))
        for name, grammar in self.spec.tools.items():
            seqs.append((enc(f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>"),
                         ("tool", grammar)))
        root: dict = {}
        for ids, leaf in seqs:
            node = root
            for t in ids[:-1]:
                node = node.setdefault(t, {})
            node[ids[-1]] = leaf
        return root

    def _enter_header(self) -> None:
        self._node, self._body = self._headers(), None

    # -- the steps
    def allowed(self) -> np.ndarray:
        if self._forced:
            return self._only([self._forced[0]])
        if self._node is not None:
            return self._only(list(self._node))
        kind, matcher = self._body
        if matcher is None:
            mask = self._normal.copy()
            mask[{"analysis": self.END, "final": self.RETURN, "tool": self.CALL}[kind]] = True
            return mask
        mask = matcher.allowed()
        end = self.RETURN if kind == "final" else self.CALL
        accepting = mask[self.END] or mask[self.RETURN] or mask[self.CALL]
        mask[[self.END, self.RETURN, self.CALL]] = False
        mask[end] = bool(accepting)
        return mask

    def _only(self, ids) -> np.ndarray:
        mask = np.zeros(self.n_vocab, bool)
        mask[ids] = True
        return mask

    def advance(self, token: int) -> None:
        token = int(token)
        if self._forced:
            if token != self._forced[0]:
                raise ConstraintError(f"token {token} is not the format's next token {self._forced[0]}")
            self._forced.pop(0)
            if not self._forced:
                self._enter_header()
            return
        if self._node is not None:
            nxt = self._node.get(token)
            if nxt is None:
                raise ConstraintError(f"token {token} is not a header this reply allows")
            if isinstance(nxt, tuple):       # the header is read: the message's text follows
                kind, grammar = nxt
                self._node = None
                self._body = (kind, Matcher(self.tok, grammar) if grammar is not None else None)
            else:
                self._node = nxt
            return
        kind, matcher = self._body
        if kind == "analysis":
            self.reasoning += 1
            if token == self.END:
                self._forced = [self.START] + self.tok.encode("assistant")
            elif self.spec.reasoning_budget is not None and self.reasoning >= self.spec.reasoning_budget:
                self._forced = [self.END, self.START] + self.tok.encode("assistant")
            return
        if token in (self.RETURN, self.CALL, self.END):
            self._body = ("done", None)
            return
        if matcher is not None:
            matcher.consume(token)


class Free:
    """A raw completion's grammar from its first token (no harmony)."""

    def __init__(self, tok, grammar: str):
        self.matcher = Matcher(tok, grammar)
        self.ends = sorted(tok.eog_ids)
        # the tokens llguidance allows once the grammar accepts (harmony's
        # message ends): only end-of-generation ones end a raw completion
        self.stops = sorted(set(self.ends) | {tok.special_token(t) for t in ("<|return|>", "<|end|>", "<|call|>")
                                               if _has(tok, t)})

    def allowed(self) -> np.ndarray:
        mask = self.matcher.allowed()
        accepting = bool(mask[self.stops].any()) or self.matcher.accepting
        mask[self.stops] = False
        mask[self.ends] = accepting
        return mask

    def advance(self, token: int) -> None:
        if int(token) not in self.ends:
            self.matcher.consume(token)
