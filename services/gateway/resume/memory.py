"""The in-process resume store: this gateway's StreamRegistry behind the
ResumeStore interface (the single-gateway default, `resume_store = "memory"`).

A stream exists only in the gateway that created it: another replica, or this
one after a restart, answers 404. `follow_local` is also how the shared store
serves readers on the replica that owns the generation (from its own memory,
so they keep flowing while Redis is slow or down).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from sse_starlette import ServerSentEvent

from services.gateway.errors import GatewayError
from services.gateway.resume.replay_log import event_id, is_stream_id
from services.gateway.resume.store import FoundStream, ResumeStore, gap_event, retry_event
from services.gateway.resume.streams import (
    Attach,
    ResumableStream,
    StreamFactory,
    StreamPolicy,
    StreamRegistry,
)
from services.gateway.settings import GatewaySettings

if TYPE_CHECKING:
    from services.gateway.resume.ports import Lease


def found(stream: ResumableStream, now: float) -> FoundStream:
    return FoundStream(id=stream.id, last_seq=stream.log.last_seq,
                       first_seq=stream.log.first_seq, ended=stream.ended,
                       retry_ms=stream.policy.retry_ms, age_s=now - stream.created)


async def follow_local(stream: ResumableStream, after: int, record: Attach
                       ) -> AsyncIterator[ServerSentEvent]:
    # Attach inside the generator, so attach and detach pair up even when the
    # client is gone before the body starts (then neither runs).
    stream.attach(record)
    try:
        # Alone in its block: sets the reconnect delay before any event arrives.
        yield ServerSentEvent(retry=stream.policy.retry_ms, sep="\n")
        cursor = after
        told = 0  # the last notice this reader was sent
        while True:
            changed = stream.changed
            replay = stream.log.after(cursor)
            if replay.missed is not None:
                first, last = replay.missed
                yield gap_event(stream.id, first, last)
                cursor = last
            for entry in replay.entries:
                yield ServerSentEvent(id=event_id(stream.id, entry.seq), event=entry.kind,
                                      data=entry.data, sep="\n")
                cursor = entry.seq
            if stream.ended and cursor >= stream.log.last_seq:
                return  # the terminal event is sent; the response ends
            if stream.handed_off:  # drained: the client reconnects (nginx picks
                # another replica, which takes the stream over from the log)
                yield ServerSentEvent(retry=stream.policy.retry_ms, sep="\n")
                return
            notice = stream.notice
            if notice is not None and notice.number != told:
                # The owner re-attaches to the generation (streams.py): say so,
                # and keep the response open: the rest, or the end, follows here.
                told = notice.number
                yield retry_event(notice.code, notice.message, stream.policy.retry_ms)
                continue
            if not replay.entries and replay.missed is None:
                await changed.wait()
    finally:
        stream.detach(record)


def find_local(registry: StreamRegistry, stream_id: str, owner: str
               ) -> ResumableStream | None:
    """The stream if this gateway holds it and `owner` created it."""
    stream = registry.get(stream_id) if is_stream_id(stream_id) else None
    if stream is not None and stream.owner in (None, owner):
        return stream
    return None


def unknown(stream_id: str) -> GatewayError:
    return GatewayError(404, "unknown_stream", f"no stream {stream_id[:80]!r}")


def expired(stream_id: str) -> GatewayError:
    return GatewayError(410, "stream_expired",
                        f"stream {stream_id} ended and its replay TTL ran out")


class MemoryStore(ResumeStore):
    def __init__(self, settings: GatewaySettings, metrics: CollectorRegistry,
                 build: StreamFactory | None = None) -> None:
        self.settings = settings
        self.registry = StreamRegistry(settings, metrics)
        self.metrics = self.registry.metrics
        self._build = build

    def ensure_capacity(self) -> None:
        self.registry.ensure_capacity()

    async def create(self, stream_id: str, lease: Lease, policy: StreamPolicy
                     ) -> StreamPolicy:
        return self.registry.create(stream_id, lease, policy, self._build).policy

    def local(self, stream_id: str) -> ResumableStream | None:
        return self.registry.get(stream_id)

    async def find(self, stream_id: str, owner: str) -> FoundStream:
        """Another identity learns nothing, not even that the id exists (404,
        never 403 or 410)."""
        stream = find_local(self.registry, stream_id, owner)
        if stream is not None:
            return found(stream, time.monotonic())
        if self.registry.get(stream_id) is None and self.registry.was_evicted(stream_id, owner):
            raise expired(stream_id)
        raise unknown(stream_id)

    def _stream(self, found: FoundStream) -> ResumableStream:
        stream = self.registry.get(found.id)
        if stream is None:  # evicted between find and now
            raise expired(found.id)
        return stream

    async def status(self, found: FoundStream) -> dict[str, Any]:
        return self._stream(found).snapshot()

    async def cancel(self, found: FoundStream, reason: str) -> dict[str, Any]:
        stream = self._stream(found)
        stream.cancel(reason)
        return stream.snapshot()

    def follow(self, found: FoundStream, after: int, record: Attach
               ) -> AsyncIterator[ServerSentEvent]:
        return follow_local(self._stream(found), after, self.stamped(record))

    async def close(self) -> None:
        await self.registry.close()
