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

Detachable generations (a request with `detachable` set; the engine keeps one
running for its orphan grace when its call drops, so another gateway replica
can `attach()` to it): dropping the call no longer stops the engine, so
`EngineStream.stop()` sends the explicit Cancel first (a background task,
short deadline) and cancels the call after it; `cancel()` only drops the
call, which leaves the generation to be re-attached. `EngineClient.attach()`
opens a stream on one from an index, `EngineClient.cancel()` stops one by id.

The wire (settings.engine_wire, chosen once from `WIRES`): an `EngineWire`
says where a new or re-attached generation's call may start, the client takes
the first that the engine accepts. `PerRequestWire` starts a gRPC call per
stream; `MultiplexedWire` carries them all on one Session per engine
(engine_mux.py), whose calls EngineStream reads exactly as it reads a Generate
call. The explicit Cancel and the health check are unary calls on either wire.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from time import monotonic
from typing import TYPE_CHECKING, Protocol, TypeAlias

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.gateway.engine_mux import EngineMux, MuxCall, window_tokens
from services.gateway.errors import EngineError, redact_addresses
from services.gateway.settings import EngineWireName, GatewaySettings
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.engine.v1 import engine_pb2_grpc as pb_grpc

log = logging.getLogger("streamlab.gateway.engine")

if TYPE_CHECKING:
    from services.gateway.metrics import StreamTimings

# What a stream yields: each token chunk (or tool-call delta, only to a request
# that offered tools), then the finish (nothing after it).
EngineEvent = pb.TokenChunk | pb.ToolCallDelta | pb.Finish


class EngineCall(Protocol):
    """The part of a `grpc.aio.UnaryStreamCall` that EngineStream uses."""

    async def read(self) -> object: ...  # a GenerateResponse, or grpc.aio.EOF

    def cancel(self) -> bool: ...


class Engine(Protocol):
    async def open(self, request: pb.GenerateRequest) -> EngineStream:
        """Start a generation; return once the engine accepted it, or raise EngineError."""
        ...

    async def attach(self, request_id: str, after_index: int | None,
                     traceparent: str = "") -> EngineStream:
        """Continue a detachable generation from the token after `after_index`
        (None: from the first); raise EngineError (404 when the engine holds none).
        `traceparent`: the caller's span, tracing on (passed only then)."""
        ...

    async def cancel(self, request_id: str) -> bool:
        """The explicit stop of a detachable generation; True if one was running."""
        ...

    async def healthy(self) -> bool: ...

    async def close(self) -> None: ...


def attach_verdict(kept: EngineError | None, refusal: EngineError) -> EngineError:
    """Of the engines' refusals of one Attach (asked of each in turn), the one
    that decides: an engine that did not answer (503, 504) over one that said
    404, since the one that did not answer may hold the generation (its hop
    still coming back after a blip) and the caller may try again; a 404 is the
    verdict only when every engine said it."""
    if kept is None or refusal.status_code != 404:
        return refusal
    return kept


def channel_options(settings: GatewaySettings) -> list[tuple[str, int]]:
    """Keepalive pings find a black-holed hop (engine_keepalive_s +
    engine_keepalive_timeout_s) even mid-think-pause; the engine's server options
    (services/engine/server.py) accept pings this often without "too_many_pings".
    A short reconnect backoff makes a restarted engine usable within a second;
    a connect timeout longer than the hop's round trip lets it reconnect
    across a slow hop."""
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
        # gRPC core names the connect deadline "min reconnect backoff": each
        # attempt gets max(this, the current backoff). Sized above the hop's
        # round trip (settings.py) so a reconnect across a slow hop completes.
        ("grpc.min_reconnect_backoff_ms", int(settings.engine_connect_timeout_s * 1000)),
        ("grpc.initial_reconnect_backoff_ms", int(settings.engine_reconnect_backoff_s * 1000)),
        ("grpc.max_reconnect_backoff_ms", int(settings.engine_reconnect_backoff_max_s * 1000)),
    ]


