"""Token ids → text, one id at a time, without cutting a character in half.

A byte-level tokenizer (GPT-2, Llama 3, Qwen) may split one character across
tokens: "é" can be two tokens of one UTF-8 byte each, an emoji four. Decoding
each new id on its own would emit U+FFFD halves; decoding everything each step
would be quadratic. So, as inference servers do (vLLM, TGI), we keep a small
window of ids: decode the window with and without the newest ids, and emit the
difference only when it does not end in a replacement character (an
incomplete sequence that the next token may finish). Sentencepiece tokenizers
(Llama 2, Mistral) drop a leading space when decoding from a token boundary,
which is why the window starts a few ids back rather than at the new id.

Nothing here imports torch or transformers: anything with a `decode(ids)`
method is a tokenizer, which keeps this unit-testable on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

REPLACEMENT = "\ufffd"
# How many of the prompt's ids start the first window, for context.
CONTEXT_IDS = 5


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Decoder, context_ids: Sequence[int] = ()) -> None:
        """`context_ids`: the prompt's last ids, so the first token decodes as it
        would after the prompt (leading spaces in sentencepiece)."""
        self._tokenizer = tokenizer
        self._ids: list[int] = list(context_ids[-CONTEXT_IDS:]) if context_ids else []
        # ids[prefix:read] is text already emitted, kept as context;
        # ids[read:] is not emitted yet.
        self._prefix = 0
        self._read = len(self._ids)

    def push(self, token_id: int) -> str:
        """Add one id; return the text it completes (often "", never a half character)."""
        self._ids.append(token_id)
        emitted = self._decode(self._ids[self._prefix:self._read])
        current = self._decode(self._ids[self._prefix:])
        if len(current) <= len(emitted) or current.endswith(REPLACEMENT):
            return ""  # nothing new yet, or a character still incomplete
        delta = current[len(emitted):]
        # The ids just emitted become the next window's context.
        self._prefix, self._read = self._read, len(self._ids)
        return delta

    def flush(self) -> str:
        """What is still held back at the end (an unfinished sequence decodes to U+FFFD)."""
        emitted = self._decode(self._ids[self._prefix:self._read])
        current = self._decode(self._ids[self._prefix:])
        self._prefix = self._read = len(self._ids)
        return current[len(emitted):] if len(current) > len(emitted) else ""

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True) if ids else ""
