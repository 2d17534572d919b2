"""The interface every model backend implements.

A backend turns one GenerationInput into an async stream of token texts. It
may read knobs of its own from the wire request first (`Backend.options`: the
fake model's timing is one); the servicer passes what it read back to
`generate()` untouched, so the backend-neutral input carries none of them. It
must stop at its next decode step when the consuming task is cancelled, and it
calls `tracker.generated()` once per decode step, *before* the token leaves,
so the engine counts work done at the model, not bytes that reached the wire
(a backend that decodes in a thread keeps calling it after a cancel, which is
exactly what `tokens_after_cancel` measures).

A backend whose consumer was behind may yield a `list[str]`: consecutive
tokens that were ready together (each still one decode step, counted when it
was made); the servicer sends them in one message to a caller that accepts
batches. It never waits to fill one.

A backend that `calls_tools` may yield `ToolCallPiece`s when the request
offers tools (`GenerationInput.tools`): the servicer sends each as a
`tool_call` event and ends the generation with TOOL_CALLS. One that does not
never sees tools: the servicer refuses such a request first.

A backend that knows more than "one chunk = one token" (a real tokenizer's
counts, a stop at end-of-sequence) yields one `GenerationSummary` after its
last text; the servicer then reports that instead of its own counting. Errors
are `BackendError`s naming the gRPC status the caller should get.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from services.engine.errors import EngineException
from streamlab_protocol.engine.v1 import engine_pb2 as pb


class InvalidRequest(EngineException, ValueError):
    """A wire request the engine refuses with INVALID_ARGUMENT; the message names the field."""


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True)
class ToolSpec:
    """A function the client offers (OpenAI's `tools[].function`)."""

    name: str
    description: str = ""
    # The parsed JSON Schema of its arguments ({}: none given).
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCallPiece:
    """One delta of a tool call: `id` and `name` only on a call's first."""

    index: int
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class GenerationInput:
    request_id: str
    prompt: str
    messages: tuple[ChatMessage, ...]
    max_tokens: int
    stop: tuple[str, ...] = field(default=())
    # What the client asked for; 0 when it set none (max_tokens then holds the
    # engine's limit). An upstream server is only sent a limit the client set.
    requested_max_tokens: int = 0
    # The tools the model may call (empty: none offered, or tool_choice "none"),
    # and the one it must call when the client named one.
    tools: tuple[ToolSpec, ...] = field(default=())
    forced_tool: str | None = None
    # tool_choice "required" or a named tool: a call is due whatever the messages say.
    tool_required: bool = False


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
    # A batched decode clock's steps and the tokens made in them (0: none).
    decode_steps: int = 0
    decode_step_tokens: int = 0


class TokenTracker(Protocol):
    def generated(self) -> None: ...


# Told at each decode step: seconds since the previous step of the same busy
# spell (None: the first after an idle clock) and the sequences it stepped.
StepObserver = Callable[[float | None, int], None]


@runtime_checkable
class ObservesSteps(Protocol):
    """A backend with a batched decode clock (the fake model) reports its steps."""

    def observe_steps(self, observer: StepObserver) -> None: ...


# What one backend reads for itself from a request (see `Backend.options`).
OptionsT = TypeVar("OptionsT")


class Backend(Protocol[OptionsT]):
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
    # Whether generate() can answer with tool calls; a request offering tools
    # to a backend that cannot is refused (INVALID_ARGUMENT), never ignored.
    calls_tools: bool

    def options(self, request: pb.GenerateRequest) -> OptionsT:
        """This backend's own options for one request, from wire fields only it reads
        (the fake model: its timing); raises InvalidRequest naming a bad field.
        A backend with none returns None and ignores such fields."""
        ...

    def generate(
        self, request: GenerationInput, options: OptionsT, tracker: TokenTracker
    ) -> AsyncGenerator[
        str | list[str] | ToolCallPiece | GenerationSummary | Accepted, None]:
        """Yield token texts (or lists of texts ready together), optionally then
        one summary; stop by returning.
        The caller indexes the texts (and counts them when no summary comes)."""
        ...

    def finished_by_length(
        self, request: GenerationInput, options: OptionsT, produced: int
    ) -> bool:
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


class BackendError(EngineException):
    """A failure inside the model; carries a short machine-readable code and the
    gRPC status the caller gets when it happens before the first token."""

    def __init__(self, code: str, message: str, status: ErrorStatus = "INTERNAL") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
