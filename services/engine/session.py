"""The multiplexed wire: every generation of one caller on one Session call.

vLLM's front end and its engine core do not hold a call per request: they
exchange one message per engine step for every running request, and an abort
is a message too. `EngineSession` serves that shape from the same generation
code as Generate and Attach (the servicer's `generation` and `attachment`), so
validation, admission, records and counters are the very same:

    reader      one task: reads the caller's messages; `open` and `attach`
                start a generation task each, `abort` cancels one, `credit`
                widens one's window (flow control, below)
    generation  one task per request id: iterates what a Generate (or Attach)
                call would stream and puts each event in the outbox, tagged
                with its request id; a Refused status becomes its `ended` item
    writer      the Session handler itself: waits for the outbox, lets every
                generation of the same decode step add its tokens (one pass of
                the event loop: the batched clock wakes them all in one), then
                sends the whole outbox as one SessionEvent. An `accepted` alone
                does not wake it at once: it waits up to ACCEPT_HOLD_S for the
                call's first tokens (a stream without prefill has them a step
                later), so both leave in one message

Cancellation is a dropped call, wherever it comes from:

    abort       the generation's task is cancelled: a plain generation stops at
                its next decode step (CancelledError in the backend's await, as
                when grpc cancels a Generate handler, and its cancel is marked
                where that one's is); a detachable one is only left by this consumer (orphaned,
                its grace runs: detached.py), as when a Generate call drops
    session end the caller closed it, or the stream broke (gateway killed, hop
                cut, keepalive failed): grpc cancels this handler, whose
                `finally` cancels every generation task it started, each one
                exactly as an abort

Flow control, per call: HTTP/2 gives each Generate call a window of its own,
and one Session call has one window for all. So each call opened on a session
carries a window in tokens (`window_tokens`); the engine sends that many
beyond what the caller credited back (`credit`, as its client consumes them)
and then parks the generation at its `yield`, where a Generate handler parks
when its call's window is full: a slow client pauses its own generation and
no other. The session's own window only matters when the gateway stops
reading the whole session: every generation stalls once the outbox holds
OUTBOX_LIMIT items. docs/cancellation-and-backpressure.md compares the wires.

Health: a draining engine (SIGUSR1) tells its sessions `serving` false, so a
gateway with several engines opens no new call on it, as its health-checked
balancer skips it for Generate calls; a stopping one refuses new calls on
its sessions with UNAVAILABLE, as the stopping server refuses new RPCs, and
serves the running ones through its grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Protocol

import grpc
from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from services.engine.errors import EngineException
from services.engine.stats import EngineStats, GenerationRecord
from streamlab_protocol.engine.v1 import engine_pb2 as pb

log = logging.getLogger("streamlab.engine.session")

# Items the outbox holds before the generations wait for the writer: the
# session's window (a gateway that stops reading stalls them all here).
OUTBOX_LIMIT = 4096
# How long an accept alone may wait for company before it leaves. A stream
# with no prefill has its first tokens a decode step later: held this long,
# the accept leaves with them, one message instead of two for both sides
# (docs/cost.md, the gRPC floor). A long prefill's accept still leaves at once,
# give or take this: the gateway commits to its 200 without the first token.
ACCEPT_HOLD_S = 0.001


class Refused(EngineException):
    """A call ends with this gRPC status: Generate and Attach abort with it; a
    Session sends it as the generation's `ended` item."""

    def __init__(self, status: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.status = status
        self.details = details


# Told the request id when the engine accepts a generation (Generate: its
# response headers; Session: an `accepted` item).
Accept = Callable[[str], Awaitable[None]]


class Runs(Protocol):
    """What a session needs of the servicer: the work of one call of each kind."""

    def generation(self, request: pb.GenerateRequest, accept: Accept,
                   started: Callable[[GenerationRecord], None]
                   ) -> AsyncGenerator[pb.GenerateResponse, None]: ...

    def attachment(self, request: pb.AttachRequest, accept: Accept
                   ) -> AsyncGenerator[pb.GenerateResponse, None]: ...


class Window:
    """One call's flow control: tokens it may still send before the caller
    credits more back (None: no window)."""

    def __init__(self, tokens: int) -> None:
        self.left: int | None = tokens or None
        self._credited = asyncio.Event()

    async def spend(self, event: pb.GenerateResponse) -> None:
        """Take the event's tokens from the window, first waiting for room if it
        has none (an event without tokens, the finish, never waits)."""
        if self.left is None:
            return
        kind = event.WhichOneof("event")
        tokens = len(event.tokens.chunks) if kind == "tokens" else (
            1 if kind in ("token", "tool_call") else 0)
        while tokens and self.left <= 0:
            self._credited.clear()
            await self._credited.wait()
        self.left -= tokens

    def credit(self, tokens: int) -> None:
        if self.left is not None:
            self.left += tokens
            self._credited.set()


class Health:
    """The engine's health as its sessions tell it: `serving` (SIGUSR1 turns it
    off: a balanced gateway sends no new call), `stopping` (shutdown: new calls
    refused, as a stopping gRPC server refuses new RPCs)."""

    def __init__(self) -> None:
        self.serving = True
        self.stopping = False
        self.sessions: set[EngineSession] = set()

    def set(self, serving: bool, stopping: bool = False) -> None:
        self.serving = serving
        self.stopping = self.stopping or stopping
        for session in self.sessions:
            session.health_changed()


class EngineSession:
    def __init__(self, runs: Runs, stats: EngineStats, health: Health) -> None:
        self._runs = runs
        self._stats = stats
        self._health = health
        self._tasks: dict[int, asyncio.Task[None]] = {}  # by call number
        self._windows: dict[int, Window] = {}
        # The next SessionEvent, its items added in place as they come: an item
        # built apart and then added would be copied into it (protobuf copies a
        # message it is given), once more per item.
        self._outbox = pb.SessionEvent()
        self._ready = asyncio.Event()  # the outbox has items, or the reader ended
        self._ready.set()  # the first event tells the engine's health
        self._room = asyncio.Event()  # the outbox is under its limit
        self._room.set()
        self._reading = True
        self._hold: asyncio.TimerHandle | None = None  # an accept waits for company
        self._told_serving: bool | None = None
        self._loop: asyncio.AbstractEventLoop  # the Session call's, set by `run`

    def health_changed(self) -> None:
        self._ready.set()

    async def run(self, requests: AsyncIterator[pb.SessionRequest]
                  ) -> AsyncGenerator[pb.SessionEvent, None]:
        self._loop = loop = asyncio.get_running_loop()
        reader = loop.create_task(self._read(requests))
        self._health.sessions.add(self)
        try:
            while True:
                await self._ready.wait()
                # One pass of the loop: the other generations woken by the same
                # decode step put their tokens in before this event leaves.
                await asyncio.sleep(0)
                self._ready.clear()
                if self._hold is not None:  # what the accept waited for is here
                    self._hold.cancel()
                    self._hold = None
                event, self._outbox = self._outbox, pb.SessionEvent()
                self._room.set()
                if self._told_serving is not self._health.serving:
                    self._told_serving = event.serving = self._health.serving
                if event.items or event.HasField("serving"):
                    yield event
                elif not self._reading and not self._tasks:
                    return  # the caller half-closed and every generation ended
        finally:
            if self._hold is not None:
                self._hold.cancel()
            self._health.sessions.discard(self)
            # The caller left (or broke the stream): every generation it opened
            # is a dropped call.
            reader.cancel()
            tasks = [reader, *self._tasks.values()]
            for call in list(self._tasks):
                self._abort(call)
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _read(self, requests: AsyncIterator[pb.SessionRequest]) -> None:
        try:
            async for request in requests:
                kind, call = request.WhichOneof("kind"), request.call
                if kind == "abort":
                    self._abort(call)
                elif kind == "credit":
                    if (window := self._windows.get(call)) is not None:
                        window.credit(request.credit.tokens)
                elif self._health.stopping:
                    # A stopping gRPC server refuses new calls with UNAVAILABLE;
                    # the session's new calls are refused the same.
                    self._end(call, grpc.StatusCode.UNAVAILABLE, "the engine is shutting down")
                elif call in self._tasks:
                    self._end(call, grpc.StatusCode.ALREADY_EXISTS,
                              f"call {call} is already in flight on this session")
                elif kind == "open":
                    self._start(call, request.window_tokens, self._runs.generation(
                        request.open, self._accept(call), self._started(call)))
                elif kind == "attach":
                    self._start(call, request.window_tokens,
                                self._runs.attachment(request.attach, self._accept(call)))
        finally:
            self._reading = False
            self._ready.set()

    def _start(self, call: int, window: int,
               events: AsyncGenerator[pb.GenerateResponse, None]) -> None:
        """Run `events` (not started yet: dropping it unstarted runs nothing)."""
        self._windows[call] = Window(window)
        self._tasks[call] = self._loop.create_task(self._generate(call, events))

    async def _generate(self, call: int,
                        events: AsyncGenerator[pb.GenerateResponse, None]) -> None:
        window = self._windows[call]
        try:
            async with aclosing(events) as stream:
                async for event in stream:
                    # Parked here, the generation pauses at its `yield`, as a
                    # Generate handler does when its call's window is full.
                    await window.spend(event)
                    self._put().add(call=call, event=event)
                    if not self._room.is_set():
                        await self._room.wait()  # the gateway stopped reading the session
        except Refused as exc:
            self._end(call, exc.status, exc.details)
        except Exception as exc:  # a bug: this generation's call fails, not the session
            log.exception("session call %d failed", call)
            self._end(call, grpc.StatusCode.INTERNAL, f"engine: {exc!r}")
        finally:
            self._tasks.pop(call, None)
            self._windows.pop(call, None)
            self._ready.set()

    def _abort(self, call: int) -> None:
        """The call is dropped (no reply: a cancelled call has none)."""
        task = self._tasks.get(call)
        if task is not None:  # else it ended already (its end item is on its way)
            task.cancel()

    def _end(self, call: int, status: grpc.StatusCode, details: str) -> None:
        self._put().add(call=call, ended=pb.SessionStatus(code=status.value[0],
                                                          details=details))

    def _accept(self, call: int) -> Accept:
        async def accept(request_id: str) -> None:
            # Into the outbox without waking the writer: the next item does,
            # or the hold's timer (ACCEPT_HOLD_S).
            self._put(wake=False).add(call=call,
                                      accepted=pb.SessionAccepted(request_id=request_id))
            if self._hold is None and not self._ready.is_set():
                self._hold = self._loop.call_later(ACCEPT_HOLD_S, self._release_hold)
        return accept

    def _release_hold(self) -> None:
        self._hold = None
        self._ready.set()

    def _started(self, call: int) -> Callable[[GenerationRecord], None]:
        def started(record: GenerationRecord) -> None:
            # As the Generate handler's done-callback: a cancelled task marks
            # the cancel even if the backend notices later (a decode thread).
            task = self._tasks.get(call)
            if task is not None:
                task.add_done_callback(
                    lambda done: self._stats.mark_cancel(record) if done.cancelled() else None)
        return started

    def _put(self, wake: bool = True) -> RepeatedCompositeFieldContainer[pb.SessionItem]:
        """Where the next item goes (the outbox's items): the writer is woken
        (unless not `wake`), and the generations wait for it once the outbox
        is full."""
        items = self._outbox.items
        if len(items) + 1 >= OUTBOX_LIMIT:
            self._room.clear()
            wake = True
        if wake:
            self._ready.set()
        return items
