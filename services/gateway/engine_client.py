"""The gateway's side of the gRPC hop: one channel, one call per stream.

    Engine        what the gateway needs of an engine: open a call, health,
                  close. `EngineClient` is the real one (gRPC over the engine
                  hop); a test hands `create_app` a scripted one instead.
    EngineCall    the part of a grpc.aio call that EngineStream reads
    EngineStream  an accepted call: its events (tokens, then the finish) or
                  one EngineError; `cancel()` is what makes the engine stop

Every call is owned by one `EngineLease` (services/gateway/lease.py).
`EngineStream.cancel()` is synchronous and idempotent so it can run in a
`finally` that is itself being cancelled (the client-disconnect path).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.gateway.errors import EngineError, redact_addresses
from services.gateway.settings import GatewaySettings
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.engine.v1 import engine_pb2_grpc as pb_grpc

# What a stream yields: each token chunk, then the finish (nothing after it).
EngineEvent = pb.TokenChunk | pb.Finish


class EngineCall(Protocol):
    """The part of a `grpc.aio.UnaryStreamCall` that EngineStream uses."""

    async def read(self) -> object: ...  # a GenerateResponse, or grpc.aio.EOF

    def cancel(self) -> bool: ...


class Engine(Protocol):
    async def open(self, request: pb.GenerateRequest) -> EngineStream:
        """Start a generation; return once the engine accepted it, or raise EngineError."""
        ...

    async def healthy(self) -> bool: ...

    async def close(self) -> None: ...


def channel_options(settings: GatewaySettings) -> list[tuple[str, int]]:
    """Keepalive pings find a black-holed hop (engine_keepalive_s +
    engine_keepalive_timeout_s) even mid-think-pause; the engine's server options
    (services/engine/server.py) accept pings this often without "too_many_pings".
    A short reconnect backoff makes a restarted engine usable within a second."""
    return [
        ("grpc.keepalive_time_ms", int(settings.engine_keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(settings.engine_keepalive_timeout_s * 1000)),
        # Recent gRPC cores time out a ping's ack with this (default 60 s), not
        # with the keepalive timeout alone: set both or a black hole takes a minute.
        ("grpc.http2.ping_timeout_ms", int(settings.engine_keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # Bounded read-ahead: a slow client stops the engine after this many
        # bytes instead of letting a BDP-grown window absorb megabytes of tokens.
        ("grpc.http2.bdp_probe", 0),
        ("grpc.http2.lookahead_bytes", settings.engine_read_ahead_bytes),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1_000),
    ]


class EngineStream:
    """An accepted Generate call: iterate it for events, cancel it when done.

    Iterating yields each `TokenChunk` and then the `Finish`, and stops there.
    Every way the call can end without a finish raises EngineError instead:
    the engine's own error event, a stream that just ends (truncated), a gRPC
    failure, a deadline. Consumers handle tokens, the finish and EngineError;
    nothing else can arrive. A message that carries several chunks (a
    `tokens` batch: they were ready together) is yielded chunk by chunk;
    `pending` says how many of it are still to come, so a writer can put
    those in the same socket write without waiting for anything.

    Deadlines: the idle deadline bounds each read (never the time the consumer
    spends at `yield`: a slow client's send is the send timeout's job), the
    total one the whole stream. Both are one timer per stream, re-armed only
    when it fires (reads just note when they started), instead of a timeout
    object per read on the hot path. When one passes during a read, the
    timer cancels the call and the read ends in the deadline's EngineError."""

    def __init__(self, call: EngineCall, request_id: str,
                 idle_timeout_s: float, max_duration_s: float) -> None:
        self._call = call
        self.request_id = request_id
        self._cancel_reason: str | None = None
        self._idle_timeout_s = idle_timeout_s
        self._max_duration_s = max_duration_s
        self._ends_at = 0.0
        self._read_since: float | None = None  # when the read in progress began
        self._expired: EngineError | None = None
        self._watch: asyncio.TimerHandle | None = None
        self.pending = 0

    async def __aiter__(self) -> AsyncIterator[EngineEvent]:
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._ends_at = now + self._max_duration_s
        self._watch = loop.call_at(min(now + self._idle_timeout_s, self._ends_at),
                                   self._check_deadlines, loop)
        try:
            while True:
                self._read_since = now = loop.time()
                if now >= self._ends_at:
                    raise self._expire(now)
                response = await self._call.read()
                self._read_since = None
                if not isinstance(response, pb.GenerateResponse):  # grpc.aio.EOF
                    raise EngineError(502, "truncated",
                                      "engine stream ended without a finish event")
                kind = response.WhichOneof("event")
                if kind == "token":
                    yield response.token
                elif kind == "tokens":
                    chunks = response.tokens.chunks
                    for left, chunk in zip(range(len(chunks) - 1, -1, -1), chunks, strict=True):
                        self.pending = left
                        yield chunk
                elif kind == "finish":
                    yield response.finish
                    return
                elif kind == "error":
                    raise EngineError(502, response.error.code,
                                      f"engine: {redact_addresses(response.error.message)}")
        except grpc.aio.AioRpcError as exc:
            raise EngineError.from_rpc_error(exc) from exc
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling() == 0:
                # grpc.aio raises CancelledError in the reader when the *call* is
                # cancelled; this task was not, so say why instead of vanishing.
                if self._expired is not None:
                    raise self._expired from None
                if self._cancel_reason is not None:
                    raise EngineError(503, self._cancel_reason,
                                      f"stream ended by the gateway: {self._cancel_reason}"
                                      ) from None
            raise
        finally:
            self._read_since = None
            if self._watch is not None:
                self._watch.cancel()

    def _check_deadlines(self, loop: asyncio.AbstractEventLoop) -> None:
        """The stream's one timer: expire the read in progress if a deadline
        passed during it, else sleep until the earliest one that could."""
        now = loop.time()
        since = self._read_since
        if since is not None and now >= min(since + self._idle_timeout_s, self._ends_at):
            self._expire(now)
            return
        if since is None:
            # The consumer holds a token: look again later (the next read checks
            # the total deadline itself as it starts).
            at = now + self._idle_timeout_s
        else:  # a read younger than either deadline: look when one could pass
            at = min(since + self._idle_timeout_s, self._ends_at)
        self._watch = loop.call_at(at, self._check_deadlines, loop)

    def _expire(self, now: float) -> EngineError:
        if now >= self._ends_at:
            expired = EngineError(504, "stream_deadline",
                                  f"stream exceeded {self._max_duration_s:g} s")
        else:
            expired = EngineError(504, "engine_idle_timeout",
                                  f"engine sent nothing for {self._idle_timeout_s:g} s")
        self._expired = expired
        self._call.cancel()
        return expired

    def cancel(self, reason: str | None = None) -> None:
        """Cancel the call (idempotent). With a reason, a reader that is still
        iterating gets an EngineError carrying it."""
        if reason is not None and self._cancel_reason is None:
            self._cancel_reason = reason
        self._call.cancel()


