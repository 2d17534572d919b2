"""The gateway's side of the multiplexed wire (`engine_wire = multiplexed`):
every stream to one engine on one long-lived Session call.

    MuxSession  one engine's Session: opened on first use, and again on the
                first use after it broke; a reader task demultiplexes each
                SessionEvent's items to their calls by call number
    MuxCall     one generation on it, shaped like the grpc.aio call that
                engine_client.py reads (`initial_metadata`, `read`, `cancel`,
                `done`, `code`, `details`), so EngineStream, its deadlines, its
                errors and everything above it are the same on both wires
    EngineMux   the sessions of every engine the client reaches: new calls
                rotate over the serving ones, as the health-checked balancer
                rotates Generate calls (engine_client.py's MultiplexedWire
                holds one)

Cancelling a MuxCall queues an abort message (synchronous, as grpc.aio's
cancel is: it runs in `finally` blocks of cancelled tasks) and wakes its
reader with CancelledError, as grpc.aio does. When the session breaks (the
engine died, the hop was cut, keepalive found it black-holed), every call it
carried fails with the session's own gRPC error, which EngineStream turns into
the same EngineError (and SSE error event) a broken Generate call gives.

Flow control per call, as HTTP/2 gives each Generate call a window: every
call is opened with a window in tokens (`window_tokens`, sized to what the
per-call HTTP/2 window, `engine_read_ahead_bytes`, holds of single-token
messages) and credits tokens back as its consumer reads them, half a window at
a time. A slow client so pauses its own generation at the engine and no other,
and what waits here per call is bounded by the window. The session reader
never waits for a consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator

import grpc

from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.engine.v1 import engine_pb2_grpc as pb_grpc

log = logging.getLogger("streamlab.gateway.engine_mux")

_STATUS = {status.value[0]: status for status in grpc.StatusCode}
# Bytes a single-token GenerateResponse takes on a Generate call (protobuf,
# gRPC's 5-byte prefix, HTTP/2's 9-byte frame header): a per-call window of
# engine_read_ahead_bytes holds about that many tokens.
TOKEN_WIRE_BYTES = 24


def window_tokens(read_ahead_bytes: int) -> int:
    return max(16, read_ahead_bytes // TOKEN_WIRE_BYTES)


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """A call's end as the error a failed grpc.aio call raises."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class MuxCall:
    """Held by every open stream on this wire, so kept small (docs/cost.md,
    memory per stream): slots, no dict; the events waiting in a list read from
    `_head` (an empty deque is a 64-slot block); no asyncio.Event (an object
    and a deque of waiters each) but a future made only while its one reader
    waits (EngineStream reads a call from one task)."""

    __slots__ = ("_accepted", "_cancelled", "_error", "_events", "_finished", "_head", "_link",
                 "_read_tokens", "_waiter", "number", "request_id")

    def __init__(self, link: _Link, number: int, request_id: str) -> None:
        self._link = link
        self.number = number
        self.request_id = request_id
        self._events: list[pb.GenerateResponse] = []
        self._head = 0  # the next event to read; the list is cleared once all are read
        self._waiter: asyncio.Future[None] | None = None
        self._accepted = False
        self._error: grpc.aio.AioRpcError | None = None  # its end without a finish
        self._finished = False  # a finish or error event arrived: the engine is done
        self._cancelled = False
        self._read_tokens = 0  # consumed since the last credit

    # ---- the session's side ----------------------------------------------------------
    def deliver(self, item: pb.SessionItem) -> None:
        kind = item.WhichOneof("kind")
        if kind == "accepted":
            self._accepted = True
            self.request_id = item.accepted.request_id or self.request_id
        elif kind == "event":
            self._events.append(item.event)
            if item.event.WhichOneof("event") in ("finish", "error"):
                self._finished = True
        elif kind == "ended":
            code = _STATUS.get(item.ended.code, grpc.StatusCode.UNKNOWN)
            self._error = rpc_error(code, item.ended.details)
        self._wake()

    def fail(self, error: grpc.aio.AioRpcError) -> None:
        """The session broke under this call."""
        if not self._finished and self._error is None:
            self._error = error
            self._wake()

    @property
    def over(self) -> bool:
        """Nothing more comes for it from the engine."""
        return self._finished or self._error is not None or self._cancelled

    # ---- the call's side (what EngineClient and EngineStream read) -------------------
    async def initial_metadata(self) -> tuple[tuple[str, str], ...]:
        """Once the engine accepted the call (or it ended first: then empty, and
        `code()` says why), as a Generate call's response headers."""
        while not (self._accepted or self.over):
            await self._wait()
        if self._cancelled and not self._accepted:
            raise asyncio.CancelledError
        return (("x-request-id", self.request_id),) if self._accepted else ()

    async def read(self) -> object:
        while True:
            if self._cancelled:
                raise asyncio.CancelledError  # as grpc.aio's read of a cancelled call
            if self._head < len(self._events):
                event = self._events[self._head]
                self._head += 1
                if self._head == len(self._events):
                    self._events.clear()
                    self._head = 0
                kind = event.WhichOneof("event")
                if kind in ("token", "tokens", "tool_call"):
                    self._read_tokens += len(event.tokens.chunks) if kind == "tokens" else 1
                    if self._read_tokens * 2 >= self._link.window:
                        self._link.credit(self, self._read_tokens)
                        self._read_tokens = 0
                return event
            if self._error is not None:
                raise self._error
            if self._finished:
                return grpc.aio.EOF
            await self._wait()

    def cancel(self) -> bool:
        if self.over:
            return False
        self._cancelled = True
        self._link.abort(self)
        self._wake()
        return True

    def done(self) -> bool:
        return self.over and self._head == len(self._events)

    def queued(self) -> int:
        """Events already here that `read` returns without waiting: the items of
        one SessionEvent arrive together (a step's tokens, then the finish)."""
        return len(self._events) - self._head

    async def code(self) -> grpc.StatusCode:
        if self._error is not None:
            return self._error.code()
        return grpc.StatusCode.CANCELLED if self._cancelled else grpc.StatusCode.OK

    async def details(self) -> str:
        return self._error.details() or "" if self._error is not None else ""

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        # Only ever awaited after the state it waits on was read: a wake with
        # no waiter has nothing to tell (one thread, no await in between).
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


