"""OpenAI's Responses API, the shapes: the create request and the typed
stream events, as the official `openai` SDK parses them
(openai/types/responses/).

A response's events are a pure function of its generation's events, so the
same writer serves a live stream, a replay from the resume store's log and a
retrieved response object:

    sequence_number  event
    0                response.created
    1                response.in_progress
    2                response.output_item.added      (the one assistant message)
    3                response.content_part.added     (its one output_text part)
    3 + k            response.output_text.delta      token k of the log (k = 1, 2, ...)
    3 + t ...        the end, at log entry t:
                       done       -> output_text.done, content_part.done,
                                     output_item.done, response.completed
                                     (response.incomplete when max_output_tokens cut it)
                       cancelled  -> response.incomplete, status "cancelled"
                       error      -> response.failed

Replaying a log from its start therefore renders every event with the same
sequence number each time, on any replica: `starting_after=N` is "render from
the start, send what is numbered above N", exactly once by construction.

The SDK has no `response.cancelled` event type; a cancelled response ends with
`response.incomplete` whose response has the SDK's `status: "cancelled"`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from services.gateway.openai_api import (
    UINT32_MAX,
    ChatCompletionRequest,
    StreamlabOptions,
    WireText,
)

RESPONSE_PREFIX = "resp_"
MESSAGE_PREFIX = "msg_"
OPENING_EVENTS = 4  # created, in_progress, output_item.added, content_part.added
MAX_METADATA_PAIRS = 16  # OpenAI's limit on `metadata`

# OpenAI's strictness, and unknown parameters refused by name (`tools`,
# `previous_response_id`, `reasoning`, ...): a 400 whose `param` is the field.
STRICT = ConfigDict(strict=True, extra="forbid")


class InputText(BaseModel):
    """One text part of a message's `content` (`input_text`; an assistant
    turn sent back as history carries `output_text`)."""

    model_config = ConfigDict(strict=True, extra="ignore")  # annotations, logprobs
    type: Literal["input_text", "output_text"]
    text: WireText


class InputMessage(BaseModel):
    model_config = STRICT
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: WireText | list[InputText]
    # An assistant message sent back as history carries these; accepted, unused.
    id: str | None = None
    status: str | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class CreateResponseRequest(BaseModel):
    model_config = STRICT
    model: WireText | None = Field(None, max_length=256)
    input: WireText | list[InputMessage]
    instructions: WireText | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=UINT32_MAX)
    stream: bool | None = False
    background: bool | None = False
    # None: OpenAI's default (stored); only a background response is kept here.
    store: bool | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    metadata: dict[str, WireText] | None = Field(None, max_length=MAX_METADATA_PAIRS)
    # The lab's fake-model options, as on /v1/chat/completions
    # (`extra_body={"streamlab": {...}}` from the SDK).
    streamlab: StreamlabOptions | None = None

    @field_validator("input")
    @classmethod
    def _some_input(cls, value: str | list[InputMessage]) -> str | list[InputMessage]:
        if isinstance(value, list) and not value:
            raise ValueError("needs at least one message")
        return value

    @field_validator("store")
    @classmethod
    def _stored_only_in_background(cls, store: bool | None, info: Any) -> bool | None:
        background = bool(info.data.get("background"))
        if store is False and background:
            raise ValueError("a background response must be stored (store: false and "
                             "background: true cannot go together)")
        if store is True and not background:
            raise ValueError("only background responses are kept by this gateway; send "
                             "background: true to retrieve or resume it later")
        return store

    def messages(self) -> list[dict[str, str]]:
        turns: list[dict[str, str]] = []
        if self.instructions:
            turns.append({"role": "system", "content": self.instructions})
        if isinstance(self.input, str):
            turns.append({"role": "user", "content": self.input})
        else:
            turns.extend({"role": m.role, "content": m.text} for m in self.input)
        return turns

    def to_chat(self) -> ChatCompletionRequest:
        """The same generation as a chat request: what the engine lease serves."""
        return ChatCompletionRequest.model_validate({
            "model": self.model,
            "messages": self.messages(),
            "stream": True,
            "max_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "streamlab": self.streamlab,
        })

    def echo(self) -> Echo:
        return Echo(instructions=self.instructions, max_output_tokens=self.max_output_tokens,
                    temperature=self.temperature, top_p=self.top_p,
                    background=bool(self.background), metadata=dict(self.metadata or {}))


@dataclass(frozen=True)
class Echo:
    """What a response object repeats of the request that made it."""

    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    background: bool = True
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Event:
    sequence_number: int
    type: str
    data: dict[str, Any]

    def json(self) -> str:
        return json.dumps(self.data, separators=(",", ":"), ensure_ascii=False)


def response_usage(usage: dict[str, int]) -> dict[str, Any]:
    """A chat `usage` (as the resume log stores it) in the Responses shape."""
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    return {"input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion}


class ResponseWriter:
    """One response's events, numbered from 0, and its object as of now."""

    def __init__(self, stream_id: str, model: str, created_at: int, echo: Echo) -> None:
        self.id = RESPONSE_PREFIX + stream_id
        self.item_id = MESSAGE_PREFIX + stream_id
        self.model = model
        self.created_at = created_at
        self.echo = echo
        self.status = "in_progress"
        self.item_status = "in_progress"
        self.parts: list[str] = []
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.incomplete: dict[str, Any] | None = None
        self.opened = False
        self.ended = False
        self._seq = -1

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def _event(self, kind: str, **fields: Any) -> Event:
        self._seq += 1
        return Event(self._seq, kind, {"type": kind, "sequence_number": self._seq, **fields})

    def _part(self) -> dict[str, Any]:
        return {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}

    def _item(self) -> dict[str, Any]:
        content = [self._part()] if self.opened else []
        return {"id": self.item_id, "type": "message", "role": "assistant",
                "status": self.item_status, "content": content}

    def response(self) -> dict[str, Any]:
        echo = self.echo
        return {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "model": self.model, "status": self.status, "background": echo.background,
            "error": self.error, "incomplete_details": self.incomplete,
            "instructions": echo.instructions, "max_output_tokens": echo.max_output_tokens,
            "metadata": echo.metadata, "output": [self._item()] if self.opened else [],
            "parallel_tool_calls": False, "temperature": echo.temperature,
            "top_p": echo.top_p, "tool_choice": "auto", "tools": [],
            "text": {"format": {"type": "text"}}, "truncation": "disabled",
            "usage": self.usage,
        }

    def opening(self) -> list[Event]:
        created = self._event("response.created", response=self.response())
        in_progress = self._event("response.in_progress", response=self.response())
        self.opened = True
        self.parts = []
        item = self._item()
        item["content"] = []
        added = self._event("response.output_item.added", output_index=0, item=item)
        part = self._event("response.content_part.added", item_id=self.item_id, output_index=0,
                           content_index=0, part=self._part())
        return [created, in_progress, added, part]

    def delta(self, text: str) -> Event:
        self.parts.append(text)
        return self._event("response.output_text.delta", item_id=self.item_id, output_index=0,
                           content_index=0, delta=text, logprobs=[])

    def completed(self, finish_reason: str, usage: dict[str, int]) -> list[Event]:
        self.ended = True
        self.usage = response_usage(usage)
        cut = finish_reason == "length"
        self.item_status = "incomplete" if cut else "completed"
        text_done = self._event("response.output_text.done", item_id=self.item_id,
                                output_index=0, content_index=0, text=self.text, logprobs=[])
        part_done = self._event("response.content_part.done", item_id=self.item_id,
                                output_index=0, content_index=0, part=self._part())
        item_done = self._event("response.output_item.done", output_index=0, item=self._item())
        if cut:
            self.status = "incomplete"
            self.incomplete = {"reason": "max_output_tokens"}
            end = self._event("response.incomplete", response=self.response())
        else:
            self.status = "completed"
            end = self._event("response.completed", response=self.response())
        return [text_done, part_done, item_done, end]

    def cancelled(self) -> list[Event]:
        self.ended = True
        self.status = "cancelled"
        self.item_status = "incomplete"
        return [self._event("response.incomplete", response=self.response())]

    def failed(self, error: dict[str, Any]) -> list[Event]:
        self.ended = True
        self.status = "failed"
        self.item_status = "incomplete"
        # The SDK's `ResponseError.code` is a closed set: the gateway's own code
        # (engine_failed, deadline_exceeded, ...) leads the message instead.
        code = "rate_limit_exceeded" if error.get("type") == "rate_limit_error" else \
            "server_error"
        own = str(error.get("code") or "error")
        self.error = {"code": code,
                      "message": f"{own}: {error.get('message') or 'generation failed'}"}
        return [self._event("response.failed", response=self.response())]

    def apply(self, kind: str, payload: dict[str, Any]) -> list[Event]:
        """The events of one resume-log entry (services/gateway/resume/streams.py)."""
        if kind == "token":
            return [self.delta(str(payload.get("text", "")))]
        if kind == "done":
            return self.completed(str(payload.get("finish_reason", "stop")),
                                  payload.get("usage") or {})
        if kind == "cancelled":
            return self.cancelled()
        if kind == "error":
            return self.failed(payload.get("error") or {})
        return []


def stream_id_of(response_id: str) -> str:
    """The resume store's id inside a response id (`resp_<id>`); '' if it is not one."""
    return response_id.removeprefix(RESPONSE_PREFIX) if response_id.startswith(
        RESPONSE_PREFIX) else ""
