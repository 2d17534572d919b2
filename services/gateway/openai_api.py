"""The OpenAI-compatible surface: request models and the JSON of each chunk.

Beyond OpenAI's fields, a request may carry a `streamlab` object (OpenAI SDKs
send it with `extra_body={"streamlab": {...}}`) that shapes the fake model's
timing for this one request, so tests and scenarios need no restarts:

    "streamlab": {"prefill_ms": 300, "token_gap_ms": 50, "answer_tokens": 20,
                  "pauses": [{"after_token": 4, "pause_ms": 3000}],
                  "request_id": "my-id", "heartbeat_s": 0.5, "tool_calls": 2}

`tool_calls`: how many tool calls the fake model makes when the request
offers `tools` (default one; the calls' argument deltas interleave by index).

`heartbeat_s` overrides the gateway's `: ping` interval for this one stream
(0 turns pings off), so a scenario can show an idle cut and its fix on the
same running gateway.

Three knobs select a *broken* behaviour, so the lab can show a failure and
its fix on one running gateway (the wrappers of services/gateway/broken_modes.py,
applied in `EngineLease.events()`); a gateway with `allow_broken_modes` off
refuses them with 400:

    "relay": "detached_unbounded"  the engine writes on for nobody
    "engine_errors": "swallow"     an engine-hop fault ends the stream with
                                   [DONE]: a cut that looks like success
    "job_ttl_s": 0                 a polling job that never expires (jobs.py)
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)

from streamlab_protocol.engine.v1 import engine_pb2 as pb

MAX_DELAY_MS = 600_000  # ten minutes: past that a "pause" is a hang, not a lab setting
UINT32_MAX = 2**32 - 1
MAX_TOOLS = 128  # OpenAI's limit on `tools`
MAX_TOOL_CALLS = 64
# The surfaces (a lease's label) whose writers relay tool-call deltas; the
# others (resume, polling, websocket) refuse `tools` rather than drop the calls.
TOOL_SURFACES = ("sse", "json")
INT64_MAX = 2**63 - 1
# Request ids travel as gRPC metadata and HTTP headers: ASCII only (a `\w`
# would let "café" through, which gRPC then refuses as invalid metadata).
REQUEST_ID_PATTERN = r"^[A-Za-z0-9_.:-]+$"


def _encodable(text: str) -> str:
    """Text goes on the wire as UTF-8; JSON's `\ud800` escape decodes to a
    lone surrogate, which UTF-8 cannot carry (protobuf would fail: a 500)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"holds a lone UTF-16 surrogate at character {exc.start}, "
                         "which is not valid Unicode text") from None
    return text


# Every string a request carries onto the wire.
WireText = Annotated[str, AfterValidator(_encodable)]

# OpenAI's types are strict: `"max_tokens": "10"`, `true` or `"stream": "yes"`
# are errors there, so they are here (pydantic's lax mode would coerce them).
STRICT = ConfigDict(strict=True, extra="forbid")


class Pause(BaseModel):
    model_config = STRICT
    after_token: int = Field(ge=0, le=UINT32_MAX)
    pause_ms: int = Field(ge=0, le=MAX_DELAY_MS)


class StreamlabOptions(BaseModel):
    model_config = STRICT
    prefill_ms: int | None = Field(None, ge=0, le=MAX_DELAY_MS)
    token_gap_ms: int | None = Field(None, ge=0, le=MAX_DELAY_MS)
    answer_tokens: int | None = Field(None, ge=1, le=100_000)
    pauses: list[Pause] = Field(default_factory=list, max_length=1000)
    request_id: str | None = Field(None, min_length=1, max_length=128,
                                   pattern=REQUEST_ID_PATTERN)
    # How the gateway relays this stream: `direct` (the body reads the call, so
    # flow control and cancellation reach the engine) or the broken
    # `detached_unbounded` (services/gateway/broken_modes.py).
    relay: Literal["direct", "detached_unbounded"] = "direct"
    # Floor of 50 ms: a smaller interval is a ping flood, not a heartbeat.
    heartbeat_s: float | None = Field(None, ge=0, le=MAX_DELAY_MS / 1000)
    # What the OpenAI route does when the engine hop fails mid-stream: report
    # it (an error event, no [DONE]) or swallow it (the classic bug).
    engine_errors: Literal["report", "swallow"] = "report"
    # Polling jobs only: this job's TTL. None: the gateway's; 0: never expires
    # (the leak). It may shorten the gateway's TTL; a longer one is cut to it.
    job_ttl_s: float | None = Field(None, ge=0, le=MAX_DELAY_MS / 1000)
    # How many tool calls the fake model makes when tools are offered (None: one).
    tool_calls: int | None = Field(None, ge=1, le=MAX_TOOL_CALLS)

    def heartbeat_or(self, default_s: float) -> float:
        if self.heartbeat_s is None:
            return default_s
        return 0.0 if self.heartbeat_s == 0 else max(self.heartbeat_s, 0.05)