class _Link:
    """One Session call and the calls it carries; once broken, never reused."""

    def __init__(self, stub: pb_grpc.EngineServiceStub, window: int) -> None:
        self.window = window
        self._outbox: asyncio.Queue[pb.SessionRequest | None] = asyncio.Queue()
        self.calls: dict[int, MuxCall] = {}
        self._numbers = itertools.count(1)
        self.broken = False
        self.serving = True
        self._call = stub.Session(self._requests(), wait_for_ready=False)
        self.reader = asyncio.get_running_loop().create_task(self._read())

    def start(self, request_id: str, message: pb.SessionRequest) -> MuxCall:
        call = MuxCall(self, next(self._numbers), request_id)
        message.call = call.number
        message.window_tokens = self.window
        self.calls[call.number] = call
        self._outbox.put_nowait(message)
        return call

    def credit(self, call: MuxCall, tokens: int) -> None:
        if call.number in self.calls and not self.broken:
            self._outbox.put_nowait(pb.SessionRequest(
                call=call.number, credit=pb.SessionCredit(tokens=tokens)))

    def abort(self, call: MuxCall) -> None:
        if self.calls.pop(call.number, None) is not None and not self.broken:
            self._outbox.put_nowait(pb.SessionRequest(call=call.number,
                                                      abort=pb.SessionAbort()))

    async def _requests(self) -> AsyncIterator[pb.SessionRequest]:
        # Ends on None: grpc leaves a request iterator of a call that ended
        # waiting here, and a generator that waits cannot be closed at shutdown.
        while (message := await self._outbox.get()) is not None:
            yield message

    async def _read(self) -> None:
        error = rpc_error(grpc.StatusCode.UNAVAILABLE, "engine session ended")
        try:
            while True:
                event = await self._call.read()
                if not isinstance(event, pb.SessionEvent):  # EOF: the engine ended it
                    break
                if event.HasField("serving"):
                    self.serving = event.serving
                for item in event.items:
                    call = self.calls.get(item.call)
                    if call is None:
                        continue  # aborted here: the engine's last words for it
                    call.deliver(item)
                    if call.over:
                        del self.calls[item.call]
        except grpc.aio.AioRpcError as exc:
            error = exc
        except asyncio.CancelledError:
            error = rpc_error(grpc.StatusCode.CANCELLED, "the gateway closed the session")
            raise
        finally:
            self.broken = True
            self._outbox.put_nowait(None)
            calls, self.calls = list(self.calls.values()), {}
            if calls:
                log.warning("engine session broke (%s) under %d calls", error.code().name,
                            len(calls))
            for call in calls:
                call.fail(error)

    async def close(self) -> None:
        self._call.cancel()
        self.reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.reader


class MuxSession:
    """One engine's Session, reopened on the first use after it broke."""

    def __init__(self, stub: pb_grpc.EngineServiceStub, window: int) -> None:
        self._stub = stub
        self._window = window
        self._link: _Link | None = None

    @property
    def serving(self) -> bool:
        """The engine's health as its session last said (an unopened or broken
        session: unknown, so worth a try)."""
        return self._link is None or self._link.broken or self._link.serving

    def _current(self) -> _Link:
        if self._link is None or self._link.broken:
            self._link = _Link(self._stub, self._window)
        return self._link

    def open(self, request: pb.GenerateRequest) -> MuxCall:
        return self._current().start(request.request_id, pb.SessionRequest(open=request))

    def attach(self, request: pb.AttachRequest) -> MuxCall:
        return self._current().start(request.request_id, pb.SessionRequest(attach=request))

    async def close(self) -> None:
        if self._link is not None:
            await self._link.close()


class EngineMux:
    """A session per engine; new generations rotate over the serving ones."""

    def __init__(self, stubs: list[pb_grpc.EngineServiceStub], health_checks: bool,
                 window: int) -> None:
        self.sessions = [MuxSession(stub, window) for stub in stubs]
        self._health_checks = health_checks and len(stubs) > 1
        self._turn = itertools.count()

    def rotation(self) -> list[MuxSession]:
        """The sessions in the order to try the next new generation on: the
        next in turn first; draining engines left out (unless all drain: a
        draining engine still serves)."""
        n = len(self.sessions)
        start = next(self._turn) % n
        order = self.sessions[start:] + self.sessions[:start]
        if self._health_checks:
            serving = [session for session in order if session.serving]
            return serving or order
        return order

    async def close(self) -> None:
        for session in self.sessions:
            await session.close()
