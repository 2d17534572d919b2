"""The one way the gateway answers with an SSE stream (the OpenAI route and
the resume surface's followers): heartbeats counted, proxies told not to
buffer, a reader that accepts nothing cut after the send timeout, and a close
hook that runs however the response ends, and a disconnect hook that notes
when the client left (the cancel latency's start).

sse-starlette's EventSourceResponse runs three tasks per stream: the body
(the route's event generator), a heartbeat that sends `: ping`, and a
listener for the client's `http.disconnect`. When the client leaves, the
listener cancels the task group and the body's `await` gets CancelledError:
no per-token `is_disconnected()` polling, and a silent prefill notices the
disconnect just as fast. (Why sse-starlette: docs/design-decisions.md.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.sse import SendTimeoutError
from starlette.types import Message, Receive, Scope, Send

from services.gateway.metrics import GatewayMetrics
from services.gateway.settings import GatewaySettings


class SendWatchdog:
    """The send timeout as one timer per response, re-armed only when it fires.

    sse-starlette bounds every send with its own anyio cancel scope, which in a
    profile of 60 paced streams was ~10% of the gateway's CPU per token. Here a
    send only notes when it started (per task: the body and the heartbeat may
    send at once); the timer cancels a send that has waited `timeout_s`, which
    then raises sse-starlette's own SendTimeoutError, as before."""

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._sending: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.TimerHandle | None = None

    async def send(self, send: Send, message: Message) -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        self._sending[task] = loop.time()
        if self._timer is None:
            self._timer = loop.call_later(self._timeout_s, self._check, loop)
        try:
            await send(message)
        except asyncio.CancelledError:
            # Ours only if this task was cancelled by nobody else as well.
            if task in self._expired and task.uncancel() == 0:
                raise SendTimeoutError() from None
            raise
        finally:
            self._expired.discard(task)
            del self._sending[task]

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        next_at = now + self._timeout_s
        for task, since in self._sending.items():
            if now - since >= self._timeout_s:
                if task not in self._expired:
                    self._expired.add(task)
                    task.cancel()
            else:
                next_at = min(next_at, since + self._timeout_s)
        self._timer = loop.call_at(next_at, self._check, loop)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class GuardedEventSourceResponse(EventSourceResponse):
    """Runs `on_close` however the response ends. The body generator's own
    `finally` does not run if the client left before the body started (a
    never-started async generator has nothing to unwind), which would leak the
    engine call and the stream slot. Its send timeout is a `SendWatchdog`."""

    def __init__(self, on_close: Callable[[], None], on_disconnect: Callable[[], None],
                 *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_close = on_close
        self._on_disconnect = on_disconnect
        timeout = self.send_timeout
        self._watchdog = SendWatchdog(timeout) if timeout is not None else None

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        if self._watchdog is None:
            await send(message)
        else:
            await self._watchdog.send(send, message)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def noting_disconnect() -> Message:
            # Only sse-starlette's disconnect listener receives: once a stream.
            message = await receive()
            if message["type"] == "http.disconnect":
                self._on_disconnect()
            return message

        try:
            await super().__call__(scope, noting_disconnect, send)
        finally:
            if self._watchdog is not None:
                self._watchdog.close()
            self._on_close()


def event_stream(events: AsyncIterator[ServerSentEvent | bytes], *,
                 settings: GatewaySettings, metrics: GatewayMetrics, heartbeat_s: float,
                 headers: dict[str, str], on_close: Callable[[], None] = lambda: None,
                 on_disconnect: Callable[[], None] = lambda: None) -> EventSourceResponse:
    def ping() -> ServerSentEvent:
        metrics.heartbeats.inc()
        return ServerSentEvent(comment="ping")

    return GuardedEventSourceResponse(
        on_close, on_disconnect,
        events,
        headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        ping=heartbeat_s,
        ping_message_factory=ping,
        sep="\n",
        # A reader that accepts no bytes for this long is cut (and what it holds
        # released) instead of pinning an engine slot forever.
        send_timeout=settings.send_timeout_s,
    )