class ContentPart(BaseModel):
    """One part of OpenAI's array form of `content`. Text parts are joined;
    any other kind (images, audio, files) is refused: no backend here reads it."""

    model_config = ConfigDict(strict=True, extra="allow")
    type: str
    text: WireText | None = None

    @field_validator("type")
    @classmethod
    def _text_only(cls, kind: str) -> str:
        if kind != "text":
            raise ValueError(f"content parts of type {kind[:40]!r} are not supported "
                             "(only \"text\")")
        return kind


class Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")  # name, tool_calls, ...
    role: Literal["system", "user", "assistant", "tool", "developer"]
    # null only on an assistant's turn (one that made tool calls, sent back
    # as the conversation's history).
    content: WireText | list[ContentPart] | None = Field(None, validate_default=True)

    @field_validator("content")
    @classmethod
    def _parts_have_text(cls, content: str | list[ContentPart] | None, info: ValidationInfo
                         ) -> str | list[ContentPart] | None:
        if content is None and info.data.get("role") != "assistant":
            raise ValueError("a message needs `content` (only an assistant's may be null)")
        if isinstance(content, list) and any(part.text is None for part in content):
            raise ValueError("a text content part needs a \"text\" string")
        return content

    @property
    def text(self) -> str:
        """The content as one string: the text parts joined by newlines (as vLLM does)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text or "" for part in self.content)


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")  # strict: accepted, not enforced
    # OpenAI's rule for function names.
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: WireText = ""
    parameters: dict[str, Any] | None = None


class ToolParam(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    name: str = Field(min_length=1, max_length=64)


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["function"]
    function: NamedFunction


class ResponseFormat(BaseModel):
    """Only OpenAI's default, plain text, is served; a JSON mode is refused by
    name rather than answered with text the client would fail to parse."""

    model_config = ConfigDict(strict=True, extra="allow")
    type: str

    @field_validator("type")
    @classmethod
    def _text_only(cls, kind: str) -> str:
        if kind != "text":
            raise ValueError(f"{kind[:40]!r} is not supported: no backend here constrains "
                             "its output (only \"text\")")
        return kind


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    # Unknown fields are ignored (OpenAI clients send many: `user`, `logprobs`,
    # ...); the ones read here are typed as strictly as OpenAI's.
    model_config = ConfigDict(strict=True, extra="ignore")
    # None: the gateway's model. Another name is a 404 (`model_not_found`,
    # services/gateway/lease.py), as OpenAI answers.
    model: WireText | None = Field(None, max_length=256)
    messages: list[Message] = Field(min_length=1)
    stream: bool | None = False  # OpenAI allows null: not streaming
    # Bounded by the wire type; the engine names its own, lower limit.
    max_tokens: int | None = Field(None, ge=1, le=UINT32_MAX)
    max_completion_tokens: int | None = Field(None, ge=1, le=UINT32_MAX)
    # One choice per request: `n` > 1 is refused rather than half-served.
    n: int | None = None
    stream_options: StreamOptions | None = None
    # OpenAI's `stop`: one string or a list. The engine owns the rules (at most
    # 4, each 1-256 characters: a named 400 otherwise) and applies them for
    # every backend (services/engine/stop.py).
    stop: WireText | list[WireText] | None = None
    # Sampling, with OpenAI's ranges: forwarded on the wire (SamplingOptions);
    # the fake model records them, the hf and upstream backends use them.
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = Field(None, ge=-INT64_MAX - 1, le=INT64_MAX)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    # Function tools: the fake model calls them (services/engine/backends/tool_calls.py);
    # a backend that cannot is refused by the engine, never ignored.
    tools: list[ToolParam] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    # Served only as their defaults (plain text, no log probabilities): the
    # rest is a 400 that names the parameter, never silently ignored.
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    streamlab: StreamlabOptions | None = None

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, logprobs: bool | None) -> bool | None:
        if logprobs:
            raise ValueError("log probabilities are not supported by this gateway")
        return logprobs

    @field_validator("top_logprobs")
    @classmethod
    def _no_top_logprobs(cls, top: int | None) -> int | None:
        if top:
            raise ValueError("log probabilities are not supported by this gateway")
        return top

    @field_validator("tool_choice")
    @classmethod
    def _choice_needs_tools(cls, choice: Any, info: ValidationInfo) -> Any:
        # OpenAI refuses a choice that forces a call to no tool, or to one not offered.
        tools: list[ToolParam] = info.data.get("tools") or []
        if (choice == "required" or isinstance(choice, NamedToolChoice)) and not tools:
            raise ValueError("forcing a tool call requires `tools`")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in {
                t.function.name for t in tools}:
            raise ValueError(f"no tool named {choice.function.name[:64]!r} is in `tools`")
        return choice

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int | None) -> int | None:
        if n is not None and n != 1:
            raise ValueError(f"n={n} is not supported: this gateway returns one choice "
                             "per request (send n requests instead)")
        return n

    def stop_sequences(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling(self) -> pb.SamplingOptions | None:
        fields = {name: getattr(self, name) for name in SAMPLING_FIELDS}
        chosen = {name: value for name, value in fields.items() if value is not None}
        return pb.SamplingOptions(**chosen) if chosen else None

    def engine_tools(self) -> list[pb.Tool]:
        return [pb.Tool(name=t.function.name, description=t.function.description,
                        parameters_json=(json.dumps(t.function.parameters)
                                         if t.function.parameters is not None else ""))
                for t in self.tools or ()]

    def engine_tool_choice(self) -> pb.ToolChoice | None:
        choice = self.tool_choice
        if choice is None:
            return None
        if isinstance(choice, NamedToolChoice):
            return pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_FUNCTION, function=choice.function.name)
        return pb.ToolChoice(mode=_TOOL_CHOICE_MODES[choice])

    def to_engine_request(self, request_id: str) -> pb.GenerateRequest:
        options = self.streamlab or StreamlabOptions()
        timing = pb.FakeModelTiming(
            prefill_ms=options.prefill_ms,
            token_gap_ms=options.token_gap_ms,
            answer_tokens=options.answer_tokens,
            pauses=[pb.ThinkPause(after_token=p.after_token, pause_ms=p.pause_ms)
                    for p in options.pauses],
            tool_calls=options.tool_calls,
        )
        return pb.GenerateRequest(
            request_id=request_id,
            messages=[pb.ChatMessage(role=m.role, content=m.text) for m in self.messages],
            max_tokens=self.max_completion_tokens or self.max_tokens or 0,
            timing=timing,
            stop=self.stop_sequences(),
            sampling=self.sampling(),
            tools=self.engine_tools(),
            tool_choice=self.engine_tool_choice(),
        )


_TOOL_CHOICE_MODES = {"none": pb.TOOL_CHOICE_MODE_NONE, "auto": pb.TOOL_CHOICE_MODE_AUTO,
                      "required": pb.TOOL_CHOICE_MODE_REQUIRED}


SAMPLING_FIELDS = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty")


FINISH_REASONS = {pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length",
                  pb.FINISH_REASON_TOOL_CALLS: "tool_calls"}


_TOKEN_SUFFIX = '},"finish_reason":null}]}\n\n'
# With `stream_options.include_usage`, OpenAI puts `"usage": null` on every
# chunk but the last (which carries the usage and no choices).
_TOKEN_SUFFIX_USAGE = '},"finish_reason":null}],"usage":null}\n\n'


class ChunkWriter:
    """Formats one stream's `chat.completion.chunk` payloads (the `data:` JSON)."""

    def __init__(self, request_id: str, model: str, include_usage: bool = False) -> None:
        self._head = {
            "id": f"chatcmpl-{request_id}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }
        self._first = True
        self._prefix: str | None = None
        self._token_prefix: str | None = None
        self._include_usage = include_usage
        self._token_suffix = _TOKEN_SUFFIX_USAGE if include_usage else _TOKEN_SUFFIX

    def token(self, text: str) -> str:
        delta: dict[str, str] = {"content": text}
        if self._first:
            delta = {"role": "assistant", "content": text}
            self._first = False
        return self._dump([{"index": 0, "delta": delta, "finish_reason": None}])

    def token_event(self, text: str) -> bytes:
        """One token's whole SSE event, byte for byte `data: {token(text)}\n\n`.

        The relay's hot path (docs/benchmarks.md, "Relay overhead"): the
        envelope never changes, so it is formatted once and only the text is
        JSON-encoded per token (the first token too: a short stream is mostly
        its first token and its finish), and the bytes skip sse-starlette's
        per-event encoder.
        """
        if self._first:
            self._first = False
            return (f'data: {self._choices_prefix()}{{"index":0,"delta":{{"role":"assistant",'
                    f'"content":{json.dumps(text, ensure_ascii=False)}'
                    f'{self._token_suffix}').encode()
        if self._token_prefix is None:
            self._token_prefix = f'data: {self._choices_prefix()}{{"index":0,"delta":{{"content":'
        return (self._token_prefix + json.dumps(text, ensure_ascii=False)
                + self._token_suffix).encode()

    def _choices_prefix(self) -> str:
        """The chunk's JSON up to its choices: `{"id":...,"model":...,"choices":[`."""
        if self._prefix is None:
            head = json.dumps(self._head, separators=(",", ":"), ensure_ascii=False)
            self._prefix = f'{head[:-1]},"choices":['
        return self._prefix

    def tool_call(self, piece: pb.ToolCallDelta) -> str:
        """One tool-call delta as OpenAI streams it: a call's first carries its
        id, type and name; later ones only its index and an arguments piece."""
        call: dict[str, Any] = {"index": piece.index}
        if piece.id:
            call.update(id=piece.id, type="function",
                        function={"name": piece.name, "arguments": piece.arguments})
        else:
            call["function"] = {"arguments": piece.arguments}
        delta: dict[str, Any] = {"tool_calls": [call]}
        if self._first:
            delta = {"role": "assistant", "content": None, **delta}
            self._first = False
        return self._dump([{"index": 0, "delta": delta, "finish_reason": None}])

    def finish(self, finish: pb.Finish) -> str:
        """`_dump` of the finish's one choice, formatted as the tokens are."""
        reason = FINISH_REASONS.get(finish.reason, "stop")
        usage = ',"usage":null' if self._include_usage else ""
        return (f'{self._choices_prefix()}{{"index":0,"delta":{{}},'
                f'"finish_reason":"{reason}"}}]{usage}}}')

    def usage(self, finish: pb.Finish) -> str:
        return self._dump([], usage=usage_dict(finish.usage))

    def _dump(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        if self._include_usage:
            extra.setdefault("usage", None)
        return json.dumps({**self._head, "choices": choices, **extra}, separators=(",", ":"),
                          ensure_ascii=False)


class ToolCallAssembler:
    """A non-streamed answer's `message.tool_calls`: the deltas joined by index."""

    def __init__(self) -> None:
        self._calls: dict[int, dict[str, Any]] = {}

    def add(self, piece: pb.ToolCallDelta) -> None:
        call = self._calls.setdefault(piece.index, {
            "id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        if piece.id:
            call["id"] = piece.id
        if piece.name:
            call["function"]["name"] = piece.name
        call["function"]["arguments"] += piece.arguments

    def calls(self) -> list[dict[str, Any]]:
        return [self._calls[index] for index in sorted(self._calls)]


def usage_dict(usage: pb.Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def completion(request_id: str, model: str, text: str, finish: pb.Finish,
               tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        # As OpenAI answers a tool call: no content, the calls assembled.
        message = {"role": "assistant", "content": text or None, "tool_calls": tool_calls}
    return {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": message,
            "finish_reason": FINISH_REASONS.get(finish.reason, "stop"),
        }],
        "usage": usage_dict(finish.usage),
    }
