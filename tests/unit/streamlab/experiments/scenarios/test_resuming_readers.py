"""Waiting for a scenario's readers: past the deadline every reader is
cancelled and has unwound before the tally (no reader still moving figures)."""

from __future__ import annotations

import asyncio

import pytest

from streamlab.experiments.scenarios.resuming_readers import readers_done

pytestmark = pytest.mark.anyio


async def test_readers_that_outlive_the_deadline_have_unwound_when_it_returns() -> None:
    unwound: list[int] = []

    async def reader(n: int, forever: bool) -> None:
        try:
            if forever:
                await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # unwinding takes a turn of the loop
            unwound.append(n)

    reading = asyncio.gather(reader(0, False), reader(1, True), reader(2, True))
    await readers_done(reading, 0.05)
    assert sorted(unwound) == [0, 1, 2]
    assert reading.done()


async def test_readers_that_end_in_time_are_waited_for() -> None:
    reading = asyncio.gather(asyncio.sleep(0.01, result="a"), asyncio.sleep(0, result="b"))
    await readers_done(reading, 5.0)
    assert list(reading.result()) == ["a", "b"]
