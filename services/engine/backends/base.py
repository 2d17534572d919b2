"""The interface every model backend implements.

A backend turns one GenerationInput into an async stream of token texts. It
must stop at its next decode step when the consuming task is cancelled, and it
calls `tracker.generated()` once per decode step, *before* the token leaves,
so the engine counts work done at the model, not bytes that reached the wire
(a backend that decodes in a thread keeps calling it after a cancel, which is
exactly what `tokens_after_cancel` measures).

A backend that knows more than "one chunk = one token" (a real tokenizer's
counts, a stop at end-of-sequence) yields one `GenerationSummary` after its
last text; the servicer then reports that instead of its own counting. Errors
are `BackendError`s naming the gRPC status the caller should get.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Literal, Protocol


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
    # What the client asked for; 0 when it set none (max_tokens then holds the
    # engine's limit). An upstream server is only sent a limit the client set.
    requested_max_tokens: int = 0


@dataclass(frozen=True)
class GenerationSummary:
    """Yielded once, after the last text, by backends that count real tokens."""

    prompt_tokens: int
    completion_tokens: int
    finished_by_length: bool


class Accepted:
    """Yielded once by a backend that defers acceptance (see `Backend.defers_acceptance`)."""


ACCEPTED = Accepted()


@dataclass(frozen=True)
class BackendLoad:
    """Where the backend runs and what it holds there now, for GetStats."""

    device: str = ""
    device_memory_allocated: int = 0


class TokenTracker(Protocol):
    def generated(self) -> None: ...


class Backend(Protocol):
    name: str
    # False: the engine tells its caller "accepted" (gRPC headers) before it calls
    # generate(), so a long prefill or a queue wait never looks like a dead engine.
    # True: only once generate() yields ACCEPTED (or its first text), so a refusal
    # before that, such as an upstream server's 400 or 429, reaches the gateway as
    # a gRPC status and the client as the matching HTTP status, not a cut stream.
    defers_acceptance: bool
    # How many generations it runs at once; the engine queues the rest
    # (services/engine/admission.py). None: as many as the engine allows.
    max_concurrency: int | None

    def generate(
        self, request: GenerationInput, tracker: TokenTracker
    ) -> AsyncGenerator[str | GenerationSummary | Accepted, None]:
        """Yield token texts, optionally then one summary; stop by returning.
        The caller indexes the texts (and counts them when no summary comes)."""
        ...

    def finished_by_length(self, request: GenerationInput, produced: int) -> bool:
        """Whether a generation that produced `produced` tokens stopped at max_tokens."""
        ...

    def load(self) -> BackendLoad:
        """Device and device memory now (cheap: GetStats calls it)."""
        ...

    async def aclose(self) -> None:
        """Release what the backend holds (threads, connections) at shutdown."""
        ...


# The gRPC status a BackendError maps to (by name, so backends need no grpc import).
ErrorStatus = Literal[
    "INTERNAL", "INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED", "UNAVAILABLE",
    "DEADLINE_EXCEEDED", "UNAUTHENTICATED", "PERMISSION_DENIED", "FAILED_PRECONDITION",
]


class BackendError(Exception):
    """A failure inside the model; carries a short machine-readable code and the
    gRPC status the caller gets when it happens before the first token."""

    def __init__(self, code: str, message: str, status: ErrorStatus = "INTERNAL") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
