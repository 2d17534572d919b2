"""Errors at the gateway's boundary, and how the engine's gRPC status maps onto HTTP.

    GatewayError           anything the client is told about; carries
      .status_code         the HTTP status the client gets before the first byte
      .code                a short machine-readable code (also in SSE error events)
      .param               the request field at fault (dotted), or None
      ├── BadRequest       the request itself is wrong (400)
      └── EngineError      the engine refused, failed or could not be reached

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


class GatewayError(Exception):
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