class EngineClient:
    def __init__(self, settings: GatewaySettings) -> None:
        self._channel = grpc.aio.insecure_channel(settings.engine_target,
                                                  options=channel_options(settings))
        self._stub = pb_grpc.EngineServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._accept_timeout_s = settings.engine_accept_timeout_s
        self._idle_timeout_s = settings.engine_idle_timeout_s
        self._max_duration_s = settings.max_stream_duration_s
        self._retry_after_s = settings.retry_after_s

    async def open(self, request: pb.GenerateRequest) -> EngineStream:
        """Start a generation and wait until the engine has accepted it.

        Raising here, before the HTTP response starts, lets the gateway answer
        with a real status code (400, 429, 503, 504) instead of a broken stream.
        """
        # This gateway reads `tokens` batches (EngineStream yields their chunks).
        request.accept_token_batches = True
        call = self._stub.Generate(request, wait_for_ready=False)
        try:
            metadata = await asyncio.wait_for(call.initial_metadata(), self._accept_timeout_s)
        except TimeoutError as exc:
            call.cancel()
            raise EngineError(
                504, "engine_timeout",
                f"engine did not accept the call within {self._accept_timeout_s:g} s",
            ) from exc
        except grpc.aio.AioRpcError as exc:
            raise EngineError.from_rpc_error(exc, self._retry_after_s) from exc
        except BaseException:
            call.cancel()
            raise
        if call.done():
            # The engine may fail a call with trailers only (e.g. INVALID_ARGUMENT).
            code = await call.code()
            if code != grpc.StatusCode.OK:
                raise EngineError.from_status(code, await call.details(), self._retry_after_s)
        request_id = dict(metadata or ()).get("x-request-id", request.request_id)
        return EngineStream(call, str(request_id), self._idle_timeout_s, self._max_duration_s)

    async def healthy(self) -> bool:
        """The engine's gRPC health, asked through the same hop the streams use."""
        try:
            response = await self._health.Check(
                health_pb2.HealthCheckRequest(service=""), timeout=self._accept_timeout_s)
        except grpc.aio.AioRpcError:
            return False
        return bool(response.status == health_pb2.HealthCheckResponse.SERVING)

    async def close(self) -> None:
        await self._channel.close()
