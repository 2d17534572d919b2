"""The one interface the resume routes use, whichever store holds the log.

    ResumeStore            what /v1/streams needs: create, find, status,
      │                    cancel, follow (the SSE events after a point), close
      ├── MemoryStore      this gateway's own registry (services/gateway/
      │                    resume/memory.py): the single-gateway default
      └── RedisStore       a log shared by every replica in Redis
                           (services/gateway/resume/redis_store.py)

`find` answers who may see a stream (404 to anyone but its creator, 410 once
its TTL ran out) and returns a `FoundStream`: the facts the routes check a
Last-Event-ID against before the first byte. The routes then choose among
200/204/400 the same way for both stores (services/gateway/resume_routes.py).
"""

from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from sse_starlette import ServerSentEvent

from services.gateway.resume.replay_log import event_id
from services.gateway.settings import GatewaySettings

if TYPE_CHECKING:
    from services.gateway.resume.ports import Gateway, Lease
    from services.gateway.resume.streams import Attach, ResumableStream, ResumeMetrics, StreamPolicy


@dataclass(frozen=True)
class FoundStream:
    id: str
    last_seq: int  # the newest event's sequence number (0: none yet)
    first_seq: int  # the oldest one still held (last_seq + 1 when none)
    ended: bool
    retry_ms: int
    age_s: float  # seconds since it was created, for the attach records
    # The replica that runs its engine call, when another one does (shared store).
    owner_replica: str | None = None
    # How far past `last_seq` a Last-Event-ID may be: a running stream's owner
    # serves its own readers from memory, ahead of what it has written to the
    # shared log, so a client of an owner that just died can hold ids the log
    # never got (the replica that takes over re-attaches and writes them again).
    ahead: int = 0

    def missed(self, after: int) -> tuple[int, int] | None:
        """What a client that has seen up to `after` asks for that is gone."""
        return (after + 1, self.first_seq - 1) if after + 1 < self.first_seq else None


def gap_event(stream_id: str, first: int, last: int) -> ServerSentEvent:
    return ServerSentEvent(event="gap", sep="\n", data=json.dumps({
        "missed_from": event_id(stream_id, first),
        "missed_to": event_id(stream_id, last),
        "missed_events": last - first + 1}))


# The event that says "trouble that may pass: reconnect with your Last-Event-ID"
# (the shared store unreachable, this gateway paused past its store timeouts).
# It has no `id:`, so a client's Last-Event-ID stays the last event it got, and
# it comes with `retry:`; the response then ends, and an EventSource reconnects
# by itself. Never terminal: a terminal event (`done`, `error`, `cancelled`)
# means nothing more will come, and a blip is not that (docs/resume.md). The
# owner re-attaching to a generation whose engine call dropped says it too
# (`engine_reattaching`), but keeps the response open: the rest, or the
# stream's terminal event, follows on it (streams.py, `Notice`).
RETRY_EVENT = "retry"
STORE_UNAVAILABLE = "resume_store_unavailable"


def retry_event(code: str, message: str, retry_ms: int) -> ServerSentEvent:
    return ServerSentEvent(event=RETRY_EVENT, retry=retry_ms, sep="\n", data=json.dumps({
        "code": code, "message": message, "retryable": True, "retry_ms": retry_ms}))


class ResumeStore(ABC):
    settings: GatewaySettings
    metrics: ResumeMetrics

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex

    # Whether its generations are opened detachable (they outlive this
    # gateway's call, so another replica can re-attach to them).
    detachable_generations = False

    def stamped(self, record: Attach) -> Attach:
        """The record as this replica's: the same (equal) record every time."""
        return record if record.replica else replace(record, replica=self.settings.replica_id)

    def attempted(self, stream_id: str, record: Attach) -> None:  # noqa: B027 (optional)
        """A reader came for the stream and was told `event: retry` (the store
        could not say where the stream is): a store whose record is shared
        notes the attempt, so the owner counts the reader as come (a stream
        is not cancelled `never_attached` while its reader keeps retrying)."""

    async def attached(self, found: FoundStream, record: Attach) -> None:  # noqa: B027
        """A reader is about to be served (`follow` with the same record comes
        next): a store whose record is shared writes it now, before the
        response starts, so a status asked the moment the client sees the
        response open lists it on every replica. Never refuses the reader."""

    async def open(self, gateway: Gateway) -> None:  # noqa: B027 (optional)
        """Start what the store runs in the background (the app's lifespan);
        `gateway`: what a store that takes streams over opens leases with."""

    @abstractmethod
    def ensure_capacity(self) -> None:
        """Make room for one more stream, or refuse (503) before the engine is asked."""

    @abstractmethod
    async def create(self, stream_id: str, lease: Lease, policy: StreamPolicy
                     ) -> StreamPolicy:
        """Own a started generation's lease from now on; its policy as applied."""

    @abstractmethod
    def local(self, stream_id: str) -> ResumableStream | None:
        """The stream whose engine call this gateway runs, if it does."""

    @abstractmethod
    async def find(self, stream_id: str, owner: str) -> FoundStream:
        """The stream if `owner` created it, else GatewayError 404 (or 410)."""

    @abstractmethod
    async def status(self, found: FoundStream) -> dict[str, Any]:
        """GET /v1/streams/{id}: the stream's state."""

    @abstractmethod
    async def cancel(self, found: FoundStream, reason: str) -> dict[str, Any]:
        """Stop the generation wherever its engine call runs; its state after."""

    @abstractmethod
    def follow(self, found: FoundStream, after: int, record: Attach
               ) -> AsyncIterator[ServerSentEvent]:
        """`retry:`, then the events after `after` (a `gap` first if some are
        gone), then live ones, ending after the terminal event."""

    @abstractmethod
    async def close(self) -> None:
        """Gateway shutdown: cancel what this gateway runs."""
