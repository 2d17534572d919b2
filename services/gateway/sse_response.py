"""The one way the gateway answers with an SSE stream (the OpenAI route and
the resume surface's followers): heartbeats counted, proxies told not to
buffer, a reader that accepts nothing cut after the send timeout, and a close
hook that runs however the response ends.

sse-starlette's EventSourceResponse runs three tasks per stream: the body
(the route's event generator), a heartbeat that sends `: ping`, and a
listener for the client's `http.disconnect`. When the client leaves, the
listener cancels the task group and the body's `await` gets CancelledError:
no per-token `is_disconnected()` polling, and a silent prefill notices the
disconnect just as fast. (Why sse-starlette: docs/design-decisions.md.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.types import Receive, Scope, Send

from services.gateway.metrics import GatewayMetrics
from services.gateway.settings import GatewaySettings


class GuardedEventSourceResponse(EventSourceResponse):
    """Runs `on_close` however the response ends. The body generator's own
    `finally` does not run if the client left before the body started (a
    never-started async generator has nothing to unwind), which would leak the
    engine call and the stream slot."""

    def __init__(self, on_close: Callable[[], None], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def event_stream(events: AsyncIterator[ServerSentEvent | bytes], *,
                 settings: GatewaySettings, metrics: GatewayMetrics, heartbeat_s: float,
                 headers: dict[str, str], on_close: Callable[[], None] = lambda: None
                 ) -> EventSourceResponse:
    def ping() -> ServerSentEvent:
        metrics.heartbeats.inc()
        return ServerSentEvent(comment="ping")

    return GuardedEventSourceResponse(
        on_close,
        events,
        headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        ping=heartbeat_s,
        ping_message_factory=ping,
        sep="\n",
        # A reader that accepts no bytes for this long is cut (and what it holds
        # released) instead of pinning an engine slot forever.
        send_timeout=settings.send_timeout_s,
    )
