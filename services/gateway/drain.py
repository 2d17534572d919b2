"""Graceful drain: on SIGTERM, stop taking streams, let live ones finish, then
tell the rest to come back, then exit.

    SIGTERM ─▶ Drain.begin(): /healthz and /readyz answer 503, new streams 503
               │               with Retry-After (the listener stays open, so
               │               nginx gets a clean answer rather than a refused
               │               connection)
               ├─ live streams run on, for up to `drain_grace_s`
               ├─ at the deadline each remaining stream's engine call is
               │  cancelled with reason "server_draining"; its body sends a
               │  final event with `retry:` and a `server_draining` error
               └─ then uvicorn's own shutdown runs (services/gateway/server.py)

A second SIGTERM skips the wait.
"""

from __future__ import annotations

import asyncio
import time

from services.gateway.engine_client import EngineStream

DRAINING = "server_draining"


class Drain:
    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.draining = False
        self._streams: set[EngineStream] = set()
        self._changed = asyncio.Event()

    def track(self, stream: EngineStream) -> None:
        self._streams.add(stream)

    def untrack(self, stream: EngineStream) -> None:
        self._streams.discard(stream)
        self._changed.set()

    @property
    def live(self) -> int:
        return len(self._streams)

    async def run(self) -> None:
        """Drain, then return (the caller then shuts the server down)."""
        self.draining = True
        await self._until_empty(self.grace_s)
        for stream in list(self._streams):
            stream.cancel(DRAINING)
        # Give the bodies a moment to send their final event before uvicorn
        # starts closing connections.
        await self._until_empty(2.0)

    async def _until_empty(self, timeout_s: float) -> None:
        """Return when no stream is tracked, or after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while self._streams and (left := deadline - time.monotonic()) > 0:
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                break
