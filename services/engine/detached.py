"""Detachable generations: they outlive the call that started them.

A gateway replica that is SIGKILLed mid-stream takes its gRPC calls with it;
for a resumable stream the client then reconnects to another gateway, which
must continue the same generation, not start a new one. So a generation the
caller marked `detachable` runs in a task of its own (the producer), and the
calls that read it (Generate's own call, then any Attach) are consumers of a
bounded buffer of its tokens:

    producer     one task per generation: pulls the backend (through the
                 servicer's event stream: stop sequences, indexing, finish),
                 appends each token to the buffer, then waits while it is
                 `read_ahead` tokens ahead of the attached consumer; when
                 none is attached it holds one token ahead of the last one
                 (an orphan nobody will claim must not run on to its finish
                 for nobody: ORPHAN_AHEAD_TOKENS)
    consumer     at most one attached at a time: streams from its cursor,
                 each token once, in order, then the finish
    orphan       the consumer's call ended without an explicit Cancel
                 (connection lost, caller killed): a grace timer starts; an
                 Attach cancels it, its expiry cancels the generation

Who stops a detachable generation, and how:

    explicit Cancel      `stop()`: the cancel is marked, the producer cancelled
                         (at its next decode step), the entry dropped: a later
                         Attach is NOT_FOUND
    grace expiry         the same, counted in `orphan_expired`
    a newer Attach       replaces the attached consumer (the newest caller is
                         the live one: an old gateway cut off by a partition must
                         not keep a stream the client has left); the replaced
                         call ends with `Replaced` (ABORTED)
    engine shutdown      `close()` cancels every producer

A generation that ended (finish, or an error) is NOT forgotten when a call
wrote its end: the write only means gRPC took the message, not that the caller
read it, let alone stored it (a draining gateway's call is cancelled between
the two, and the replica that takes the stream over Attaches from the last
index its Redis log has). So an ended generation stays held, with its bounded
buffer and its terminal event, for the orphan grace after its last consumer
left: an Attach(after_index) in that time gets the tokens after the index and
the finish, once each, as from a running one. Then (or at an explicit Cancel,
at once) it is forgotten. Memory: at most `buffer_tokens` chunks and one finish
per generation that ended in the last `grace_s` seconds; no model slot (the
producer has ended and freed it).

The buffer keeps the newest `buffer_tokens` tokens and only ever trims tokens
below the consumer's cursor, so an Attach from any index the last consumer
could have received (and a gateway's log may lag behind) still finds them
unless the generation is longer than the buffer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterable

from services.engine.backends.base import ACCEPTED, Accepted, BackendError
from services.engine.errors import EngineException
from services.engine.stats import EngineStats, GenerationRecord
from streamlab_protocol.engine.v1 import engine_pb2 as pb

# Tokens the producer runs ahead of an attached consumer: enough to fill a
# batch while the consumer's call is blocked by flow control, few enough that a
# reader that stops reading still stops the model soon (as a plain Generate does).
READ_AHEAD_TOKENS = 32
# An orphan (its caller left without a Cancel) holds where it is: it may be a
# stream whose gateway gave up on it and whose explicit Cancel was lost (a
# timeout under load, the engine hop down), and such a generation must not
# run on to its finish for nobody (a storm's 30-token streams all finished as
# orphans after their clients were told `cancelled`). Whoever re-attaches
# gets the tokens from its index as they are made; the grace stops the rest.
ORPHAN_AHEAD_TOKENS = 1

Events = AsyncGenerator[pb.GenerateResponse | Accepted, None]


class Replaced(EngineException):
    """This consumer's generation was attached by a newer caller."""


class Stopped(EngineException):
    """The generation was stopped (explicit Cancel, grace expiry, shutdown)."""


class AttachRefused(EngineException):
    """An Attach that cannot be served; `status` names the gRPC status."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Attachment:
    """One consumer's hold on a generation: where its stream continues."""

    def __init__(self, next_index: int) -> None:
        self.next_index = next_index


