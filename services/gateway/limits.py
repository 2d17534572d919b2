"""Load shedding at the gateway: caps on open streams and on request size.

Each open stream is a held connection and a pinned engine slot, so the
gateway admits a stream only while it is under both the overall cap and the
caller's own cap; past either it answers `429` with `Retry-After` before the
first byte and before anything starts at the engine. The caller's key is its
identity (services/gateway/identity.py); every kind of work takes a slot
through its lease: an SSE or non-streaming request, a WebSocket, a resumable
stream and a polling job, each until its generation ends.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.gateway.errors import GatewayError, error_json


class TooManyStreams(GatewayError):
    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(429, "too_many_streams", message,
                         headers={"Retry-After": str(retry_after_s)})


class StreamSlot:
    def __init__(self, limiter: StreamLimiter, key: str) -> None:
        self._limiter = limiter
        self._key = key
        self._held = True

    def release(self) -> None:
        """Idempotent: every exit path of a stream may call it."""
        if self._held:
            self._held = False
            self._limiter._release(self._key)


class StreamLimiter:
    def __init__(self, total: int, per_client: int, retry_after_s: int) -> None:
        self._total = total
        self._per_client = per_client
        self._retry_after_s = retry_after_s
        self._open: Counter[str] = Counter()
        self._open_total = 0  # sum(self._open.values()), kept: one client or thousands

    @property
    def open(self) -> int:
        return self._open_total

    def acquire(self, key: str) -> StreamSlot:
        if self._open_total >= self._total:
            raise TooManyStreams(f"gateway at capacity: {self._total} streams open",
                                 self._retry_after_s)
        if self._open[key] >= self._per_client:
            raise TooManyStreams(
                f"too many streams for this client: {self._per_client} open",
                self._retry_after_s)
        self._open[key] += 1
        self._open_total += 1
        return StreamSlot(self, key)

    def _release(self, key: str) -> None:
        self._open[key] -= 1
        self._open_total -= 1
        if self._open[key] <= 0:
            del self._open[key]


class TooManyConnections(GatewayError):
    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(429, "too_many_connections", message,
                         headers={"Retry-After": str(retry_after_s)})


class ConnectRate:
    """A token bucket on new connections to the resume surface: `rate_per_s`
    refilled continuously, at most one second's worth banked. Resumes may be
    let in regardless (`admit(force=True)`): they still spend tokens, driving
    the bucket below zero, so new streams wait until the storm has passed."""

    def __init__(self, rate_per_s: float, retry_after_s: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = rate_per_s
        self._retry_after_s = retry_after_s
        self._clock = clock
        self._tokens = rate_per_s
        self._at = clock()

    def admit(self, *, force: bool = False) -> None:
        if self._rate <= 0:
            return  # no limit
        now = self._clock()
        self._tokens = min(self._rate, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens < 1 and not force:
            raise TooManyConnections(
                f"too many new connections: over {self._rate:g}/s on this gateway",
                self._retry_after_s)
        self._tokens -= 1


def replayed_receive(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands the app a body already read, whole, then the
    connection's own messages (a disconnect)."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class BodySizeLimit:
    """Refuses request bodies over `max_bytes` with 413, whether they announce a
    Content-Length or arrive chunked, before the app parses anything."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._refuse(send)
            return
        # Without a trustworthy length, read (at most max_bytes + 1) up front.
        body = b""
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                await self._refuse(send)
                return
        await self.app(scope, replayed_receive(body, receive), send)

    async def _refuse(self, send: Send) -> None:
        error = GatewayError(413, "body_too_large",
                             f"request body exceeds {self.max_bytes} bytes")
        payload = error_json(error.body())
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})
