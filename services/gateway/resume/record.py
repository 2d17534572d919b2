"""One record per stream, whichever replica answers GET /v1/streams/{id}.

The record is who read the stream: its `attaches` (every GET of its events
URL, newest MAX_ATTACH_RECORDS, each with the Last-Event-ID it sent) and its
`readers` (the connections reading it now, on every replica, each with the id
it resumed from). With one gateway the stream holds it in memory
(streams.py); with replicas it lives in Redis beside the stream's log, so the
owner and every other replica answer the same:

    <prefix>:{<id>}:attaches   List of Attach records (JSON), trimmed to the
                               newest MAX_ATTACH_RECORDS
    <prefix>:{<id>}:readers    Sorted set: one member per connected reader on
                               any replica (its Attach, JSON), scored with the
                               unix ms its presence expires at

Both expire with the stream's meta (each write copies meta's PTTL; the owner's
log writer moves them with the rest). A reader is written before its response
starts (`RecordWriter.attach`, awaited), so a client that asks for the status
the moment its EventSource opens finds itself there: written in the
background, a browser's reconnect was missing from a status asked on open,
and when the replica answering was not the one it attached to, from every
status for a while. Its presence is refreshed every third of the follower TTL
while it reads, removed when it leaves, and a replica that dies stops
refreshing, so its readers drop out of `readers` within the TTL.

Unlike the `followers` set (readers on replicas other than the owner, which
the owner's grace timer counts), `readers` includes the owner's own.

Every write in the background is best effort and bounded, and none may die
of an exception: a store error is expected while Redis is down (the entry
expires within the TTL), anything else is counted in
streamlab_gateway_resume_task_failures_total (`reader_left`, `reader_attach`,
`readers_presence`) and logged, and the presence loop goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Coroutine
from dataclasses import asdict
from typing import Any

from redis.asyncio import Redis

from services.gateway.resume.redis_keys import StreamKeys
from services.gateway.resume.redis_log import STORE_ERRORS
from services.gateway.resume.streams import MAX_ATTACH_RECORDS, Attach
from services.gateway.resume.tasks import TaskFailures

# KEYS attaches, readers, meta; ARGV the record (JSON), how many attaches to
# keep, the reader's expiry (unix ms), now (unix ms), a TTL (ms) for when
# meta has none left. Appends the attach, adds the reader, drops expired
# readers, and gives both keys meta's remaining life.
RECORD_ATTACH = """
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], -tonumber(ARGV[2]), -1)
redis.call('ZADD', KEYS[2], tonumber(ARGV[3]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', tonumber(ARGV[4]))
local ttl = redis.call('PTTL', KEYS[3])
if ttl <= 0 then ttl = tonumber(ARGV[5]) end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return ttl
"""


# KEYS attaches, meta; ARGV the record (JSON), how many attaches to keep.
# Appends the attempt to a stream that exists, with meta's remaining life.
RECORD_ATTEMPT = """
local ttl = redis.call('PTTL', KEYS[2])
if ttl <= 0 then return 0 end
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], -tonumber(ARGV[2]), -1)
redis.call('PEXPIRE', KEYS[1], ttl)
return 1
"""


def reader_json(record: Attach) -> str:
    """The member string of a reader: the same for its attach and every refresh."""
    return json.dumps(asdict(record), separators=(",", ":"))


def reader_dict(record: Attach) -> dict[str, Any]:
    """How `readers` lists a reader (and `attaches` an attach)."""
    return asdict(record)


class RecordWriter:
    """This replica's writes of the shared record: an attach (awaited before
    the response starts), the presence of its readers while they read (one
    pipeline for all of them every third of `ttl_s`), and a reader's removal
    when it leaves (in the background: its task may be cancelled)."""

    def __init__(self, redis: Redis, ttl_s: float, timeout_s: float,
                 fallback_ttl_s: float, failures: TaskFailures,
                 patient: Redis | None = None) -> None:
        """`patient`: a client with a longer socket timeout, for the writes
        no request waits for (a retried reader's attempt)."""
        self._redis = redis
        self._failures = failures
        self._ttl_s = ttl_s
        self._timeout_s = timeout_s
        self._fallback_ms = int(fallback_ttl_s * 1000)
        self._script = redis.register_script(RECORD_ATTACH)
        self._attempt = (patient or redis).register_script(RECORD_ATTEMPT)
        self._reading: dict[str, tuple[StreamKeys, str]] = {}  # reader id -> keys, member
        self._writes: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None

    def _expiry_ms(self) -> int:
        return int((time.time() + self._ttl_s) * 1000)

    async def attach(self, keys: StreamKeys, record: Attach) -> None:
        """Raises a STORE_ERRORS error (bounded by `timeout_s`) if Redis cannot take it."""
        async with asyncio.timeout(self._timeout_s):
            await self._script(keys=[keys.attaches, keys.readers, keys.meta],
                               args=[reader_json(record), MAX_ATTACH_RECORDS,
                                     self._expiry_ms(), int(time.time() * 1000),
                                     self._fallback_ms])

    def reading(self, keys: StreamKeys, record: Attach) -> None:
        """The reader's response has started: keep its presence fresh."""
        self._reading[record.reader] = (keys, reader_json(record))

    def left(self, record: Attach) -> None:
        """The reader is gone (synchronous: runs in a cancelled generator's
        `finally`): stop refreshing it and remove it in the background."""
        entry = self._reading.pop(record.reader, None)
        keys, member = entry if entry is not None else (None, "")
        if keys is None:
            return

        async def remove() -> None:
            with contextlib.suppress(*STORE_ERRORS):
                async with asyncio.timeout(self._timeout_s):
                    await self._redis.zrem(keys.readers, member)

        self._spawn(remove(), "reader_left", f"reader-left-{record.reader}", keys.readers)

    def background(self, keys: StreamKeys, record: Attach) -> None:
        """`attach` without waiting (best effort): for a surface whose
        response has started already."""
        async def write() -> None:
            with contextlib.suppress(*STORE_ERRORS):
                await self.attach(keys, record)

        self._spawn(write(), "reader_attach", f"attach-{record.reader}", keys.attaches)

    def attempted(self, keys: StreamKeys, record: Attach, timeout_s: float) -> None:
        """A reader told `event: retry` before it could attach: in `attaches`
        only (it reads nothing yet, so not in `readers`), in the background,
        with its own bound. Only onto a stream whose meta exists (a stream id
        nobody created makes no key)."""
        async def write() -> None:
            with contextlib.suppress(*STORE_ERRORS):
                async with asyncio.timeout(timeout_s):
                    await self._attempt(keys=[keys.attaches, keys.meta],
                                        args=[reader_json(record), MAX_ATTACH_RECORDS])

        self._spawn(write(), "reader_attempt", f"attempt-{record.reader}", keys.attaches)

    def _spawn(self, coroutine: Coroutine[Any, Any, None], task: str, name: str,
               subject: str) -> None:
        async def guarded() -> None:
            try:
                await coroutine
            except Exception as exc:  # best effort: the entry expires within the TTL
                self._failures.caught(task, subject, exc, "left to expire with its TTL")

        spawned = asyncio.get_running_loop().create_task(guarded(), name=name)
        self._writes.add(spawned)
        spawned.add_done_callback(self._writes.discard)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._refresh(),
                                                            name="resume-readers")
        self._failures.watch(self._task, "readers_presence", "resume-readers")

    async def _refresh(self) -> None:
        unexpected = 0  # unexpected failures in a row: the first is logged in full
        while True:
            await asyncio.sleep(self._ttl_s / 3)
            if not self._reading:
                continue
            try:
                async with asyncio.timeout(self._timeout_s):
                    expiry = self._expiry_ms()
                    async with self._redis.pipeline(transaction=False) as pipe:
                        # Not XX: a reader whose entry was lost (Redis restarted
                        # empty) comes back. One that leaves while this runs may
                        # be re-added after its removal: it expires within the TTL.
                        for keys, member in list(self._reading.values()):
                            pipe.zadd(keys.readers, {member: expiry})
                        await pipe.execute()
                unexpected = 0
            except STORE_ERRORS:
                pass  # Redis down: the readers' entries come back at the next round
            except Exception as exc:  # the loop keeps every reader's presence: it goes on
                self._failures.caught("readers_presence", f"{len(self._reading)} readers",
                                      exc, f"again in {self._ttl_s / 3:.1f} s",
                                      repeat=unexpected > 0)
                unexpected += 1

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.gather(*self._writes, return_exceptions=True)  # each bounded


async def read_record(redis: Redis, keys: StreamKeys) -> tuple[list[dict[str, Any]],
                                                               list[dict[str, Any]]]:
    """The stream's attaches (oldest first) and its readers now (by when they came)."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.lrange(keys.attaches, 0, -1)
        pipe.zrangebyscore(keys.readers, int(time.time() * 1000), "+inf")
        attaches_raw, readers_raw = await pipe.execute()
    readers = sorted((json.loads(raw) for raw in readers_raw), key=lambda r: r["at"])
    return [json.loads(raw) for raw in attaches_raw], readers
