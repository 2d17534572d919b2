"""Set-up admission (services/gateway/admission.py): the token bucket's turns
on a clock the test moves, the bounded wait, and the mode without it."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.gateway.admission import ServerBusy, SetupAdmission


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_runs_at_once_and_the_rest_waits_its_turn_in_order() -> None:
    clock = Clock()
    admission = SetupAdmission(rate_per_s=100.0, max_wait_s=10.0, clock=clock)
    # 50 ms worth at 100/s: five set-ups run at once, the sixth waits 10 ms,
    # each after it 10 ms more (first come, first served).
    delays = [admission.turn() for _ in range(8)]
    assert delays[:5] == [0.0] * 5
    assert delays[5:] == pytest.approx([0.01, 0.02, 0.03])
    assert admission.waited == 3
    # Once the queue has drained, a set-up runs at once again.
    clock.now += 1.0
    assert admission.turn() == 0.0


def test_a_turn_past_the_longest_wait_is_refused_with_retry_after() -> None:
    clock = Clock()
    admission = SetupAdmission(rate_per_s=10.0, max_wait_s=0.5, clock=clock)
    delays = [admission.turn() for _ in range(6)]  # burst of 1, then 0.1 s each
    assert delays == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    with pytest.raises(ServerBusy) as refused:
        admission.turn()
    assert refused.value.status_code == 503
    assert refused.value.code == "server_busy"
    assert refused.value.headers == {"Retry-After": "1"}
    assert admission.refused == 1
    # A refusal claims no turn: the next one, a turn later, is admitted.
    clock.now += 0.1
    assert admission.turn() == pytest.approx(0.5)


def test_rate_zero_admits_every_set_up_at_once() -> None:
    admission = SetupAdmission(rate_per_s=0.0, max_wait_s=0.0, clock=Clock())
    assert [admission.turn() for _ in range(1000)] == [0.0] * 1000
    assert (admission.waited, admission.refused) == (0, 0)


def test_wait_sleeps_until_the_turn() -> None:
    admission = SetupAdmission(rate_per_s=20.0, max_wait_s=5.0)

    async def three() -> float:
        loop = asyncio.get_running_loop()
        started = loop.time()
        for _ in range(3):  # burst of 1: the third waits two turns of 50 ms
            await admission.wait()
        return loop.time() - started

    assert asyncio.run(three()) >= 0.09


def block_the_loop(seconds: float) -> None:
    """What a burst of set-ups does to the loop: nothing else runs meanwhile."""
    time.sleep(seconds)


def test_a_set_up_waits_while_the_loop_is_behind_then_goes() -> None:
    admission = SetupAdmission(rate_per_s=1000.0, max_wait_s=5.0)

    async def run() -> tuple[bool, float]:
        loop = asyncio.get_running_loop()
        await admission.wait()  # starts the monitor; the loop is calm
        await asyncio.sleep(0.06)
        # Block the loop for 300 ms: the monitor's next tick sees the lag and
        # holds new set-ups back until a tick comes on time again.
        block_the_loop(0.3)
        # A timer after the monitor's (already due): its late tick runs first.
        await asyncio.sleep(0.001)
        held = asyncio.create_task(admission.wait())
        await asyncio.sleep(0)
        behind = not held.done()
        started = loop.time()
        async with asyncio.timeout(5.0):
            await held
        return behind, loop.time() - started

    behind, waited = asyncio.run(run())
    assert behind
    assert waited >= 0.03  # the next tick, on time, let it go


def test_behind_for_longer_than_the_longest_wait_is_refused() -> None:
    admission = SetupAdmission(rate_per_s=1000.0, max_wait_s=0.2)

    async def run() -> None:
        await admission.wait()
        await asyncio.sleep(0.06)
        block_the_loop(0.3)
        await asyncio.sleep(0.001)
        waiter = asyncio.create_task(admission.wait())
        await asyncio.sleep(0)
        block_the_loop(0.3)  # behind again before its wait ends: each tick is late
        await asyncio.sleep(0)
        block_the_loop(0.3)
        await waiter

    with pytest.raises(ServerBusy):
        asyncio.run(run())
    assert admission.refused == 1
