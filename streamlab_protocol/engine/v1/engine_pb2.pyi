from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FakeClock(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAKE_CLOCK_UNSPECIFIED: _ClassVar[FakeClock]
    FAKE_CLOCK_BATCHED: _ClassVar[FakeClock]
    FAKE_CLOCK_PER_STREAM: _ClassVar[FakeClock]

class ToolChoiceMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_CHOICE_MODE_UNSPECIFIED: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_AUTO: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_NONE: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_REQUIRED: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_FUNCTION: _ClassVar[ToolChoiceMode]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_TOOL_CALLS: _ClassVar[FinishReason]

class GenerationState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GENERATION_STATE_UNSPECIFIED: _ClassVar[GenerationState]
    GENERATION_STATE_RUNNING: _ClassVar[GenerationState]
    GENERATION_STATE_COMPLETED: _ClassVar[GenerationState]
    GENERATION_STATE_CANCELLED: _ClassVar[GenerationState]
    GENERATION_STATE_FAILED: _ClassVar[GenerationState]
FAKE_CLOCK_UNSPECIFIED: FakeClock
FAKE_CLOCK_BATCHED: FakeClock
FAKE_CLOCK_PER_STREAM: FakeClock
TOOL_CHOICE_MODE_UNSPECIFIED: ToolChoiceMode
TOOL_CHOICE_MODE_AUTO: ToolChoiceMode
TOOL_CHOICE_MODE_NONE: ToolChoiceMode
TOOL_CHOICE_MODE_REQUIRED: ToolChoiceMode
TOOL_CHOICE_MODE_FUNCTION: ToolChoiceMode
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_TOOL_CALLS: FinishReason
GENERATION_STATE_UNSPECIFIED: GenerationState
GENERATION_STATE_RUNNING: GenerationState
GENERATION_STATE_COMPLETED: GenerationState
GENERATION_STATE_CANCELLED: GenerationState
GENERATION_STATE_FAILED: GenerationState

class SessionRequest(_message.Message):
    __slots__ = ("call", "open", "attach", "abort", "credit", "window_tokens")
    CALL_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    ATTACH_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    WINDOW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    call: int
    open: GenerateRequest
    attach: AttachRequest
    abort: SessionAbort
    credit: SessionCredit
    window_tokens: int
    def __init__(self, call: _Optional[int] = ..., open: _Optional[_Union[GenerateRequest, _Mapping]] = ..., attach: _Optional[_Union[AttachRequest, _Mapping]] = ..., abort: _Optional[_Union[SessionAbort, _Mapping]] = ..., credit: _Optional[_Union[SessionCredit, _Mapping]] = ..., window_tokens: _Optional[int] = ...) -> None: ...

class SessionAbort(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SessionCredit(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: int
    def __init__(self, tokens: _Optional[int] = ...) -> None: ...

class SessionEvent(_message.Message):
    __slots__ = ("items", "serving")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[SessionItem]
    serving: bool
    def __init__(self, items: _Optional[_Iterable[_Union[SessionItem, _Mapping]]] = ..., serving: _Optional[bool] = ...) -> None: ...

class SessionItem(_message.Message):
    __slots__ = ("call", "accepted", "event", "ended")
    CALL_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    call: int
    accepted: SessionAccepted
    event: GenerateResponse
    ended: SessionStatus
    def __init__(self, call: _Optional[int] = ..., accepted: _Optional[_Union[SessionAccepted, _Mapping]] = ..., event: _Optional[_Union[GenerateResponse, _Mapping]] = ..., ended: _Optional[_Union[SessionStatus, _Mapping]] = ...) -> None: ...

class SessionAccepted(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class SessionStatus(_message.Message):
    __slots__ = ("code", "details")
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    code: int
    details: str
    def __init__(self, code: _Optional[int] = ..., details: _Optional[str] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class ThinkPause(_message.Message):
    __slots__ = ("after_token", "pause_ms")
    AFTER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PAUSE_MS_FIELD_NUMBER: _ClassVar[int]
    after_token: int
    pause_ms: int
    def __init__(self, after_token: _Optional[int] = ..., pause_ms: _Optional[int] = ...) -> None: ...

class FakeModelTiming(_message.Message):
    __slots__ = ("prefill_ms", "token_gap_ms", "pauses", "answer_tokens", "clock", "tool_calls")
    PREFILL_MS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_GAP_MS_FIELD_NUMBER: _ClassVar[int]
    PAUSES_FIELD_NUMBER: _ClassVar[int]
    ANSWER_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    prefill_ms: int
    token_gap_ms: int
    pauses: _containers.RepeatedCompositeFieldContainer[ThinkPause]
    answer_tokens: int
    clock: FakeClock
    tool_calls: int
    def __init__(self, prefill_ms: _Optional[int] = ..., token_gap_ms: _Optional[int] = ..., pauses: _Optional[_Iterable[_Union[ThinkPause, _Mapping]]] = ..., answer_tokens: _Optional[int] = ..., clock: _Optional[_Union[FakeClock, str]] = ..., tool_calls: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "prompt", "messages", "max_tokens", "timing", "stop", "sampling", "accept_token_batches", "detachable", "tools", "tool_choice", "traceparent")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_TOKEN_BATCHES_FIELD_NUMBER: _ClassVar[int]
    DETACHABLE_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    max_tokens: int
    timing: FakeModelTiming
    stop: _containers.RepeatedScalarFieldContainer[str]
    sampling: SamplingOptions
    accept_token_batches: bool
    detachable: bool
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    tool_choice: ToolChoice
    traceparent: str
    def __init__(self, request_id: _Optional[str] = ..., prompt: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., max_tokens: _Optional[int] = ..., timing: _Optional[_Union[FakeModelTiming, _Mapping]] = ..., stop: _Optional[_Iterable[str]] = ..., sampling: _Optional[_Union[SamplingOptions, _Mapping]] = ..., accept_token_batches: _Optional[bool] = ..., detachable: _Optional[bool] = ..., tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ..., tool_choice: _Optional[_Union[ToolChoice, _Mapping]] = ..., traceparent: _Optional[str] = ...) -> None: ...

class Tool(_message.Message):
    __slots__ = ("name", "description", "parameters_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters_json: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters_json: _Optional[str] = ...) -> None: ...

class ToolChoice(_message.Message):
    __slots__ = ("mode", "function")
    MODE_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    mode: ToolChoiceMode
    function: str
    def __init__(self, mode: _Optional[_Union[ToolChoiceMode, str]] = ..., function: _Optional[str] = ...) -> None: ...

class AttachRequest(_message.Message):
    __slots__ = ("request_id", "after_index", "accept_token_batches", "traceparent")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_INDEX_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_TOKEN_BATCHES_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    after_index: int
    accept_token_batches: bool
    traceparent: str
    def __init__(self, request_id: _Optional[str] = ..., after_index: _Optional[int] = ..., accept_token_batches: _Optional[bool] = ..., traceparent: _Optional[str] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("cancelled",)
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    cancelled: bool
    def __init__(self, cancelled: _Optional[bool] = ...) -> None: ...

class SamplingOptions(_message.Message):
    __slots__ = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    seed: int
    presence_penalty: float
    frequency_penalty: float
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ...) -> None: ...

class TokenChunk(_message.Message):
    __slots__ = ("index", "text")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    index: int
    text: str
    def __init__(self, index: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class TokenBatch(_message.Message):
    __slots__ = ("chunks",)
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[TokenChunk]
    def __init__(self, chunks: _Optional[_Iterable[_Union[TokenChunk, _Mapping]]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ...) -> None: ...

class Finish(_message.Message):
    __slots__ = ("reason", "usage")
    REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    reason: FinishReason
    usage: Usage
    def __init__(self, reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ...) -> None: ...

class StreamError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class ToolCallDelta(_message.Message):
    __slots__ = ("index", "id", "name", "arguments")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    index: int
    id: str
    name: str
    arguments: str
    def __init__(self, index: _Optional[int] = ..., id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("token", "finish", "error", "tokens", "tool_call")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    FINISH_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    token: TokenChunk
    finish: Finish
    error: StreamError
    tokens: TokenBatch
    tool_call: ToolCallDelta
    def __init__(self, token: _Optional[_Union[TokenChunk, _Mapping]] = ..., finish: _Optional[_Union[Finish, _Mapping]] = ..., error: _Optional[_Union[StreamError, _Mapping]] = ..., tokens: _Optional[_Union[TokenBatch, _Mapping]] = ..., tool_call: _Optional[_Union[ToolCallDelta, _Mapping]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class GenerationRecord(_message.Message):
    __slots__ = ("request_id", "state", "tokens_generated", "tokens_after_cancel", "started_at", "cancelled_at", "ended_at", "sampling")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_GENERATED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_AFTER_CANCEL_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    state: GenerationState
    tokens_generated: int
    tokens_after_cancel: int
    started_at: float
    cancelled_at: float
    ended_at: float
    sampling: SamplingOptions
    def __init__(self, request_id: _Optional[str] = ..., state: _Optional[_Union[GenerationState, str]] = ..., tokens_generated: _Optional[int] = ..., tokens_after_cancel: _Optional[int] = ..., started_at: _Optional[float] = ..., cancelled_at: _Optional[float] = ..., ended_at: _Optional[float] = ..., sampling: _Optional[_Union[SamplingOptions, _Mapping]] = ...) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("backend", "tokens_generated", "generations_active", "generations_started", "generations_completed", "generations_cancelled", "generations_failed", "tokens_after_cancel", "generations", "load", "generations_orphaned", "generations_reattached", "generations_orphan_expired")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TOKENS_GENERATED_FIELD_NUMBER: _ClassVar[int]
    GENERATIONS_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    GENERATIONS_STARTED_FIELD_NUMBER: _ClassVar[int]
    GENERATIONS_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    GENERATIONS_CANCELLED_FIELD_NUMBER: _ClassVar[int]
    GENERATIONS_FAILED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_AFTER_CANCEL_FIELD_NUMBER: _ClassVar[int]
    GENERATIONS_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    GENERATIONS_ORPHANED_FIELD_NUMBER: _ClassVar[int]
    GENERATIONS_REATTACHED_FIELD_NUMBER: _ClassVar[int]
    GENERATIONS_ORPHAN_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    backend: str
    tokens_generated: int
    generations_active: int
    generations_started: int
    generations_completed: int
    generations_cancelled: int
    generations_failed: int
    tokens_after_cancel: int
    generations: _containers.RepeatedCompositeFieldContainer[GenerationRecord]
    load: EngineLoad
    generations_orphaned: int
    generations_reattached: int
    generations_orphan_expired: int
    def __init__(self, backend: _Optional[str] = ..., tokens_generated: _Optional[int] = ..., generations_active: _Optional[int] = ..., generations_started: _Optional[int] = ..., generations_completed: _Optional[int] = ..., generations_cancelled: _Optional[int] = ..., generations_failed: _Optional[int] = ..., tokens_after_cancel: _Optional[int] = ..., generations: _Optional[_Iterable[_Union[GenerationRecord, _Mapping]]] = ..., load: _Optional[_Union[EngineLoad, _Mapping]] = ..., generations_orphaned: _Optional[int] = ..., generations_reattached: _Optional[int] = ..., generations_orphan_expired: _Optional[int] = ...) -> None: ...

class EngineLoad(_message.Message):
    __slots__ = ("running", "running_limit", "queue_waiting", "queue_limit", "device", "device_memory_allocated", "decode_steps", "decode_step_tokens")
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_LIMIT_FIELD_NUMBER: _ClassVar[int]
    QUEUE_WAITING_FIELD_NUMBER: _ClassVar[int]
    QUEUE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_MEMORY_ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    DECODE_STEPS_FIELD_NUMBER: _ClassVar[int]
    DECODE_STEP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    running: int
    running_limit: int
    queue_waiting: int
    queue_limit: int
    device: str
    device_memory_allocated: int
    decode_steps: int
    decode_step_tokens: int
    def __init__(self, running: _Optional[int] = ..., running_limit: _Optional[int] = ..., queue_waiting: _Optional[int] = ..., queue_limit: _Optional[int] = ..., device: _Optional[str] = ..., device_memory_allocated: _Optional[int] = ..., decode_steps: _Optional[int] = ..., decode_step_tokens: _Optional[int] = ...) -> None: ...
