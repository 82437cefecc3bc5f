"""The GPT-OSS tokenizer, built from the GGUF file's own vocabulary.

Pre-tokenization follows tiktoken's o200k pattern (the "gpt-4o" pre-tokenizer;
unlike llama.cpp's version, marks count as letters as in tiktoken), then
byte-level BPE merges the adjacent pair whose concatenation has the lowest
token id. Both run in the native extension; see csrc/bpe.cpp.
"""
from __future__ import annotations

import codecs
from typing import Iterable

import numpy as np

from . import _kernels
from .gguf import GGUFError, GGUFFile, StringArray, ValueType

SUPPORTED_PRE = ("gpt-4o",)
# Ids that end generation when present in the vocabulary (harmony format).
END_OF_GENERATION = ("<|return|>", "<|call|>", "<|endoftext|>")


class MissingTokenError(GGUFError, KeyError):
    """A special token the vocabulary lacks: a KeyError for lookups, and a
    GGUFError naming the file where it ends a command."""

    def __str__(self) -> str:
        return self.args[0]


class Tokenizer:
    def __init__(self, f: GGUFFile):
        self.path = f.path
        def need(key: str, kind: str):
            field = f.fields.get(key)
            if field is None:
                raise GGUFError(f"{f.path}: missing metadata key '{key}' (expected {kind})")
            return field

        def string(key: str):
            field = need(key, "a string")
            if not isinstance(field.value, str):
                raise GGUFError(f"{f.path}: {key} must be a string, got {kind_of(field)}")
            return field

        def kind_of(field) -> str:
            return field.type.name + (f" of {field.element_type.name}" if field.element_type is not None else "")

        model = string("tokenizer.ggml.model")
        if model.value != "gpt2":
            raise GGUFError(f"{f.path}: tokenizer.ggml.model is '{model.value}', expected 'gpt2' "
                            f"(byte-level BPE)")
        pre = string("tokenizer.ggml.pre")
        if pre.value not in SUPPORTED_PRE:
            raise GGUFError(f"{f.path}: tokenizer.ggml.pre is '{pre.value}', expected one of "
                            f"{', '.join(SUPPORTED_PRE)}")
        tokens = need("tokenizer.ggml.tokens", "an array of strings").value
        types_field = need("tokenizer.ggml.token_type", "an array of INT32")
        types = types_field.value
        if not isinstance(types, np.ndarray) or types.dtype.kind not in "iu":
            raise GGUFError(f"{f.path}: tokenizer.ggml.token_type must be an integer array, got "
                            f"{kind_of(types_field)}")
        if len(types) != len(tokens):
            raise GGUFError(f"{f.path}: tokenizer.ggml.token_type has {len(types)} entries, "
                            f"tokenizer.ggml.tokens has {len(tokens)}")
        bad = np.flatnonzero((types < 1) | (types > 6))
        if len(bad):     # (an unknown type had dropped the token from the vocabulary, silently)
            raise GGUFError(f"{f.path}: tokenizer.ggml.token_type[{bad[0]}] is {int(types[bad[0]])}, expected 1..6 "
                            f"(normal, unknown, control, user-defined, unused, byte)"
                            + (f"; {len(bad)} entries are out of range" if len(bad) > 1 else ""))
        merges = need("tokenizer.ggml.merges", "an array of strings").value
        # BPE here ranks a pair by the id of its concatenation, which is exactly
        # tiktoken's rule; the merges list (every valid split of every token,
        # as the HF conversion writes it) encodes the same order, so it is only
        # checked for presence, not parsed (parsing 446k strings costs ~0.3 s).
        if not isinstance(merges, StringArray) or len(merges) == 0:
            raise GGUFError(f"{f.path}: tokenizer.ggml.merges must be a non-empty array of strings")
        try:
            self._bpe = _kernels.BPE(f.buf, np.ascontiguousarray(tokens.starts),
                                     np.ascontiguousarray(tokens.lengths),
                                     np.require(types, np.int32, ["C", "A"]))   # aligned: the map may not be
        except ValueError as e:
            raise GGUFError(f"{f.path}: tokenizer.ggml.tokens: {e}") from None
        self.n_vocab = len(tokens)
        # no token covers more bytes of text than its stored form's (byte-level
        # BPE stores each byte as one or two), so a text of L characters has
        # at least L / max_token_bytes tokens: a bound known before encoding
        self.max_token_bytes = max(1, int(np.max(tokens.lengths)))
        special = np.flatnonzero(np.isin(types, (3, 4)))  # CONTROL, USER_DEFINED
        self.special_ids = frozenset(int(i) for i in special)
        # UNUSED ids ([PAD200019] and the like): never a valid output
        self.unused_ids = np.flatnonzero(types == 5).astype(np.int64)
        self._by_text = {tokens[int(i)]: int(i) for i in special[::-1]}  # lowest id wins

        def token_id(key: str) -> int | None:
            field = f.fields.get(key)
            if field is None:
                return None
            if field.type not in (ValueType.UINT32, ValueType.INT32) or not 0 <= field.value < self.n_vocab:
                raise GGUFError(f"{f.path}: {key} is {field.value!r} ({field.type.name}), expected a "
                                f"token id in 0..{self.n_vocab - 1}")
            return int(field.value)

        self.bos_id = token_id("tokenizer.ggml.bos_token_id")
        self.eos_id = token_id("tokenizer.ggml.eos_token_id")
        self.pad_id = token_id("tokenizer.ggml.padding_token_id")
        eog = {self.special_token(s) for s in END_OF_GENERATION if s in self._by_text}
        if self.eos_id is not None:
            eog.add(self.eos_id)
        self.eog_ids = frozenset(eog)

    def encode(self, text: str, allow_special: bool = False) -> list[int]:
        """Token ids of text. Special-token strings (such as "<|start|>") become
        their ids only with allow_special; otherwise they are plain text."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        try:
            return self._bpe.encode(text, allow_special)
        except TypeError:
            # Only lone surrogates stop a str from becoming UTF-8: replace
            # them with U+FFFD, as tiktoken does.
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
            return self._bpe.encode(text, allow_special)

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        arr = np.fromiter(ids, dtype=np.int64) if not isinstance(ids, np.ndarray) else ids.astype(np.int64)
        return self._bpe.decode(arr)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of the ids; bytes that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        return self._bpe.token_bytes(token_id)

    def special_token(self, text: str) -> int:
        """The id of a special token given its text, e.g. "<|start|>"."""
        try:
            return self._by_text[text]
        except KeyError:
            raise MissingTokenError(f"{self.path}: the vocabulary has no special token {text!r} "
                                    f"(tokenizer.ggml.tokens with token type CONTROL)") from None

    def split(self, text: str) -> list[str]:
        """The pre-tokenizer's pieces (for inspection and tests)."""
        return [b.decode("utf-8") for b in self._bpe.split(text)]

    def stream_decoder(self) -> "StreamDecoder":
        return StreamDecoder(self)


class StreamDecoder:
    """Turns token ids into text as they arrive. A token can end inside a
    UTF-8 sequence: its bytes are held back until the code point completes,
    so every piece returned is whole text; invalid bytes become U+FFFD."""

    def __init__(self, tokenizer: Tokenizer):
        self._tok = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token_id: int) -> str:
        return self._utf8.decode(self._tok.token_bytes(token_id))

    def flush(self) -> str:
        """Whatever is held back (an incomplete sequence becomes U+FFFD)."""
        return self._utf8.decode(b"", final=True)
