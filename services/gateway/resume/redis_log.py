"""The owner's side of the shared log: one running stream's events copied
into Redis in batches, without ever slowing the stream.

    producer ─▶ ResumableStream._append ─▶ LogMirror.add   (sync: a list append)
                                              │ wakes
                                              ▼
                                  writer task: everything pending, in one
                                  pipeline (XADD each with MAXLEN, HSET the
                                  meta, PEXPIRE), then again for what arrived
                                  during that round trip

So a batch is "whatever arrived since the last write": one round trip per
batch, never one per token, and no token waits for a batch to fill (the first
token after a quiet spell is written at once). The owner's own readers read
its memory, not Redis, so a slow or dead store never delays them.

When a write fails (Redis down, or slower than `redis_timeout_s`), the batch
stays pending and is retried with a backoff; the failure is counted
(`streamlab_gateway_resume_store_write_failures`). What is lost while it
fails: nothing for readers on the owner; for readers on other replicas, the
events are late until a write succeeds, and if more than
`redis_pending_max_events` pile up, the oldest are dropped from the shared
log (counted in `..._events_dropped`; a resume elsewhere then gets `gap`).
A stream that ended keeps being retried for its TTL, so a completed stream's
text reaches Redis whenever Redis is up in that time.

Any other exception a write raises is handled the same way: the batch stays
pending and is retried with the same backoff, so the writer never dies
(a writer that died left its stream `running` in Redis for good: the owner
finished it in memory, kept its alive key fresh, so no replica took it over,
and readers on other replicas got pings until the meta's TTL). Why retry
rather than give the stream up: giving it up (the meta's `replica` released,
or an end in the log) is itself a write to the same store, so a writer that
cannot write cannot hand anything over either; what failed so far were
connections a Redis restart had reset, and the next attempt, on a new
connection, writes everything pending, the end included. Such an exception is
logged (the first of a run of failures, with its traceback) and counted in
`streamlab_gateway_resume_task_failures_total{task="log_writer"}`; the batch
in `..._write_failures` as any failed write.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from services.gateway.resume.redis_keys import StreamKeys, StreamMeta, entry_id
from services.gateway.resume.replay_log import Entry
from services.gateway.resume.tasks import TaskFailures

log = logging.getLogger("streamlab.gateway")

RETRY_FIRST_S, RETRY_MAX_S = 0.1, 2.0
STORE_ERRORS = (RedisError, OSError, asyncio.TimeoutError)


class StoreMetrics:
    def __init__(self, registry: CollectorRegistry, tasks: TaskFailures) -> None:
        """`tasks`: the resume path's task failures (ResumeMetrics holds them)."""
        self.batches = Counter("streamlab_gateway_resume_store_batches",
                               "Pipelines written to the shared resume log", registry=registry)
        self.events = Counter("streamlab_gateway_resume_store_events",
                              "Events written to the shared resume log", registry=registry)
        self.write_failures = Counter("streamlab_gateway_resume_store_write_failures",
                                      "Batches the shared resume log refused or timed out "
                                      "(retried)", registry=registry)
        self.dropped = Counter("streamlab_gateway_resume_store_events_dropped",
                               "Events never written to the shared log (too many pending "
                               "while it failed)", registry=registry)
        self.takeovers = Counter("streamlab_gateway_resume_takeovers",
                                 "Streams whose owning replica was lost, by what happened: "
                                 "reattached here, ended owner_lost, handed_off by a drain, "
                                 "or superseded here by another replica's take-over",
                                 ["outcome"], registry=registry)
        self.read_failures = Counter("streamlab_gateway_resume_store_read_failures",
                                     "Resumes, statuses or live tails the store failed",
                                     registry=registry)
        self.tasks = tasks
        # When this replica last failed to reach the store (any call: the
        # record's writes skip the store for a moment after one).
        self.last_failure_at = -math.inf
        # When its heartbeat (its alive key and control channel, once a
        # second) last failed: while that is recent, another replica's missing
        # alive key says more about the store than about that replica
        # (RedisStore._owner_gone, the take-over sweep). A reader's or
        # writer's call that timed out does not count: under load those fail
        # while the store is up (docs/resume.md, "The owner dies").
        self.last_heartbeat_failure_at = -math.inf

    def store_failed(self) -> None:
        self.last_failure_at = time.monotonic()

    def store_failed_within(self, seconds: float) -> bool:
        return time.monotonic() - self.last_failure_at < seconds

    def heartbeat_failed(self) -> None:
        self.store_failed()
        self.last_heartbeat_failure_at = time.monotonic()

    def heartbeat_failed_within(self, seconds: float) -> bool:
        return time.monotonic() - self.last_heartbeat_failure_at < seconds


def _already_written(result: object) -> bool:
    """An XADD retried after a reply was lost: Redis refuses the same id again."""
    return isinstance(result, ResponseError) and "equal or smaller" in str(result)