class DetachedGeneration:
    def __init__(self, registry: Detachables, request_id: str, record: GenerationRecord,
                 events: Events, never_ran: Callable[[], None]) -> None:
        self._registry = registry
        self.request_id = request_id
        self.record = record
        self._chunks: deque[pb.TokenChunk] = deque()
        self.produced = 0  # index of the next token
        self._cursor = 0  # the next token the (last) consumer takes
        self.accepted = False
        self.terminal: pb.GenerateResponse | None = None  # finish or error event
        self.failure: BackendError | None = None  # failed before its first token
        self.stopped = False
        self._attached: Attachment | None = None
        self._grace: asyncio.TimerHandle | None = None
        self._changed = asyncio.Event()
        self._began = False
        self.task = asyncio.get_running_loop().create_task(self._produce(events))
        # A task cancelled before its first step never enters `_produce`, so the
        # events' `finally` (free the slot, end the record) would never run.
        self.task.add_done_callback(lambda _: None if self._began else never_ran())

    @property
    def first_buffered(self) -> int:
        return self.produced - len(self._chunks)

    @property
    def ended(self) -> bool:
        return self.task.done()

    # ---- the producer --------------------------------------------------------------
    async def _produce(self, events: Events) -> None:
        self._began = True
        try:
            async for message in events:
                if isinstance(message, Accepted):
                    self.accepted = True
                elif message.WhichOneof("event") == "token":
                    self._put((message.token,))
                elif message.WhichOneof("event") == "tokens":
                    self._put(message.tokens.chunks)
                else:  # finish or error: the last message
                    self.terminal = message
                self._notify()
                while self.produced - self._cursor >= self._window() and not self.stopped:
                    await self._wait()  # parked at the events' `yield`: the model pauses
        except BackendError as exc:
            self.failure = exc
        finally:
            self._notify()
            # Exhausted or not, close the event stream now (its `finally` ends the
            # record and frees the slot; a close at its `yield` counts as a cancel).
            await events.aclose()

    def _put(self, chunks: Iterable[pb.TokenChunk]) -> None:
        for chunk in chunks:
            self._chunks.append(chunk)
            self.produced += 1
        limit = self._registry.buffer_tokens
        while len(self._chunks) > limit and self.first_buffered < self._cursor:
            self._chunks.popleft()  # only tokens a consumer already took

    def _window(self) -> int:
        limit = self._registry.buffer_tokens
        return min(READ_AHEAD_TOKENS if self._attached is not None else ORPHAN_AHEAD_TOKENS,
                   limit)

    # ---- consumers -----------------------------------------------------------------
    def attach(self, after_index: int | None) -> Attachment:
        """A consumer from the token after `after_index` (None: from the first);
        it replaces any consumer attached now."""
        start = 0 if after_index is None else after_index + 1
        if start > self.produced:
            raise AttachRefused(
                "OUT_OF_RANGE", f"after_index={after_index} is past the {self.produced} "
                f"tokens generation {self.request_id!r} has produced")
        if start < self.first_buffered:
            raise AttachRefused(
                "OUT_OF_RANGE", f"tokens after index {after_index} of {self.request_id!r} are "
                f"no longer buffered (the engine keeps the newest "
                f"{self._registry.buffer_tokens}; the oldest held is {self.first_buffered})")
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None
        attachment = Attachment(start)
        self._attached = attachment
        self._cursor = start
        self._notify()  # wakes a replaced consumer, and the producer (smaller window)
        return attachment

    async def follow(self, attachment: Attachment, batches: bool,
                     announce: bool = False) -> Events:
        """The stream for one consumer: its tokens, then the finish (or error
        event); BackendError if the generation failed before its first token.
        `announce`: yield ACCEPTED once the backend accepted the generation."""
        delivered = False
        try:
            while True:
                if self._attached is not attachment:
                    raise Replaced(f"generation {self.request_id!r} was attached by "
                                   "another caller")
                if self.stopped:
                    raise Stopped(f"generation {self.request_id!r} was cancelled")
                if announce and (self.accepted or self.produced or self.ended):
                    announce = False
                    yield ACCEPTED
                    continue
                if attachment.next_index < self.produced:
                    chunks = list(self._chunks)[attachment.next_index - self.first_buffered:]
                    attachment.next_index = self._cursor = self.produced
                    self._notify()  # room for the producer
                    if batches and len(chunks) > 1:
                        yield pb.GenerateResponse(tokens=pb.TokenBatch(chunks=chunks))
                    else:
                        for chunk in chunks:
                            yield pb.GenerateResponse(token=chunk)
                    continue
                if self.terminal is not None:
                    delivered = True
                    yield self.terminal
                    return
                if self.failure is not None:
                    delivered = True
                    raise self.failure
                if self.ended:  # cancelled, or an unexpected error in the producer
                    raise Stopped(f"generation {self.request_id!r} ended without a finish")
                await self._wait()
        finally:
            self.release(attachment, delivered)

    def release(self, attachment: Attachment, delivered: bool = False) -> None:
        """The consumer is gone (`follow` calls it on every exit; a caller that
        left before it began following calls it itself)."""
        if self._attached is not attachment:
            return  # replaced: the newer consumer owns it
        self._attached = None
        if self.stopped:
            self._registry.drop(self)
            return
        if delivered:
            # Written is not received: keep the tail and the end for a re-attach
            # (module docstring), then forget it; not an orphan, nothing to stop.
            self._keep_for_replay()
            return
        # The consumer's call ended without a Cancel: its caller vanished.
        self._registry.stats.orphaned += 1
        grace = self._registry.grace_s
        if grace <= 0:
            self._expire()
        else:
            self._grace = asyncio.get_running_loop().call_later(grace, self._expire)
        self._notify()  # the producer may run ahead into the buffer now

    def _keep_for_replay(self) -> None:
        grace = self._registry.grace_s
        if grace <= 0:
            self._registry.drop(self)
        else:
            self._grace = asyncio.get_running_loop().call_later(grace, self._forget)

    def _forget(self) -> None:
        self._grace = None
        if self._attached is None:
            self._registry.drop(self)

    def _expire(self) -> None:
        self._grace = None
        if self._attached is None and not self.stopped:
            self._registry.stats.orphan_expired += 1
            self.stop()

    def stop(self) -> bool:
        """Cancel the generation now (idempotent); True if it was still running."""
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None
        running = not self.stopped and not self.ended
        self.stopped = True
        if running:
            self._registry.stats.mark_cancel(self.record)
            self.task.cancel()  # the model stops at its next decode step
        self._registry.drop(self)
        self._notify()
        return running

    # ---- waking ----------------------------------------------------------------------
    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait(self) -> None:
        await self._changed.wait()


