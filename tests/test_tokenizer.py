"""The tokenizer built from the GGUF vocabulary equals tiktoken's o200k_harmony."""
import codecs

import numpy as np
import pytest

from corpus import corpus
from refs import tiktoken_harmony


@pytest.fixture(scope="module")
def tok(tiny_model):
    return tiny_model.tokenizer


@pytest.fixture(scope="module")
def tt():
    return tiktoken_harmony()


@pytest.fixture(scope="module")
def file_specials(tok):
    """The special tokens this GGUF defines (the 21 added tokens; tiktoken's
    reserved ids past them are "[PAD<id>]" placeholders in llama.cpp's files)."""
    return {tok.decode([i]) for i in tok.special_ids}


def test_corpus_is_large_and_varied():
    c = corpus()
    assert len(c) >= 5000 and len(set(c)) > 4500
    assert any("<|start|>" in s for s in c) and any(len(s) > 300 for s in c)


def test_matches_tiktoken_without_special_tokens(tok, tt):
    mismatches = []
    for s in corpus():
        ours, ref = tok.encode(s), tt.encode(s, allowed_special=set(), disallowed_special=())
        if ours != ref:
            mismatches.append((s, ours, ref))
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[0]!r}"


def test_matches_tiktoken_with_special_tokens(tok, tt, file_specials):
    assert len(file_specials) == 21 and "<|start|>" in file_specials
    mismatches = []
    for s in corpus():
        ours = tok.encode(s, allow_special=True)
        ref = tt.encode(s, allowed_special=file_specials, disallowed_special=())
        if ours != ref:
            mismatches.append((s, ours, ref))
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[0]!r}"


def test_round_trip(tok):
    for s in corpus():
        assert tok.decode(tok.encode(s)) == s
        assert tok.decode(tok.encode(s, allow_special=True)) == s


def test_special_tokens_only_when_allowed(tok):
    text = "<|start|>user<|message|>hi<|end|>"
    assert tok.encode(text, allow_special=True) == [200006, 1428, 200008, 3686, 200007]
    plain = tok.encode(text)
    assert 200006 not in plain and tok.decode(plain) == text
    # Reserved ids are not in the file's vocabulary as special tokens.
    assert 200500 not in tok.encode("<|reserved_200500|>", allow_special=True)
    assert tok.special_token("<|return|>") == 200002
    assert tok.eog_ids == {199999, 200002, 200012}


def test_every_code_point_is_classified_like_tiktoken(tok, tt):
    """Each code point in contexts that reveal its class (letter case, mark,
    number, whitespace): a sweep of all of Unicode against tiktoken."""
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    bad = []
    for i in range(0, len(cps), 256):
        chunk = cps[i:i + 256]
        s = "".join(f"a{chr(c)}b {chr(c)}A{chr(c)}1{chr(c)}\n" for c in chunk)
        if tok.encode(s) != tt.encode_ordinary(s):
            # narrow down to the code points that differ
            bad += [c for c in chunk
                    if tok.encode(f"a{chr(c)}b {chr(c)}A{chr(c)}1{chr(c)}\n")
                    != tt.encode_ordinary(f"a{chr(c)}b {chr(c)}A{chr(c)}1{chr(c)}\n")]
    assert not bad, f"{len(bad)} code points differ, e.g. {[hex(c) for c in bad[:10]]}"


def test_lone_surrogates_are_replaced_like_tiktoken(tok, tt):
    s = "a\ud800b\udfffc"
    assert tok.encode(s) == tt.encode(s, disallowed_special=())


def test_encode_rejects_non_text(tok):
    with pytest.raises(TypeError, match="text must be str, got bytes"):
        tok.encode(b"abc")


def test_decode_rejects_bad_ids(tok):
    with pytest.raises(IndexError, match="token id 201088 at position 1 is outside the vocabulary"):
        tok.decode([1, 201088])
    with pytest.raises(IndexError, match="token id -1"):
        tok.decode([-1])


def test_stream_decoder_emits_only_whole_code_points(tok):
    held_back = 0
    for s in corpus(600, seed=7):
        ids = tok.encode(s)
        dec = tok.stream_decoder()
        pieces = [dec.add(i) for i in ids] + [dec.flush()]
        assert "".join(pieces) == s
        # each piece is what Python's own incremental UTF-8 decoder gives for
        # the token's bytes: every whole code point at once, a broken one held back
        ref = codecs.getincrementaldecoder("utf-8")()
        for i, piece in zip(ids, pieces):
            want = ref.decode(tok.token_bytes(i))
            assert piece == want, (s, i)
            held_back += ref.getstate()[0] != b""
    assert held_back > 0, "the corpus never split a code point across tokens"


def test_stream_decoder_flushes_an_incomplete_tail(tok):
    ids = tok.encode("𓀁")
    assert len(ids) > 1
    dec = tok.stream_decoder()
    assert dec.add(ids[0]) == ""
    assert dec.flush() == "\ufffd"


def test_split_follows_the_o200k_pattern(tok):
    assert tok.split("Hello world's  \n\n 123456 don't!!") == [
        "Hello", " world's", "  \n\n", " ", "123", "456", " don't", "!!"]
    # tiktoken's regex counts marks as letters (llama.cpp's gpt-4o regex does not)
    assert tok.split("क्षत्रिय") == ["क्षत्रिय"]


def test_decode_bytes_is_raw(tok):
    ids = tok.encode("é")
    assert tok.decode_bytes(np.array(ids)) == "é".encode()
