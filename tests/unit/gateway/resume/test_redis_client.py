"""The shared store's client raises a cancel that `asyncio.wait_for` swallowed
(services/gateway/resume/redis_client.py). redis-py sends every command
through `wait_for` over a coroutine that completes on its first step; here the
same shape, cancelled at each loop tick after it starts. The real client
against a real Redis: tests/integration/test_shared_record.py."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable

import pytest

from services.gateway.resume.redis_client import cancel_safe

pytestmark = pytest.mark.anyio

TICKS = range(4)  # from "not started yet" to "the send is done, the waiter not woken"


async def sent() -> str:
    return "sent"  # done on its first step, as a send into an empty socket buffer


def send_like_redis_py() -> Awaitable[str]:
    return asyncio.wait_for(sent(), 10.0)


async def cancelled_after(ticks: int, call: Callable[[], Awaitable[str]]) -> str:
    """"cancelled" if one cancel, `ticks` ticks in, ends the call; else its result."""
    async def caller() -> str:
        return await call()

    task = asyncio.create_task(caller())
    for _ in range(ticks):
        await asyncio.sleep(0)
    assert not task.done()
    task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        return "cancelled"


@pytest.mark.parametrize("ticks", TICKS)
async def test_a_cancel_at_any_tick_of_a_send_ends_the_call(ticks: int) -> None:
    assert await cancelled_after(ticks, lambda: cancel_safe(send_like_redis_py())) == "cancelled"


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="wait_for no longer swallows from 3.12")
async def test_the_ticks_reach_the_moment_bare_wait_for_swallows_the_cancel() -> None:
    """Without it some of those ticks lose the cancel: the test above is not
    passing for want of reaching the race."""
    outcomes = [await cancelled_after(ticks, send_like_redis_py) for ticks in TICKS]
    assert "sent" in outcomes, outcomes


async def test_a_cancel_taken_back_inside_the_call_is_not_raised_again() -> None:
    """A timeout inside the call cancels the task and takes the cancel back
    (uncancel): the count is even again, so nothing is raised."""
    async def with_inner_timeout() -> str:
        try:
            async with asyncio.timeout(0):
                await asyncio.sleep(1)
        except TimeoutError:
            return "timed out inside"
        return "not reached"

    assert await cancel_safe(with_inner_timeout()) == "timed out inside"