def engine_service_config(settings: GatewaySettings) -> str | None:
    """The channel's service config for several engines: round_robin over every
    address of the target, each address health-checked (the engine's
    Health/Watch stream, service ""), so a NOT_SERVING engine drops out of the
    pick list until it serves again. None: gRPC's default (pick_first)."""
    balancing = settings.engine_balancing
    if balancing == "auto":
        balancing = "round_robin" if "," in settings.engine_target else "pick_first"
    if balancing == "pick_first":
        return None
    config: dict[str, object] = {"loadBalancingConfig": [{"round_robin": {}}]}
    if settings.engine_health_checks:
        config["healthCheckConfig"] = {"serviceName": ""}
    return json.dumps(config)


def balanced_target(target: str) -> str:
    """gRPC lists several addresses only as IP literals (`ipv4:a:p1,b:p2`). A
    list of host names (`toxiproxy:8473,toxiproxy:8483`, the compose lab's engine
    hops) is resolved here, once, into that form; anything else is left as is."""
    if "," not in target or target.startswith(("ipv4:", "ipv6:")):
        return target
    addresses = []
    for entry in target.split(","):
        host, _, port = entry.strip().rpartition(":")
        info = socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)
        addresses.append(f"{info[0][4][0]}:{port}")
    return "ipv4:" + ",".join(addresses)


class EngineStream:
    """An accepted Generate call: iterate it for events, cancel it when done.

    Iterating yields each `TokenChunk` and then the `Finish`, and stops there.
    Every way the call can end without a finish raises EngineError instead:
    the engine's own error event, a stream that just ends (truncated), a gRPC
    failure, a deadline. Consumers handle tokens, the finish and EngineError;
    nothing else can arrive. A message that carries several chunks (a
    `tokens` batch: they were ready together) is yielded chunk by chunk;
    `pending` says how many events are still to come without waiting: the
    rest of that batch, and on the multiplexed wire the events that arrived
    with this one (a step's last token and the finish come in one message), so
    a writer can put those in the same socket write without waiting for anything.

    Deadlines: the idle deadline bounds each read (never the time the consumer
    spends at `yield`: a slow client's send is the send timeout's job), the
    total one the whole stream. Both are one timer per stream, re-armed only
    when it fires (reads just note when they started), instead of a timeout
    object per read on the hot path. When one passes during a read, the
    timer cancels the call and the read ends in the deadline's EngineError.

    Hooks, set by the lease before iterating (no wrapper around the events:
    a generator layer per token only to watch them cost CPU on every token):
    `timings` is told when each message of tokens arrives (the latency
    histograms); `on_error` gets every EngineError the iteration raises, once,
    just before it is raised. `ended`: the engine's side is over (a finish or
    an error), so a cancel after it stops nothing."""

    def __init__(self, call: EngineCall, request_id: str,
                 idle_timeout_s: float, max_duration_s: float,
                 explicit_cancel: Callable[[], None] | None = None) -> None:
        """`explicit_cancel`: for a detachable generation, starts the engine's
        Cancel and cancels the call once it is sent (EngineClient makes it)."""
        self._call = call
        self.request_id = request_id
        self._explicit_cancel = explicit_cancel
        self._cancel_reason: str | None = None
        self._idle_timeout_s = idle_timeout_s
        self._max_duration_s = max_duration_s
        self._ends_at = 0.0
        self._read_since: float | None = None  # when the read in progress began
        self._expired: EngineError | None = None
        self._watch: asyncio.TimerHandle | None = None
        self._batch_left = 0  # chunks of the current batch message still to yield
        # A call that holds events already received (a MuxCall): how many.
        self._queued: Callable[[], int] | None = getattr(call, "queued", None)
        self.timings: StreamTimings | None = None
        self.on_error: Callable[[EngineError], None] | None = None
        self.ended = False

    @property
    def pending(self) -> int:
        """Events the iteration yields next without waiting for the engine."""
        queued = self._queued
        return self._batch_left + (queued() if queued is not None else 0)

    async def __aiter__(self) -> AsyncIterator[EngineEvent]:
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._ends_at = now + self._max_duration_s
        self._watch = loop.call_at(min(now + self._idle_timeout_s, self._ends_at),
                                   self._check_deadlines, loop)
        timings = self.timings
        try:
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
                        if timings is not None:
                            timings.tokens(monotonic(), 1)
                        yield response.token
                    elif kind == "tokens":
                        chunks = response.tokens.chunks
                        if timings is not None:
                            timings.tokens(monotonic(), len(chunks))
                        for left, chunk in zip(range(len(chunks) - 1, -1, -1), chunks,
                                               strict=True):
                            self._batch_left = left
                            yield chunk
                    elif kind == "tool_call":
                        if timings is not None:
                            timings.tokens(monotonic(), 1)
                        yield response.tool_call
                    elif kind == "finish":
                        self.ended = True
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
        except EngineError as exc:
            # Every failure passes here once: the one place that counts them.
            self.ended = True
            if self.on_error is not None:
                self.on_error(exc)
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

    @property
    def detachable(self) -> bool:
        return self._explicit_cancel is not None

    def cancel(self, reason: str | None = None) -> None:
        """Cancel the call (idempotent). With a reason, a reader that is still
        iterating gets an EngineError carrying it. A detachable generation
        survives this (the engine orphans it for another replica): `stop()`."""
        if reason is not None and self._cancel_reason is None:
            self._cancel_reason = reason
        self._call.cancel()

    def stop(self, reason: str | None = None) -> None:
        """End the generation itself (idempotent): a detachable one gets the
        explicit Cancel, then its call is cancelled; any other, `cancel()`."""
        explicit, self._explicit_cancel = self._explicit_cancel, None
        if explicit is None or self.ended:
            self.cancel(reason)
            return
        if reason is not None and self._cancel_reason is None:
            self._cancel_reason = reason
        explicit()


