"""The shared store's Redis client: redis-py's, except that a cancel it
swallows is raised again.

Why: on Python 3.11, `asyncio.wait_for` returns the inner result instead of
raising when the task is cancelled in the same loop tick the inner future
completes (CPython: "AsyncIO's wait_for can hide cancellation in a rare race
condition"; the 3.12 rewrite of wait_for on `asyncio.timeout` fixed it).
redis-py (5.3.1, and its main branch still) sends every command through
`asyncio.wait_for(self._send_packed_command(...), socket_timeout)` whenever a
socket timeout is set, as every client of ours has. The send completes on its
first step, so a cancel landing in that tick (a reader's client leaving while
its follower sends an XREAD) was lost: the SSE body went on streaming to
nobody and its reader stayed in the record. With a loop of XREADs cancelled
at random, the plain client loses the cancel in most tries
(tests/integration/test_shared_record.py measures it); docs/resume.md has the
whole story.

The fix here: a swallowed cancel leaves the task's cancel count
(`Task.cancelling()`) above what it was before the command, since nothing
took it back (`uncancel`), so every command and pipeline compares the two
and raises CancelledError when they differ. A timeout of ours around the
call (`asyncio.timeout`) then turns it into TimeoutError as it should, where
it was swallowed too.

And a connection whose transport is gone is made again, not written to.
Redis restarting (SIGKILLed, or a hop in front of it dropping what it had
accepted) resets the pool's idle connections. redis-py checks a pooled
connection before it hands it out (`ConnectionPool.ensure_connection`), but
by its reader: a reader at EOF is dropped, while a reset leaves the reader
holding the error, not at EOF, so the connection passed as connected. The
next command's write then met the closed transport, and under uvloop (the
gateway's loop) a write on it raises `RuntimeError('unable to perform
operation on <TCPTransport closed=True ...>; the handler is closed')`, which
is none of the errors the store's callers handle (`STORE_ERRORS`): the owner's
log writer died of it, and its streams stayed `running` in Redis while the
owner finished them (tests/integration/test_resume_tasks.py). Every client here
makes its connections `ClosedTransportAware`: one whose transport is closing is
connected again when the pool hands it out, and a write that would still
meet one (the transport closed between the check and the write) raises
redis-py's ConnectionError, a store error like any other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar, cast

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError

T = TypeVar("T")


def cancel_count() -> int:
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0


def raise_if_swallowed(before: int) -> None:
    """Raise the cancel the call just awaited swallowed, if it did: the count
    rose and nothing took it back. (A delivered cancel never gets here: it
    raised through the call.)"""
    if cancel_count() > before:
        raise asyncio.CancelledError("a cancel swallowed inside the Redis client, raised again")


async def cancel_safe(call: Awaitable[T]) -> T:
    """`await call`, then raise a cancel it swallowed."""
    before = cancel_count()
    result = await call
    raise_if_swallowed(before)
    return result


class ClosedTransportAware(AbstractConnection):
    """Mixed into the pool's connection class (`closed_transport_aware`): a
    connection whose transport is closing is made again rather than used."""

    def _transport_closing(self) -> bool:
        writer = self._writer
        return writer is not None and writer.transport.is_closing()

    async def connect(self) -> None:
        # The pool calls this on every connection it hands out; redis-py skips
        # it while the reader and writer objects exist, even over a dead
        # transport: drop them first, so a fresh connection is made.
        if self._transport_closing():
            await self.disconnect(nowait=True)
        # redis-py leaves connect unannotated.
        await super().connect()  # type: ignore[no-untyped-call]

    async def _send_packed_command(self, command: Iterable[bytes]) -> None:
        if self._transport_closing():
            # Raised inside send_packed_command, which disconnects on any
            # error: the next command on this connection makes a new one.
            raise RedisConnectionError("the connection to Redis was reset (its transport "
                                       "is closed)")
        await super()._send_packed_command(command)


def closed_transport_aware(base: type[AbstractConnection]) -> type[AbstractConnection]:
    """`base` (redis-py's TCP, TLS or Unix-socket connection, as the URL picked)
    with ClosedTransportAware before it."""
    if issubclass(base, ClosedTransportAware):
        return base
    return cast(type[AbstractConnection],
                type(f"ClosedTransportAware{base.__name__}", (ClosedTransportAware, base), {}))


class CancelSafePipeline(Pipeline):
    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        return await cancel_safe(super().execute(raise_on_error))


class CancelSafeRedis(Redis):
    """redis.asyncio.Redis whose commands, scripts and pipelines never swallow
    a cancel, and whose connections are remade once their transport closed
    (the module's docstring says why)."""

    # False: redis-py's stock connections (the `resume_store_errors=store_only`
    # broken mode: a connection a Redis restart reset is written to again).
    transport_aware = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Before the pool makes its first connection (`from_url` builds the
        # pool, then this client on it; a single-connection client, which
        # this project does not use, would have made its one already).
        pool = self.connection_pool
        if self.transport_aware:
            pool.connection_class = closed_transport_aware(pool.connection_class)

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        # redis-py leaves execute_command unannotated.
        return await cancel_safe(
            super().execute_command(*args, **options))  # type: ignore[no-untyped-call]

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None
                 ) -> CancelSafePipeline:
        return CancelSafePipeline(self.connection_pool, self.response_callbacks,
                                  transaction, shard_hint)


class StockTransportRedis(CancelSafeRedis):
    """CancelSafeRedis on redis-py's stock connections: the broken mode
    (`resume_store_errors=store_only`) of the redis-restart scenario."""

    transport_aware = False
