"""The SSE send timeout as one timer per response: a send stuck past the
timeout raises sse-starlette's SendTimeoutError, a send that completes does
not, and a cancel from elsewhere stays a cancel."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import pytest
from sse_starlette.sse import SendTimeoutError

from services.gateway.sse_response import SendWatchdog

pytestmark = pytest.mark.anyio
MESSAGE = {"type": "http.response.body", "body": b"x", "more_body": True}


async def stuck(message: MutableMapping[str, Any]) -> None:
    await asyncio.Future()  # a socket that never drains


async def quick(message: MutableMapping[str, Any]) -> None:
    await asyncio.sleep(0)


async def test_a_send_stuck_past_the_timeout_raises_send_timeout() -> None:
    watchdog = SendWatchdog(0.05)
    try:
        for _ in range(3):  # sends that complete re-arm nothing and trip nothing
            await watchdog.send(quick, MESSAGE)
        with pytest.raises(SendTimeoutError):
            await watchdog.send(stuck, MESSAGE)
        current = asyncio.current_task()
        assert current is not None
        assert current.cancelling() == 0  # the cancel it used is taken back
    finally:
        watchdog.close()


async def test_a_cancel_from_elsewhere_during_a_send_stays_a_cancel() -> None:
    watchdog = SendWatchdog(30.0)
    sending = asyncio.create_task(watchdog.send(stuck, MESSAGE))
    await asyncio.sleep(0)
    sending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sending
    watchdog.close()


async def test_a_stuck_heartbeat_does_not_time_out_a_body_that_keeps_sending() -> None:
    watchdog = SendWatchdog(0.05)

    async def body() -> None:  # sends for twice the timeout, each send quick
        for _ in range(20):
            await watchdog.send(quick, MESSAGE)
            await asyncio.sleep(0.005)

    sending = asyncio.create_task(body())
    try:
        with pytest.raises(SendTimeoutError):
            await watchdog.send(stuck, MESSAGE)
        await sending  # no SendTimeoutError: each of its sends was short
    finally:
        watchdog.close()
