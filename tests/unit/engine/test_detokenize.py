"""Incremental detokenisation: whole characters only, nothing lost at the seams."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from services.engine.backends.detokenize import REPLACEMENT, IncrementalDetokenizer


class ByteTokenizer:
    """One token per UTF-8 byte: the worst case for multi-byte characters."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


class WordPieceSpaces:
    """Sentencepiece's habit: tokens carry a leading "▁" for a space, and decoding
    drops the space at the start of what it is given."""

    def __init__(self, words: list[str]) -> None:
        self.vocab = ["▁" + w for w in words]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.vocab[i] for i in ids).replace("▁", " ").removeprefix(" ")


def stream(detok: IncrementalDetokenizer, ids: Sequence[int]) -> list[str]:
    pieces = [detok.push(i) for i in ids]
    pieces.append(detok.flush())
    return [p for p in pieces if p]


def test_multibyte_characters_split_across_tokens_come_out_whole() -> None:
    text = "naïve café 東京 🙂!"
    tokenizer = ByteTokenizer()
    pieces = stream(IncrementalDetokenizer(tokenizer), tokenizer.encode(text))
    assert "".join(pieces) == text
    assert not any(REPLACEMENT in p for p in pieces)
    assert "🙂" in pieces  # four byte-tokens, one piece of text


@given(st.text())
def test_any_text_round_trips_without_replacement_characters(text: str) -> None:
    tokenizer = ByteTokenizer()
    pieces = stream(IncrementalDetokenizer(tokenizer), tokenizer.encode(text))
    assert "".join(pieces) == text
    assert not any(REPLACEMENT in p for p in pieces)


def test_spaces_between_sentencepiece_tokens_are_kept() -> None:
    """Decoding each new token alone would print "helloworld"."""
    tokenizer = WordPieceSpaces(["user", "hello", "brave", "world"])
    pieces = stream(IncrementalDetokenizer(tokenizer, context_ids=[0]), [1, 2, 3])
    assert "".join(pieces) == " hello brave world"


def test_an_unfinished_character_at_the_end_is_flushed_not_dropped() -> None:
    tokenizer = ByteTokenizer()
    detok = IncrementalDetokenizer(tokenizer)
    assert detok.push(ord("a")) == "a"
    assert detok.push(0xE6) == ""  # the first byte of a three-byte character
    assert detok.flush() == REPLACEMENT
