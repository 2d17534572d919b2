"""The SSE heartbeat (`: ping` comments) of every stream on one timer per event loop.

sse-starlette runs a task per stream that sleeps the interval and sends a
ping, for as long as the stream lasts: a Task, its coroutine's frame and an
anyio sleep, held by every open stream though it wakes once in 15 s (a large
share of a slow stream's memory in the gateway: docs/cost.md, "memory per
stream"). Here every stream's next ping waits in one heap (`Heartbeats`, one
per loop) under one timer for the earliest; a stream holds only its `Beat`.
A task exists only while a ping is being sent (a send may wait on a slow
reader, and must not hold up the other streams' pings), and what it sends
and how (the response's send lock, its send timeout, nothing once the
response is no longer active) is sse-starlette's own `_ping`'s.

As with sse-starlette's loop, the next ping is due an interval after the
one before it was sent; one still being sent when the next is due (a reader
that accepts nothing) is not doubled: that ping is skipped. A ping whose send
failed (the send timeout) is reported to `on_error`, once.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, TypeVar

from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.event import ensure_bytes
from starlette.types import Send

# A timer may fire this early against the loop's clock (uvloop keeps whole
# milliseconds): a beat due within it counts as due, not re-armed for nothing.
_EARLY_S = 0.002
# Cancelled beats are left in the heap until their turn, unless they outnumber
# the live ones (streams that end between pings): then the heap is rebuilt.
_COMPACT_AT = 1024


class Beat:
    """One stream's heartbeat: its interval, when the next ping is due, the ping
    being sent now (if any)."""

    __slots__ = ("_on_error", "_ping", "_sending", "_wheel", "interval", "live")

    def __init__(self, wheel: Heartbeats, interval: float,
                 ping: Callable[[], Coroutine[Any, Any, None]],
                 on_error: Callable[[BaseException], None]) -> None:
        self._wheel = wheel
        self.interval = interval
        # Both dropped on cancel: the heap keeps a cancelled beat until its turn
        # (up to an interval), and these hold the response and all it holds.
        self._ping: Callable[[], Coroutine[Any, Any, None]] | None = ping
        self._on_error: Callable[[BaseException], None] | None = on_error
        self._sending: asyncio.Task[None] | None = None
        self.live = True

    def fire(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._sending is not None or self._ping is None:
            return  # the last ping is still waiting on the reader: not a second
        task = loop.create_task(self._ping())
        task.add_done_callback(self._sent)
        self._sending = task

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._sending = None
        on_error = self._on_error
        if not task.cancelled() and (error := task.exception()) is not None and on_error:
            # Its pings end with the first that failed, as sse-starlette's loop
            # did: reported once, none after.
            self.cancel()
            on_error(error)

    def cancel(self) -> None:
        """No more pings; one being sent is cancelled (as the ping task was)."""
        if self.live:
            self.live = False
            self._ping = self._on_error = None
            self._wheel.cancelled()
        if self._sending is not None:
            self._sending.remove_done_callback(self._sent)
            self._sending.cancel()
            self._sending = None


class Heartbeats:
    """Every stream's next ping, on one loop, in one heap under one timer."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[tuple[float, int, Beat]] = []
        self._order = itertools.count()  # ties broken by arrival, never by Beat
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._dead = 0

    def __len__(self) -> int:
        """Streams with a heartbeat now."""
        return len(self._heap) - self._dead

    def add(self, interval: float, ping: Callable[[], Coroutine[Any, Any, None]],
            on_error: Callable[[BaseException], None]) -> Beat:
        """Send `ping()` every `interval` seconds from now until the beat is cancelled."""
        if interval <= 0:
            raise ValueError("a heartbeat needs an interval above 0")
        beat = Beat(self, interval, ping, on_error)
        self._push(beat, self._loop.time() + interval)
        self._arm()
        return beat

    def cancelled(self) -> None:
        self._dead += 1
        if self._dead >= _COMPACT_AT and self._dead * 2 > len(self._heap):
            self._heap = [entry for entry in self._heap if entry[2].live]
            heapq.heapify(self._heap)
            self._dead = 0

    def _push(self, beat: Beat, due: float) -> None:
        heapq.heappush(self._heap, (due, next(self._order), beat))

    def _arm(self) -> None:
        if not self._heap:
            return
        due = self._heap[0][0]
        if self._timer is not None:
            if self._timer_at <= due:
                return
            self._timer.cancel()
        self._timer = self._loop.call_at(due, self._fire)
        self._timer_at = due

    def _fire(self) -> None:
        self._timer = None
        now = self._loop.time()
        heap = self._heap
        while heap and heap[0][0] <= now + _EARLY_S:
            beat = heapq.heappop(heap)[2]
            if not beat.live:
                self._dead -= 1
                continue
            # Rescheduled first: a ping that fails cancels the beat, and the
            # heap must never lose a live one.
            self._push(beat, now + beat.interval)
            beat.fire(self._loop)
        self._arm()


T = TypeVar("T")

# Keyed by loop: tests run apps on several loops in one process.
_wheels: dict[asyncio.AbstractEventLoop, Heartbeats] = {}


def per_loop(table: dict[asyncio.AbstractEventLoop, T], loop: asyncio.AbstractEventLoop,
                make: Callable[[], T]) -> T:
    """`loop`'s entry of `table`, made on first use; closed loops' entries go."""
    entry = table.get(loop)
    if entry is None:
        for old in [other for other in table if other.is_closed()]:
            del table[old]
        entry = table[loop] = make()
    return entry


def heartbeats(loop: asyncio.AbstractEventLoop) -> Heartbeats:
    return per_loop(_wheels, loop, lambda: Heartbeats(loop))


def ping_sender(response: EventSourceResponse, send: Send
                ) -> Callable[[], Coroutine[Any, Any, None]]:
    """One ping of `response`, as sse-starlette's `_ping` sends each: its message
    factory's event, under the response's send lock, with its send timeout, and
    nothing once the response is no longer active."""
    async def ping() -> None:
        factory = response.ping_message_factory
        event = (factory() if factory is not None else
                 ServerSentEvent(comment=f"ping - {datetime.now(UTC)}", sep=response.sep))
        data = ensure_bytes(event, response.sep)
        async with response._send_lock:
            if response.active:
                await response._send_with_timeout(
                    send, {"type": "http.response.body", "body": data, "more_body": True})

    return ping
