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
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

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


class CancelSafePipeline(Pipeline):
    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        return await cancel_safe(super().execute(raise_on_error))


class CancelSafeRedis(Redis):
    """redis.asyncio.Redis whose commands, scripts and pipelines never swallow
    a cancel (the module's docstring says where they did)."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        # redis-py leaves execute_command unannotated.
        return await cancel_safe(
            super().execute_command(*args, **options))  # type: ignore[no-untyped-call]

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None
                 ) -> CancelSafePipeline:
        return CancelSafePipeline(self.connection_pool, self.response_callbacks,
                                  transaction, shard_hint)