class LogMirror:
    def __init__(self, redis: Redis, keys: StreamKeys, meta: Callable[[], StreamMeta],
                 *, running_ttl_s: float, pending_max: int, metrics: StoreMetrics,
                 survive_any: bool = True) -> None:
        """`meta`: the stream's metadata now (read at each write). `survive_any`
        False: the broken mode (`resume_store_errors=store_only`), where an
        exception that is not a store error ends the writer."""
        self._redis = redis
        self._keys = keys
        self._meta = meta
        self._running_ttl_s = running_ttl_s
        self._pending: deque[Entry] = deque()
        self._pending_max = pending_max
        self._metrics = metrics
        self._survive_any = survive_any
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.written_seq = 0  # every event up to here is in Redis (or was dropped)
        self._released = False  # handed to another replica: write what is pending, stop

    def add(self, entry: Entry) -> None:
        self._pending.append(entry)
        while len(self._pending) > self._pending_max:
            self._pending.popleft()
            self._metrics.dropped.inc()
        self._wake.set()

    def touch(self) -> None:
        """Write the metadata now, with no event (a notice changed)."""
        self._wake.set()

    def release(self) -> asyncio.Task[None] | None:
        """This replica gives the stream up (a drain): the next write carries
        what is pending and the metadata that says so, then the writer stops."""
        self._released = True
        self._wake.set()
        return self._task

    def abandon(self) -> None:
        """Another replica owns the log now (it took the stream over): write
        nothing more, not even what is pending."""
        self._pending.clear()
        if self._task is not None:
            self._task.cancel()

    def start(self, tombstone_s: float) -> asyncio.Task[None]:
        self._task = asyncio.get_running_loop().create_task(
            self._run(tombstone_s), name=f"resume-log-{self._keys.events}")
        self._metrics.tasks.watch(self._task, "log_writer", self._keys.events)
        return self._task

    async def stop(self, flush_timeout_s: float) -> None:
        """Shutdown: give the last batch a bounded chance, then stop."""
        if self._task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), flush_timeout_s)
        except (TimeoutError, asyncio.CancelledError):
            pass
        finally:
            self._task.cancel()

    async def write_meta(self) -> None:
        """The first write (on create): the stream exists for every replica."""
        meta = self._meta()
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(self._keys.meta, mapping=meta.to_hash())
            pipe.pexpire(self._keys.meta, _ms(self._running_ttl_s))
            await pipe.execute()

    async def _run(self, tombstone_s: float) -> None:
        backoff = RETRY_FIRST_S
        gave_up_at: float | None = None
        unexpected = 0  # unexpected failures in a row: the first is logged in full
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            released = self._released  # read first: this batch's meta then says so
            meta: StreamMeta | None = None
            try:
                meta = self._meta()
                batch = list(self._pending)
                await self._write(batch, meta, tombstone_s)
            except Exception as exc:  # any failure: retried, never the end of the writer
                if not self._survive_any and not isinstance(exc, STORE_ERRORS):
                    raise  # the broken mode: the writer dies, its stream freezes in Redis
                self._metrics.write_failures.inc()
                if isinstance(exc, STORE_ERRORS):
                    log.warning("resume log write failed (%d events pending): %s",
                                len(self._pending), exc)
                else:
                    self._metrics.tasks.caught(
                        "log_writer", self._keys.events, exc,
                        f"{len(self._pending)} events pending, retried in {backoff:.1f} s",
                        repeat=unexpected > 0)
                    unexpected += 1
                if meta is not None and meta.ended:
                    gave_up_at = gave_up_at or loop.time() + max(meta.ttl_s, 1.0)
                    if loop.time() >= gave_up_at:
                        self._metrics.dropped.inc(len(self._pending))
                        return
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RETRY_MAX_S)
                self._wake.set()
                continue
            backoff = RETRY_FIRST_S
            unexpected = 0
            if batch:
                self.written_seq = batch[-1].seq
            while self._pending and self._pending[0].seq <= self.written_seq:
                self._pending.popleft()
            if (meta.ended or released) and not self._pending:
                return

    async def _write(self, batch: list[Entry], meta: StreamMeta, tombstone_s: float) -> None:
        keys = self._keys
        ttl_ms = _ms(meta.ttl_s if meta.ended else self._running_ttl_s)
        async with self._redis.pipeline(transaction=True) as pipe:
            for entry in batch:
                pipe.xadd(keys.events, {"k": entry.kind, "d": entry.data}, id=entry_id(entry.seq),
                          maxlen=meta.max_events, approximate=False)
            pipe.hset(keys.meta, mapping=meta.to_hash())
            for key in (keys.events, keys.meta, keys.followers, keys.attaches, keys.readers):
                pipe.pexpire(key, ttl_ms)
            if meta.ended:
                # The tombstone names the owner: a 410 is told only to it (others: 404).
                pipe.set(keys.gone, meta.owner or "", px=ttl_ms + _ms(tombstone_s))
            results = await pipe.execute(raise_on_error=False)
        for result in results:
            if isinstance(result, Exception) and not _already_written(result):
                raise result
        self._metrics.batches.inc()
        self._metrics.events.inc(len(batch))


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))