def each_address(target: str) -> list[str]:
    """The engines of a balanced target one by one (`ipv4:a:1,b:2` → `ipv4:a:1`,
    `ipv4:b:2`); a single target is its own only one."""
    scheme, sep, rest = target.partition(":")
    if not sep or scheme not in ("ipv4", "ipv6") or "," not in rest:
        return [target]
    return [f"{scheme}:{address.strip()}" for address in rest.split(",")]


# A call a wire starts: what `EngineClient._accepted` waits on and EngineStream reads.
WireCall: TypeAlias = "grpc.aio.UnaryStreamCall | MuxCall"


@dataclass(frozen=True, slots=True)
class Attempts:
    """Where a generation's call may start: each start in turn until the
    engine accepts one, or refuses one with a status not in `retry_on` (a
    refusal before acceptance started nothing, so the next is safe to try);
    of the refusals, `attach_verdict` picks the one that decides."""

    starts: Sequence[Callable[[], WireCall]]
    retry_on: tuple[int, ...] = ()


class EngineWire(Protocol):
    """How generations travel to the engines (settings.engine_wire)."""

    def open(self, request: pb.GenerateRequest) -> Attempts:
        """Where a new generation starts (its traceparent, if any, travels with it)."""
        ...

    def attach(self, request: pb.AttachRequest, traceparent: str) -> Attempts:
        """Where a detachable generation is attached to: the engine holding it
        accepts, the others refuse. `traceparent`: the caller's span, or ""."""
        ...

    async def close(self) -> None: ...


Stub = pb_grpc.EngineServiceStub


class PerRequestWire:
    """A gRPC call per stream (Generate, Attach) on the balanced channel's stub;
    the trace context travels as the call's own metadata."""

    def __init__(self, stub: Stub, pinned: list[Stub], settings: GatewaySettings) -> None:
        self._stub = stub
        self._pinned = pinned

    def open(self, request: pb.GenerateRequest) -> Attempts:
        # (The field stays set: a retry of this request keeps its trace.)
        metadata = (("traceparent", request.traceparent),) if request.traceparent else None
        return Attempts([partial(self._stub.Generate, request, wait_for_ready=False,
                                 metadata=metadata)])

    def attach(self, request: pb.AttachRequest, traceparent: str) -> Attempts:
        metadata = (("traceparent", traceparent),) if traceparent else None
        if not self._pinned:
            return Attempts([partial(self._stub.Attach, request, wait_for_ready=False,
                                     metadata=metadata)])
        # Each engine in turn: the one holding the generation accepts; the others
        # answer NOT_FOUND (or are down), and the last answer is the verdict.
        return Attempts([partial(stub.Attach, request, wait_for_ready=False, metadata=metadata)
                         for stub in self._pinned], retry_on=(404, 503, 504))

    async def close(self) -> None:
        return None  # its calls end with the channels, which the client closes


