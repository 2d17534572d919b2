"""Everything the gateway raises on purpose, under one root, and how the
engine's gRPC status maps onto HTTP.

    GatewayException              the root: catch it to catch any of them
      ├── GatewayError            anything the client is told about; carries
      │     .status_code          the HTTP status the client gets before the first byte
      │     .code                 a short machine-readable code; after the first byte,
      │                           the `code` of the SSE `error` event (on /ws: the
      │                           close code and reason, ws_routes.py)
      │     .param                the request field at fault (dotted), or None
      │   ├── BadRequest          400, the request itself is wrong: malformed_last_event_id,
      │   │                       foreign_last_event_id, prompt_too_long, ... (the code says)
      │   ├── JobNotFound         404 job_not_found (jobs.py)
      │   ├── TooManyStreams      429 too_many_streams, with Retry-After (limits.py)
      │   ├── TooManyConnections  429 too_many_connections, with Retry-After (limits.py)
      │   ├── ServerBusy          503 server_busy, with Retry-After: set-ups queued past
      │   │                       admission_max_wait_s (admission.py)
      │   └── EngineError         the engine refused, failed or could not be reached:
      │                           its gRPC status as HTTP (INVALID_ARGUMENT, OUT_OF_RANGE,
      │                           FAILED_PRECONDITION 400, NOT_FOUND 404,
      │                           RESOURCE_EXHAUSTED 429, UNAVAILABLE 503,
      │                           DEADLINE_EXCEEDED 504, any other 502), code = the
      │                           status's name (`unavailable`); after the first byte,
      │                           the SSE `error` event's code
      ├── BadEventId              a Last-Event-ID that is not `<stream id>:<sequence>`
      │                           (also a ValueError); the resume routes answer it with
      │                           BadRequest 400 malformed_last_event_id (resume/replay_log.py)
      └── ReaderMustMove          a tail reader on a draining replica: its stream ends
                                  without a terminal event and the client reconnects
                                  elsewhere after `retry:`; no status, no SSE error
                                  (resume/redis_tail.py)

Plain GatewayErrors carry the rest of the codes (400 unsupported_data; 404 model_not_found,
unknown_stream; 410 stream_expired; 413 body_too_large, message_too_big; 503
server_draining, resume_capacity, resume_store_unavailable); app.py turns any
GatewayError into its status and body, the SSE surfaces into an `error` event
with its code. The two outside GatewayError are the gateway's own control
flow: nothing a client is told.

Every body is OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`,
with OpenAI's types: `rate_limit_error` for 429, `server_error` for 5xx,
`invalid_request_error` for every other 4xx (OpenAI's own 401 and 404 say so too).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import grpc

log = logging.getLogger("streamlab.gateway")

_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,  # engine queue full: shed, retry later
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
# gRPC's own details name internal addresses ("failed to connect to all
# addresses; last error: UNKNOWN: ipv4:127.0.0.1:8473: Connection refused"), and
# an engine's backend may name its upstream's URL: the whole text is logged, and
# the client is told it with every address replaced.
_ADDRESS = re.compile(
    r"(?:ipv[46]|unix|unix-abstract|dns|vsock):[^\s,;]*[^\s,;:]"  # gRPC's resolved addresses
    r"|[a-z][a-z0-9+.-]*://[^\s,;]*[^\s,;:]"  # URLs
    r"|\[[0-9a-fA-F:.]+\](?::\d+)?"  # [v6]:port
    r"|\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b"  # v4[:port]
    r"|\b[a-zA-Z][\w.-]*:\d{2,5}\b",  # host:port
    re.IGNORECASE)


def redact_addresses(text: str) -> str:
    return _ADDRESS.sub("<address>", text)


def error_type(status_code: int) -> str:
    """OpenAI's `type` for an HTTP status."""
    if status_code == 429:
        return "rate_limit_error"
    if status_code >= 500:
        return "server_error"
    return "invalid_request_error"


def error_body(status_code: int, code: str, message: str,
               param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type(status_code), "param": param,
                      "code": code}}


def error_json(body: dict[str, Any]) -> bytes:
    """ASCII JSON: safe whatever an error message quotes back (a lone
    surrogate in a client's value cannot be encoded as UTF-8)."""
    return json.dumps(body, ensure_ascii=True).encode("ascii")


# What pydantic puts in an error's location besides field names and indexes:
# the member of a union it tried ("str", "list[ContentPart]", "function-after[...]").
_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "null"}


def validation_problem(errors: Sequence[Mapping[str, Any]],
                       skip: tuple[str, ...] = ("body", "query", "path", "header")
                       ) -> tuple[str | None, str]:
    """The first problem of a pydantic validation, as (param, message): the
    field's dotted path (OpenAI's `param`) and what is wrong with it, never
    the value itself (it may be anything, a lone surrogate included)."""
    def path(error: Mapping[str, Any]) -> list[str]:
        parts = [str(p) for p in error.get("loc", ()) if p not in skip]
        return [p for p in parts if not any(c in p for c in "[(") and p not in _UNION_TAGS]

    # A union reports one error per member it tried: the one that got deepest
    # into the value is the one about what the client meant (`stop: ["ok", 1]`
    # is about stop.1, not about stop not being a string).
    first: Mapping[str, Any] = max(errors, key=lambda e: len(path(e)), default={})
    param = ".".join(path(first)) or None
    what = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    return param, (f"{param}: {what}" if param else f"request body: {what}")


class GatewayException(Exception):
    """The root of every exception the gateway raises on purpose (the tree above)."""


class GatewayError(GatewayException):
    """An error the client is told about: an HTTP status before the first
    byte, an SSE `error` event with `code` after it."""

    def __init__(self, status_code: int, code: str, message: str,
                 headers: dict[str, str] | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code
        self.message = message
        self.param = param
        self.headers: dict[str, str] = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """OpenAI-style error object."""
        return error_body(self.status_code, self.code, self.message, self.param)


class BadRequest(GatewayError):
    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(400, code, message, param=param)


class EngineError(GatewayError):
    @classmethod
    def from_status(cls, status: grpc.StatusCode, details: str | None,
                    retry_after_s: int = 1) -> EngineError:
        """`retry_after_s`: the gateway's setting, sent with a 429 or 503 (it
        only matters before the first byte, when the status is the answer)."""
        text = details or status.name
        message = f"engine: {redact_addresses(text)}"
        if message != f"engine: {text}":
            log.warning("engine call failed: %s: %s", status.name, text)
        error = cls(_HTTP_STATUS.get(status, 502), status.name.lower(), message)
        if error.status_code in (429, 503):
            error.headers["Retry-After"] = str(retry_after_s)
        return error

    @classmethod
    def from_rpc_error(cls, exc: grpc.aio.AioRpcError, retry_after_s: int = 1) -> EngineError:
        return cls.from_status(exc.code(), exc.details(), retry_after_s)
