"""Errors at the gateway's boundary, and how the engine's gRPC status maps onto HTTP.

    GatewayError           anything the client is told about; carries
      .status_code         the HTTP status the client gets before the first byte
      .code                a short machine-readable code (also in SSE error events)
      ├── BadRequest       the request itself is wrong (400)
      └── EngineError      the engine refused, failed or could not be reached
"""

from __future__ import annotations

from typing import Any

import grpc

_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,  # engine queue full: shed, retry later
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}


class GatewayError(Exception):
    def __init__(self, status_code: int, code: str, message: str,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code
        self.message = message
        self.headers: dict[str, str] = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """OpenAI-style error object."""
        kind = "invalid_request_error" if self.status_code < 500 else "engine_error"
        return {"error": {"message": self.message, "type": kind, "code": self.code}}


class BadRequest(GatewayError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(400, code, message)


class EngineError(GatewayError):
    @classmethod
    def from_status(cls, status: grpc.StatusCode, details: str | None,
                    retry_after_s: int = 1) -> EngineError:
        """`retry_after_s`: the gateway's setting, sent with a 429 or 503 (it
        only matters before the first byte, when the status is the answer)."""
        error = cls(
            _HTTP_STATUS.get(status, 502), status.name.lower(), f"engine: {details or status.name}"
        )
        if error.status_code in (429, 503):
            error.headers["Retry-After"] = str(retry_after_s)
        return error

    @classmethod
    def from_rpc_error(cls, exc: grpc.aio.AioRpcError, retry_after_s: int = 1) -> EngineError:
        return cls.from_status(exc.code(), exc.details(), retry_after_s)
