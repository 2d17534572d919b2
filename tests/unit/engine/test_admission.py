"""The engine's admission: N generations at once, the rest wait FIFO up to a
bound, past it refused; a waiter whose caller leaves is removed at once (the
hf backend's whole concurrency policy rests on this, with N = 1)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from services.engine.admission import Admission
from tests.wait import wait_until_async

pytestmark = pytest.mark.anyio


async def until(condition: Callable[[], bool], what: str) -> None:
    # Admission is in-process state: a wait is a few turns of the loop (no
    # interval), bounded in case a waiter is never woken.
    await wait_until_async(condition, timeout_s=2.0, interval_s=0, what=what)


async def hold(admission: Admission, name: str, order: list[str], release: asyncio.Event) -> None:
    await admission.acquire()
    try:
        order.append(name)
        await release.wait()
    finally:
        admission.release()


async def test_one_runs_the_others_wait_in_arrival_order() -> None:
    admission = Admission(running=1, queued=8)
    order: list[str] = []
    releases = {name: asyncio.Event() for name in "abc"}
    tasks = [asyncio.create_task(hold(admission, "a", order, releases["a"]))]
    await until(lambda: order == ["a"], "order == ['a']")
    assert not admission.full()
    assert admission.would_wait()
    tasks.append(asyncio.create_task(hold(admission, "b", order, releases["b"])))
    await until(lambda: admission.waiting == 1, "admission.waiting == 1")
    tasks.append(asyncio.create_task(hold(admission, "c", order, releases["c"])))
    await until(lambda: admission.waiting == 2, "admission.waiting == 2")
    assert order == ["a"]

    releases["a"].set()
    await until(lambda: order == ["a", "b"], "order == ['a', 'b']")
    assert admission.waiting == 1
    releases["b"].set()
    await until(lambda: order == ["a", "b", "c"], "order == ['a', 'b', 'c']")
    releases["c"].set()
    await asyncio.gather(*tasks)
    assert (admission.waiting, admission.running) == (0, 0)


async def test_a_full_queue_is_full() -> None:
    admission = Admission(running=1, queued=1)
    order: list[str] = []
    release = asyncio.Event()
    tasks = [asyncio.create_task(hold(admission, "a", order, release))]
    await until(lambda: order == ["a"], "order == ['a']")
    tasks.append(asyncio.create_task(hold(admission, "b", order, release)))
    await until(lambda: admission.waiting == 1, "admission.waiting == 1")
    assert admission.full()
    assert "1/1 queued" in admission.describe()
    release.set()
    await asyncio.gather(*tasks)
    assert not admission.full()


async def test_a_cancelled_waiter_leaves_the_queue_and_never_runs() -> None:
    admission = Admission(running=1, queued=4)
    order: list[str] = []
    release = asyncio.Event()
    running = asyncio.create_task(hold(admission, "a", order, release))
    await until(lambda: order == ["a"], "order == ['a']")
    leaver = asyncio.create_task(hold(admission, "leaver", order, release))
    stayer = asyncio.create_task(hold(admission, "stayer", order, release))
    await until(lambda: admission.waiting == 2, "admission.waiting == 2")

    leaver.cancel()
    await until(lambda: admission.waiting == 1, "admission.waiting == 1")
    release.set()
    await asyncio.gather(running, stayer)
    assert leaver.cancelled()
    assert order == ["a", "stayer"]
    assert (admission.waiting, admission.running) == (0, 0)