class Detachables:
    """Every detachable generation the engine holds, by request id."""

    def __init__(self, stats: EngineStats, grace_s: float, buffer_tokens: int) -> None:
        self.stats = stats
        self.grace_s = grace_s
        self.buffer_tokens = buffer_tokens
        self._by_id: dict[str, DetachedGeneration] = {}

    def __contains__(self, request_id: str) -> bool:
        """A generation of this id still runs here (one that ended and is only
        kept for a replay does not block a new one: `start` replaces it)."""
        generation = self._by_id.get(request_id)
        return generation is not None and not generation.ended

    def start(self, request_id: str, record: GenerationRecord, events: Events,
              never_ran: Callable[[], None]) -> DetachedGeneration:
        """Run `events` in a task of its own; `never_ran` frees what they would
        have freed if that task is cancelled before it starts."""
        replaced = self._by_id.get(request_id)
        if replaced is not None:
            replaced.stop()  # ended (see __contains__): forget it, its timer too
        generation = DetachedGeneration(self, request_id, record, events, never_ran)
        self._by_id[request_id] = generation
        return generation

    def get(self, request_id: str) -> DetachedGeneration | None:
        return self._by_id.get(request_id)

    def attach(self, request_id: str, after_index: int | None
               ) -> tuple[DetachedGeneration, Attachment]:
        generation = self._by_id.get(request_id)
        if generation is None:
            raise AttachRefused(
                "NOT_FOUND", f"no detachable generation {request_id!r} on this engine: never "
                "started here, not detachable, cancelled, or its orphan grace "
                f"({self.grace_s:g} s) expired, or it ended longer ago than that")
        attachment = generation.attach(after_index)
        self.stats.reattached += 1
        return generation, attachment

    def drop(self, generation: DetachedGeneration) -> None:
        if self._by_id.get(generation.request_id) is generation:
            del self._by_id[generation.request_id]

    async def close(self) -> None:
        """Engine shutdown: cancel every generation still held."""
        generations = list(self._by_id.values())
        for generation in generations:
            generation.stop()
        for generation in generations:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await generation.task

