"""A scripted, in-process engine for the gateway's unit tests: the seam is
`create_app(settings, engine=ScriptedEngine(...))`, as httpx's MockTransport
is for its client.

Each call plays its script through the real `EngineStream` (so deadlines,
truncation and cancel reasons behave as on the wire): tokens, then a finish,
an engine error event, or nothing (EOF). A call whose script says `hold`
stops before its next token until the test calls `release()`, so a test can
act while a generation is in flight. `cancel()` behaves as grpc.aio's: a
reader waiting on the call gets CancelledError.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from services.gateway.engine_client import EngineStream
from services.gateway.errors import EngineError
from streamlab_protocol.engine.v1 import engine_pb2 as pb

EOF = object()  # what grpc.aio's read() returns at the end of a stream


@dataclass
class Script:
    tokens: int = 3
    hold_after: int | None = None  # stop before this token index until release()
    end: str = "finish"  # "finish", "error" (an engine error event) or "eof"


class ScriptedCall:
    def __init__(self, request: pb.GenerateRequest, script: Script) -> None:
        self.request = request
        self.cancelled = False
        self.sent = 0
        self._script = script
        self._released = asyncio.Event()
        self._woken = asyncio.Event()
        self._ended = False

    def release(self) -> None:
        self._released.set()

    async def read(self) -> object:
        script = self._script
        if self.sent == script.hold_after and not self._released.is_set():
            waiter = asyncio.ensure_future(self._released.wait())
            woken = asyncio.ensure_future(self._woken.wait())
            await asyncio.wait({waiter, woken}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            woken.cancel()
        if self.cancelled:
            raise asyncio.CancelledError
        if self.sent < script.tokens:
            self.sent += 1
            return pb.GenerateResponse(token=pb.TokenChunk(index=self.sent - 1,
                                                           text=f"t{self.sent - 1} "))
        if self._ended or script.end == "eof":
            return EOF
        self._ended = True
        if script.end == "error":
            return pb.GenerateResponse(error=pb.StreamError(code="engine_failed",
                                                            message="scripted failure"))
        return pb.GenerateResponse(finish=pb.Finish(
            reason=pb.FINISH_REASON_STOP,
            usage=pb.Usage(prompt_tokens=1, completion_tokens=self.sent)))

    def cancel(self) -> bool:
        self.cancelled = True
        self._woken.set()
        return True


class ScriptedEngine:
    """Every `open()` plays `script`, or raises `refusal` (an engine that says no)."""

    def __init__(self, script: Script | None = None, refusal: EngineError | None = None,
                 idle_timeout_s: float = 30.0) -> None:
        self.script = script or Script()
        self.refusal = refusal
        self.calls: list[ScriptedCall] = []
        self.closed = False
        self._idle_timeout_s = idle_timeout_s

    async def open(self, request: pb.GenerateRequest) -> EngineStream:
        if self.refusal is not None:
            raise self.refusal
        call = ScriptedCall(request, self.script)
        self.calls.append(call)
        return EngineStream(call, request.request_id, self._idle_timeout_s, 3600.0)

    async def attach(self, request_id: str, after_index: int | None,
                     traceparent: str = "") -> EngineStream:
        raise EngineError(404, "not_found", f"no detachable generation {request_id!r}")

    async def cancel(self, request_id: str) -> bool:
        return False

    async def healthy(self) -> bool:
        return True

    async def close(self) -> None:
        self.closed = True

    @property
    def last(self) -> ScriptedCall:
        return self.calls[-1]
