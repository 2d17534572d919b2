"""The interface every model backend implements.

A backend turns one GenerationInput into an async stream of token texts. It
must stop at its next decode step when the consuming task is cancelled, and it
calls `tracker.generated()` once per decode step, *before* the token leaves,
so the engine counts work done at the model, not bytes that reached the wire
(a backend that decodes in a thread keeps calling it after a cancel, which is
exactly what `tokens_after_cancel` measures).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class ThinkPause:
    after_token: int
    pause_ms: int


@dataclass(frozen=True)
class FakeTiming:
    prefill_ms: int
    token_gap_ms: int
    answer_tokens: int
    pauses: tuple[ThinkPause, ...] = ()


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True)
class GenerationInput:
    request_id: str
    prompt: str
    messages: tuple[ChatMessage, ...]
    max_tokens: int
    timing: FakeTiming
    stop: tuple[str, ...] = field(default=())


class TokenTracker(Protocol):
    def generated(self) -> None: ...



class Backend(Protocol):
    name: str

    def generate(self, request: GenerationInput, tracker: TokenTracker) -> AsyncIterator[str]:
        """Yield token texts; stop by returning. The caller counts and indexes them."""
        ...

    def finished_by_length(self, request: GenerationInput, produced: int) -> bool:
        """Whether a generation that produced `produced` tokens stopped at max_tokens."""
        ...


class BackendError(Exception):
    """A failure inside the model; carries a short machine-readable code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