class MultiplexedWire:
    """A Session per engine (engine_mux.py; on its own channel when there are
    several, as the balanced channel would pin one session to one); the trace
    context travels in the request."""

    def __init__(self, stub: Stub, pinned: list[Stub], settings: GatewaySettings) -> None:
        self._mux = EngineMux(pinned or [stub], settings.engine_health_checks,
                              window_tokens(settings.engine_read_ahead_bytes))

    def open(self, request: pb.GenerateRequest) -> Attempts:
        # The sessions in turn, as the balancer skips an engine it cannot reach.
        return Attempts([partial(session.open, request) for session in self._mux.rotation()],
                        retry_on=(503,))

    def attach(self, request: pb.AttachRequest, traceparent: str) -> Attempts:
        if traceparent:
            request.traceparent = traceparent
        # The engine holding it accepts; the others 404.
        return Attempts([partial(session.attach, request) for session in self._mux.sessions],
                        retry_on=(404, 503))

    async def close(self) -> None:
        await self._mux.close()


# Each wire's name (settings.py's EngineWireName) and its implementation.
WIRES: dict[EngineWireName, Callable[[Stub, list[Stub], GatewaySettings], EngineWire]] = {
    "per_request": PerRequestWire,
    "multiplexed": MultiplexedWire,
}


