"""The one way the gateway answers with an SSE stream (the OpenAI route and
the resume surface's followers): heartbeats counted, proxies told not to
buffer, a reader that accepts nothing cut after the send timeout, and a close
hook that runs however the response ends, and a disconnect hook that notes
when the client left (the cancel latency's start).

sse-starlette's EventSourceResponse runs an anyio task group per stream with
a task each for the body, the heartbeat, a server-shutdown listener and a
disconnect listener: in a profile of 1,000 short streams that machinery was
the largest share of the gateway's set-up CPU (docs/cost.md). Here the body
runs in the request's own task; a disconnect listener (one task) cancels it
when the client leaves, so the body's `await` gets CancelledError as before:
no per-token `is_disconnected()` polling, and a silent prefill notices the
disconnect just as fast. The heartbeat is a task only when heartbeats are on;
server shutdown is one watcher per event loop that ends every live stream, as
sse-starlette's does. Headers, event encoding, the heartbeat and the send
timeout are sse-starlette's own (the class still is an EventSourceResponse).
(Why sse-starlette: docs/design-decisions.md.)
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.event import ensure_bytes
from sse_starlette.sse import AppStatus, SendTimeoutError
from starlette.types import Message, Receive, Scope, Send

from services.gateway.heartbeat import heartbeats, per_loop, ping_sender
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


log = logging.getLogger("streamlab.gateway")

# The line separator of every event this module sends.
SEP = "\n"
# How long a body cancelled for a disconnect may go on before it is cancelled
# again (GuardedEventSourceResponse._run).
RECANCEL_S = 0.5


class LastChunk(bytes):
    """A stream's last events, encoded: the response sends them with the end of
    the body in one write (one chunk, one syscall, one read for every hop in
    front) instead of an event at a time and then the empty end. Nothing the
    body yields after it is sent."""


def last_events(*events: ServerSentEvent, before: list[bytes] | None = None) -> LastChunk:
    """`events` encoded, after `before` (events encoded already)."""
    return LastChunk(b"".join([*(before or ()), *(ensure_bytes(event, SEP) for event in events)]))


def _server_exiting() -> bool:
    """Whether the server is shutting down, as sse-starlette's own watcher asks:
    its flag (set by its patch of uvicorn's handle_exit), or uvicorn's, found
    through the SIGTERM handler (a bound method of the running Server)."""
    if AppStatus.should_exit:
        return True
    handler = signal.getsignal(signal.SIGTERM)
    server = getattr(handler, "__self__", None)
    return bool(AppStatus.enable_automatic_graceful_drain
                and getattr(server, "should_exit", False))


class _ShutdownWatch:
    """One watcher per event loop (not a listener per stream): when the server
    exits it ends every live stream, as sse-starlette's shutdown listener did."""

    POLL_S = 0.5  # sse-starlette's own poll interval

    def __init__(self) -> None:
        self.live: dict[asyncio.Task[Any], Callable[[], None]] = {}
        self._watcher: asyncio.Task[None] | None = None

    def add(self, task: asyncio.Task[Any], end: Callable[[], None]) -> None:
        self.live[task] = end
        if self._watcher is None or self._watcher.done():
            self._watcher = task.get_loop().create_task(self._watch())

    def discard(self, task: asyncio.Task[Any]) -> None:
        self.live.pop(task, None)

    async def _watch(self) -> None:
        # A poll: the flags it reads are set by code that signals no event.
        while not _server_exiting():  # noqa: ASYNC110
            await asyncio.sleep(self.POLL_S)
        for end in list(self.live.values()):
            end()


# Keyed by loop: tests run apps on several loops in one process.
_shutdown_watches: dict[asyncio.AbstractEventLoop, _ShutdownWatch] = {}


def _shutdown_watch(loop: asyncio.AbstractEventLoop) -> _ShutdownWatch:
    return per_loop(_shutdown_watches, loop, _ShutdownWatch)


class GuardedEventSourceResponse(EventSourceResponse):
    """Runs `on_close` however the response ends. The body generator's own
    `finally` does not run if the client left before the body started (a
    never-started async generator has nothing to unwind), which would leak the
    engine call and the stream slot. Its send timeout is a `SendWatchdog`.

    The body runs in the caller's task (the module's docstring says why); what
    ends it early (the client left, the server exits, a heartbeat's send
    failed) cancels that task and is then taken back: the response returns as
    sse-starlette's task group did, or raises the heartbeat's error."""

    def __init__(self, on_close: Callable[[], None], on_disconnect: Callable[[], None],
                 *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # asyncio's lock makes its waiters' deque only when contended; anyio's
        # holds one (~0.7 KiB) for every open stream (docs/cost.md).
        self._send_lock = asyncio.Lock()  # type: ignore[assignment]
        self._on_close = on_close
        self._on_disconnect = on_disconnect
        self._unwinding = False
        self._sends = 0
        timeout = self.send_timeout
        self._watchdog = SendWatchdog(timeout) if timeout is not None else None

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        self._sends += 1  # the re-cancel's evidence that the body still streams
        if self._watchdog is None:
            await send(message)
        else:
            await self._watchdog.send(send, message)

    async def _stream_response(self, send: Send) -> None:
        """sse-starlette's, but a `LastChunk` ends the body in the same send."""
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        finished = False
        async for data in self.body_iterator:
            if finished:
                continue  # the body has ended: nothing may follow its last chunk
            try:
                if isinstance(data, LastChunk):
                    # Under the lock, with `active` off: no heartbeat after the end.
                    async with self._send_lock:
                        self.active = False
                        await self._send_with_timeout(send, {
                            "type": "http.response.body", "body": bytes(data),
                            "more_body": False})
                    finished = True
                    continue
                await self._send_with_timeout(send, {
                    "type": "http.response.body", "body": ensure_bytes(data, self.sep),
                    "more_body": True})
            except BaseException:
                self._unwinding = True  # no second cancel into its cleanup
                # As sse-starlette: the generator is parked at its yield; close it
                # so its cleanup runs before the error escapes.
                aclose = getattr(self.body_iterator, "aclose", None)
                if aclose is not None:
                    try:
                        await aclose()
                    except Exception:
                        log.exception("closing the body after a failed send")
                raise
        if not finished:
            async with self._send_lock:
                self.active = False
                await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            if scope["type"] != "http" or scope["method"].upper() == "HEAD":
                # Rare shapes (a WebSocket denial, HEAD): sse-starlette's own path.
                await super().__call__(scope, receive, send)
            else:
                await self._run(receive, send)
        finally:
            if self._watchdog is not None:
                self._watchdog.close()
            self._on_close()

    async def _run(self, receive: Receive, send: Send) -> None:
        body = asyncio.current_task()
        assert body is not None
        loop = body.get_loop()
        # Why the body was cancelled by us (None: it was not), and a heartbeat's error.
        ended: list[str] = []
        failed: list[BaseException] = []

        # How many times we cancelled the body: taken back one by one below.
        cancels = [0]

        def end(reason: str) -> None:
            if not ended:
                ended.append(reason)
                self.active = False
                cancels[0] += 1
                body.cancel()

        async def listen() -> None:
            # Only this listener receives (the body was read before the response).
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    self._on_disconnect()
                    end("disconnect")
                    break
            # A task's cancel is one-shot (sse-starlette's anyio scope cancelled
            # at every await until it exited): a library under the body that
            # swallows one (redis-py on Python 3.11: docs/resume.md) would leave
            # the body streaming to nobody, its reader never released. Cancel
            # again while it still sends (uvicorn drops what it sends after a
            # disconnect); a body that sends nothing is unwinding, and its
            # cleanup (a reader's removal from the store) must not be cut.
            seen = self._sends
            while not self._unwinding:
                await asyncio.sleep(RECANCEL_S)
                if not self._unwinding and self._sends > seen:
                    log.warning("a body went on %.1f s after its client left: cancelling it again",
                                RECANCEL_S)
                    cancels[0] += 1
                    body.cancel()
                seen = self._sends

        def heartbeat_failed(error: BaseException) -> None:
            failed.append(error)
            end("heartbeat")

        listener = loop.create_task(listen())
        # One timer for every stream's heartbeat, not a task each (heartbeat.py).
        beat = None
        if self.ping_interval > 0:
            beat = heartbeats(loop).add(self.ping_interval, ping_sender(self, send),
                                        heartbeat_failed)
        watch = _shutdown_watch(loop)
        watch.add(body, lambda: end("shutdown"))
        try:
            await self._stream_response(send)
        except asyncio.CancelledError:
            # Ours only if nobody else cancelled the task too.
            if not ended:
                raise
            left = 0
            for _ in range(cancels[0]):
                left = body.uncancel()
            if left > 0:
                raise
            if failed:
                raise failed[0] from None
        finally:
            self.active = False
            watch.discard(body)
            listener.cancel()
            if beat is not None:
                beat.cancel()


def event_stream(events: AsyncIterator[ServerSentEvent | bytes], *,
                 settings: GatewaySettings, metrics: GatewayMetrics, heartbeat_s: float,
                 headers: dict[str, str], on_close: Callable[[], None] = lambda: None,
                 on_disconnect: Callable[[], None] = lambda: None,
                 on_ping: Callable[[], None] | None = None) -> EventSourceResponse:
    """`on_ping`: told of each heartbeat (the stream's span, tracing on)."""
    def ping() -> ServerSentEvent:
        metrics.heartbeats.inc()
        if on_ping is not None:
            on_ping()
        return ServerSentEvent(comment="ping")

    return GuardedEventSourceResponse(
        on_close, on_disconnect,
        events,
        headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        ping=heartbeat_s,
        ping_message_factory=ping,
        sep=SEP,
        # A reader that accepts no bytes for this long is cut (and what it holds
        # released) instead of pinning an engine slot forever.
        send_timeout=settings.send_timeout_s,
    )
