"""A replica that does not own a generation reads it from Redis.

    find      HGETALL meta (404 / 410 from it and the `gone` key) and the
              oldest entry held (XRANGE - + COUNT 1), for the routes' checks
    tail      `retry:`, then XREAD after Last-Event-ID's sequence number:
              the replay, and with BLOCK the live tail, until the terminal
              event (a hole in the sequence numbers is told as `gap`)

Why readers elsewhere count for the owner's grace timer as members of one
sorted set per stream (`followers`), scored with the time their presence
expires, rather than a key per replica with a TTL: the owner must ask "is
anyone reading?" in one command without knowing which replicas exist (a key
per replica would need SCAN or a registry of replicas), and Redis 7.0's hash
fields cannot expire on their own. A reader adds itself (ZADD) when it
attaches and again every time its blocking read returns (at least every
third of `redis_follower_ttl_s`), and removes itself (ZREM) when it leaves; a
replica that dies stops refreshing, so its readers stop counting within the
TTL. The owner counts members whose expiry is in the future (ZCOUNT now
+inf). The scores are the readers' wall clocks, so replicas' clocks must agree
to well within the TTL (NTP does).

Every call is bounded (the client's socket timeout): with Redis down a resume
is a 503 before the first byte, and a tail already streaming ends with an SSE
`retry` event (`resume_store_unavailable`, never terminal); the client
reconnects (`retry:`) and, once Redis is back, gets the events after its
Last-Event-ID.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

from redis.asyncio import Redis
from sse_starlette import ServerSentEvent

from services.gateway.errors import GatewayError, GatewayException
from services.gateway.resume.redis_keys import StreamKeys, StreamMeta, entry_id, entry_seq
from services.gateway.resume.redis_log import STORE_ERRORS, StoreMetrics
from services.gateway.resume.replay_log import event_id
from services.gateway.resume.store import STORE_UNAVAILABLE, gap_event, retry_event
from services.gateway.resume.streams import ENGINE_REATTACHING, GENERATION_LOST

OwnerGone = Callable[[str, StreamKeys, StreamMeta, int], Awaitable[bool]]
# After a take-over by this replica: the stream's events from this replica's
# memory after a cursor (None when its memory does not reach back that far).
LocalAfter = Callable[[str, int], AsyncIterator[ServerSentEvent] | None]
TERMINAL_KINDS = frozenset({"done", "error", "cancelled"})
READ_BATCH = 512  # events per XREAD: a long replay comes in pieces, not one reply


class ReaderMustMove(GatewayException):
    """Raised by `owner_gone` when this replica will not take the stream over
    (it is draining: it would own the stream only to cancel it as it exits).
    The tail ends without a terminal event, so the reader reconnects after its
    `retry:` and lands on a replica that stays."""


def store_unavailable(retry_after_s: int) -> GatewayError:
    return GatewayError(503, STORE_UNAVAILABLE,
                        "the shared resume log (Redis) is unreachable; retry shortly",
                        headers={"Retry-After": str(retry_after_s)})


async def read_meta(redis: Redis, keys: StreamKeys) -> StreamMeta | None:
    # redis-py types its commands for the sync and async clients at once.
    raw: dict[str, str] = await redis.hgetall(keys.meta)  # type: ignore[misc]
    return StreamMeta.from_hash(raw) if raw else None


async def first_seq(redis: Redis, keys: StreamKeys, last_seq: int) -> int:
    oldest = await redis.xrange(keys.events, "-", "+", count=1)
    return entry_seq(oldest[0][0]) if oldest else last_seq + 1


class Presence:
    """This reader's membership in a stream's `followers` set."""

    def __init__(self, redis: Redis, keys: StreamKeys, replica: str, ttl_s: float) -> None:
        self._redis = redis
        self._keys = keys
        self.member = f"{replica}/{uuid.uuid4().hex[:8]}"
        self._ttl_s = ttl_s
        self._refreshed = 0.0

    async def refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._refreshed < self._ttl_s / 3:
            return
        expires_ms = int((time.time() + self._ttl_s) * 1000)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zadd(self._keys.followers, {self.member: expires_ms})
            # Old members of readers that died: trimmed by whoever reads next.
            pipe.zremrangebyscore(self._keys.followers, "-inf", int(time.time() * 1000))
            pipe.pexpire(self._keys.followers, int(self._ttl_s * 1000) * 2, gt=False)
            await pipe.execute()
        self._refreshed = now

    async def leave(self, timeout_s: float) -> None:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can lose a
        # cancel (services/gateway/resume/redis_client.py).
        with contextlib.suppress(*STORE_ERRORS):
            async with asyncio.timeout(timeout_s):
                await self._redis.zrem(self._keys.followers, self.member)


def lost_after_reattaching(data: str) -> bool:
    """An `error` event's data says `generation_lost`: only the owner's re-attach
    (streams.py) ends a stream so, after telling its readers it was trying."""
    try:
        error = json.loads(data).get("error")
    except (ValueError, AttributeError):
        return False
    return isinstance(error, dict) and error.get("code") == GENERATION_LOST


async def fresh_followers(redis: Redis, keys: StreamKeys) -> int:
    """Readers on other replicas whose presence has not expired."""
    return int(await redis.zcount(keys.followers, int(time.time() * 1000), "+inf"))


async def tail(redis: Redis, keys: StreamKeys, stream_id: str, *, after: int, retry_ms: int,
               presence: Presence, block_s: float, timeout_s: float, retry_after_s: int,
               metrics: StoreMetrics, owner_gone: OwnerGone,
               local_after: LocalAfter | None = None, retryable: bool = True
               ) -> AsyncGenerator[ServerSentEvent, None]:
    """`owner_gone(stream id, keys, meta, cursor)`: asked while nothing arrives; once
    the owner has stopped running it takes the stream over (the tail then reads
    what the new owner writes) or ends it in the log (the tail reads that end).
    `local_after`: once this replica took the stream over, the reader follows
    its memory instead of polling the store (under a storm of hundreds of
    readers the polls were what made the store calls time out).
    `retryable`: a store failure ends the tail with `event: retry` (the client
    reconnects with its Last-Event-ID); False, the broken case, with a terminal
    `error`."""
    yield ServerSentEvent(retry=retry_ms, sep="\n")
    cursor = after
    told = ""  # the owner's notice this reader was last told (meta.notice)
    try:
        await presence.refresh(force=True)
        while True:
            answer = await redis.xread({keys.events: entry_id(cursor)}, count=READ_BATCH,
                                       block=max(1, int(block_s * 1000)))
            entries = answer[0][1] if answer else []
            for raw_id, fields in entries:
                seq = entry_seq(raw_id)
                if seq > cursor + 1:  # trimmed by MAXLEN, or never written (dropped)
                    yield gap_event(stream_id, cursor + 1, seq - 1)
                kind = fields["k"]
                if kind == "error" and not told and lost_after_reattaching(fields["d"]):
                    # The owner's re-attach ended before this reader read its
                    # notice from the meta (a restarted engine's NOT_FOUND
                    # within one blocking read): told with the end it led to,
                    # as the owner's own readers were told before it.
                    told = "with the end"
                    yield retry_event(ENGINE_REATTACHING, "the engine call dropped; attaching "
                                      "to the generation again was tried", retry_ms)
                yield ServerSentEvent(id=event_id(stream_id, seq), event=kind,
                                      data=fields["d"], sep="\n")
                cursor = seq
                if kind in TERMINAL_KINDS:
                    return
            await presence.refresh()
            if not entries:
                meta = await read_meta(redis, keys)
                if meta is None:  # its TTL ran out while we waited: nothing more will come
                    return
                if meta.ended and cursor >= meta.last_seq:
                    return  # a client ahead of the log's end (found.ahead): nothing more
                if meta.notice and meta.notice != told:
                    # The owner re-attaches to the generation: told here as on
                    # the owner, and the tail reads on (the rest, or the end).
                    told = meta.notice
                    notice = json.loads(meta.notice)
                    yield retry_event(str(notice["code"]), str(notice["message"]), retry_ms)
                if not meta.ended and await owner_gone(stream_id, keys, meta, cursor):
                    local = local_after(stream_id, cursor) if local_after is not None else None
                    if local is not None:
                        async for event in local:
                            yield event
                        return
    except ReaderMustMove:
        return
    except Exception as exc:  # a store error, or anything else: the reader is told
        if isinstance(exc, STORE_ERRORS):
            metrics.read_failures.inc()
        else:
            # Not a store error (a connection a Redis restart reset raised
            # RuntimeError here): the reader must not be left with a response
            # cut without a word. It is told as a store failure: the client
            # reconnects with its Last-Event-ID.
            metrics.tasks.caught("tail", stream_id, exc, "the reader is told to retry")
        error = store_unavailable(retry_after_s)
        if retryable:
            yield retry_event(error.code, error.message, retry_ms)
        else:
            yield ServerSentEvent(event="error", data=json.dumps(error.body()), sep="\n")
    finally:
        try:
            await presence.leave(timeout_s)
        except Exception as exc:  # its presence expires within the follower TTL
            metrics.tasks.caught("presence", stream_id, exc, "left to expire with its TTL")
