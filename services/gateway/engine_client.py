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
    nothing else can arrive."""

    def __init__(self, call: EngineCall, request_id: str,
                 idle_timeout_s: float, max_duration_s: float) -> None:
        self._call = call
        self.request_id = request_id
        self._cancel_reason: str | None = None
        self._idle_timeout_s = idle_timeout_s
        self._max_duration_s = max_duration_s

    async def __aiter__(self) -> AsyncIterator[EngineEvent]:
        loop = asyncio.get_running_loop()
        ends_at = loop.time() + self._max_duration_s
        try:
            while True:
                # Deadlines bound each read only, never the time the consumer
                # spends at `yield` (a slow client's send is the send timeout's job).
                wait = min(self._idle_timeout_s, ends_at - loop.time())
                try:
                    async with asyncio.timeout(wait):
                        response = await self._call.read()
                except TimeoutError:
                    self._call.cancel()
                    if loop.time() >= ends_at:
                        raise EngineError(504, "stream_deadline",
                                          f"stream exceeded {self._max_duration_s:g} s") from None
                    raise EngineError(504, "engine_idle_timeout",
                                      f"engine sent nothing for {self._idle_timeout_s:g} s"
                                      ) from None
                if not isinstance(response, pb.GenerateResponse):  # grpc.aio.EOF
                    raise EngineError(502, "truncated",
                                      "engine stream ended without a finish event")
                if response.HasField("error"):
                    raise EngineError(502, response.error.code,
                                      f"engine: {redact_addresses(response.error.message)}")
                if response.HasField("finish"):
                    yield response.finish
                    return
                yield response.token
        except grpc.aio.AioRpcError as exc:
            raise EngineError.from_rpc_error(exc) from exc
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._cancel_reason is not None and task is not None and task.cancelling() == 0:
                # grpc.aio raises CancelledError in the reader when the *call* is
                # cancelled; this task was not, so say why instead of vanishing.
                raise EngineError(503, self._cancel_reason,
                                  f"stream ended by the gateway: {self._cancel_reason}") from None
            raise

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