class EngineClient:
    def __init__(self, settings: GatewaySettings) -> None:
        options: list[tuple[str, int | str]] = list(channel_options(settings))
        base_options = list(options)
        if (service_config := engine_service_config(settings)) is not None:
            options.append(("grpc.service_config", service_config))
        target = balanced_target(settings.engine_target)
        self._channel = grpc.aio.insecure_channel(target, options=options)
        self._stub = pb_grpc.EngineServiceStub(self._channel)
        # With several engines, a generation lives on one of them, and the
        # balanced channel sends a call to any: an explicit Cancel or an Attach
        # by request id went to the wrong engine half the time (NOT_FOUND; the
        # generation ran on until its orphan grace: a DELETE that stopped
        # nothing for 10 s on the 2x2 compose lab). Those go to each engine on a
        # channel of its own instead: Cancel to all, Attach to the one that has it.
        addresses = each_address(target)
        self._pinned_channels = ([grpc.aio.insecure_channel(a, options=base_options)
                                  for a in addresses] if len(addresses) > 1 else [])
        self._pinned = [pb_grpc.EngineServiceStub(c) for c in self._pinned_channels]
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._wire = WIRES[settings.engine_wire](self._stub, self._pinned, settings)
        self._accept_timeout_s = settings.engine_accept_timeout_s
        self._idle_timeout_s = settings.engine_idle_timeout_s
        self._max_duration_s = settings.max_stream_duration_s
        self._retry_after_s = settings.retry_after_s
        self._cancel_timeout_s = settings.engine_cancel_timeout_s
        # Explicit Cancels in flight (EngineStream.stop): held so none is collected.
        self._cancelling: set[asyncio.Task[None]] = set()

    async def open(self, request: pb.GenerateRequest) -> EngineStream:
        """Start a generation and wait until the engine has accepted it.

        Raising here, before the HTTP response starts, lets the gateway answer
        with a real status code (400, 429, 503, 504) instead of a broken stream.
        A request with `detachable` set opens a generation that outlives this
        call (see the module docstring).
        """
        # This gateway reads `tokens` batches (EngineStream yields their chunks).
        request.accept_token_batches = True
        return await self._first_accepted(self._wire.open(request), request.request_id,
                                          request.detachable)

    async def _first_accepted(self, attempts: Attempts, request_id: str,
                              detachable: bool) -> EngineStream:
        """Start the call at each of the wire's places in turn until one is
        accepted or refused with a status not in `retry_on`; `attach_verdict`
        picks the refusal that decides."""
        error: EngineError | None = None
        for start in attempts.starts:
            try:
                return await self._accepted(start(), request_id, detachable)
            except EngineError as exc:
                if exc.status_code not in attempts.retry_on:
                    raise
                error = attach_verdict(error, exc)
        assert error is not None
        raise error

    async def attach(self, request_id: str, after_index: int | None,
                     traceparent: str = "") -> EngineStream:
        """Continue a detachable generation (its caller, another replica, died)
        from the token after `after_index`, the last one the resume log holds
        (None: from the first). EngineError 404 when the engine holds no such
        generation (unknown, cancelled, or its orphan grace expired), 400 when
        the index is out of its range. `traceparent`: the caller's span (in the
        request on the multiplexed wire, as metadata on an Attach call)."""
        request = pb.AttachRequest(request_id=request_id, accept_token_batches=True)
        if after_index is not None:
            request.after_index = after_index
        return await self._first_accepted(self._wire.attach(request, traceparent), request_id,
                                          detachable=True)

    async def cancel(self, request_id: str) -> bool:
        """The explicit Cancel of a detachable generation, within the cancel
        deadline; True if the engine stopped one, EngineError if it failed."""
        request = pb.CancelRequest(request_id=request_id)
        stubs = self._pinned or [self._stub]
        answers = await asyncio.gather(
            *(stub.Cancel(request, timeout=self._cancel_timeout_s) for stub in stubs),
            return_exceptions=True)
        if any(isinstance(a, pb.CancelResponse) and a.cancelled for a in answers):
            return True
        for answer in answers:  # nobody stopped it: an engine that failed may hold it
            if isinstance(answer, grpc.aio.AioRpcError):
                raise EngineError.from_rpc_error(answer, self._retry_after_s) from answer
            if isinstance(answer, BaseException):
                raise answer
        return False

    def _explicit_cancel(self, request_id: str, call: EngineCall) -> Callable[[], None]:
        def start() -> None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop left (shutdown): the call's cancel must do
                call.cancel()
                return
            task = loop.create_task(self._cancel_then_drop(request_id, call))
            self._cancelling.add(task)
            task.add_done_callback(self._cancelling.discard)
        return start

    async def _cancel_then_drop(self, request_id: str, call: EngineCall) -> None:
        # Cancel first: a call dropped first would orphan the generation until
        # the Cancel lands (running on meanwhile, counted as orphaned).
        try:
            await self.cancel(request_id)
        except EngineError as exc:
            log.warning("explicit cancel of %s failed (%s); the engine stops it when its "
                        "orphan grace ends", request_id, exc.message)
        finally:
            call.cancel()

    async def _accepted(self, call: WireCall, request_id: str,
                        detachable: bool) -> EngineStream:
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
        echoed = str(dict(metadata or ()).get("x-request-id", request_id))
        return EngineStream(call, echoed, self._idle_timeout_s, self._max_duration_s,
                            self._explicit_cancel(echoed, call) if detachable else None)

    async def healthy(self) -> bool:
        """The engine's gRPC health, asked through the same hop the streams use."""
        try:
            response = await self._health.Check(
                health_pb2.HealthCheckRequest(service=""), timeout=self._accept_timeout_s)
        except grpc.aio.AioRpcError:
            return False
        return bool(response.status == health_pb2.HealthCheckResponse.SERVING)

    async def close(self) -> None:
        if self._cancelling:  # let the explicit Cancels in flight reach the engine
            await asyncio.wait(set(self._cancelling), timeout=self._cancel_timeout_s)
        await self._wire.close()
        await self._channel.close()
        for channel in self._pinned_channels:
            await channel.close()
