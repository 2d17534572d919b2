"""tests/wait.py: a wait returns the predicate's first truthy value, and a
timeout fails naming what it waited for and the last value seen."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from tests.wait import wait_until, wait_until_async


def answers(*values: object) -> tuple[Callable[[], object], list[object]]:
    """A predicate that returns `values` one by one (the last one forever),
    and the list of what it returned so far."""
    seen: list[object] = []

    def predicate() -> object:
        value = values[min(len(seen), len(values) - 1)]
        seen.append(value)
        return value
    return predicate, seen


def test_a_truthy_first_answer_returns_at_once_without_a_second_call() -> None:
    predicate, seen = answers({"state": "ended"})
    started = time.monotonic()
    assert wait_until(predicate, timeout_s=5, what="x", interval_s=1.0) == {"state": "ended"}
    assert seen == [{"state": "ended"}]
    assert time.monotonic() - started < 0.5  # no interval slept


def test_falsy_answers_are_not_yet_and_the_first_truthy_one_is_returned() -> None:
    predicate, seen = answers(0, None, [], 7, 8)
    assert wait_until(predicate, timeout_s=5, what="x", interval_s=0.001) == 7
    assert seen == [0, None, [], 7]


def test_a_timeout_names_what_it_waited_for_and_the_last_value() -> None:
    predicate, seen = answers(None, 0, [])
    started = time.monotonic()
    with pytest.raises(AssertionError) as failure:
        wait_until(predicate, timeout_s=0.2, what="the engine to go idle", interval_s=0.02)
    took = time.monotonic() - started
    message = str(failure.value)
    assert "the engine to go idle" in message
    assert "0.2 s" in message
    assert "last seen: []" in message
    assert len(seen) >= 3  # it kept asking until the deadline
    # The deadline holds from both sides: not early, and not an interval or
    # a scheduler hiccup (generous on a loaded machine) past it.
    assert 0.2 <= took < 1.5


def test_the_wait_never_sleeps_past_its_deadline() -> None:
    predicate, _ = answers(False)
    started = time.monotonic()
    with pytest.raises(AssertionError):
        wait_until(predicate, timeout_s=0.1, what="x", interval_s=10.0)
    assert time.monotonic() - started < 2.0  # one 10 s interval would overshoot


def test_an_exception_in_the_predicate_ends_the_wait_with_it() -> None:
    def predicate() -> bool:
        raise ConnectionRefusedError("no lab")
    with pytest.raises(ConnectionRefusedError):
        wait_until(predicate, timeout_s=5, what="x")


@pytest.mark.anyio
async def test_the_async_twin_awaits_a_coroutine_predicate() -> None:
    calls = 0

    async def predicate() -> str:
        nonlocal calls
        calls += 1
        return "ready" if calls == 3 else ""
    assert await wait_until_async(predicate, timeout_s=5, what="x", interval_s=0.001) == "ready"
    assert calls == 3


@pytest.mark.anyio
async def test_the_async_twin_lets_the_loop_run_between_tries() -> None:
    # A plain predicate whose answer another task sets: it is only ever seen
    # if the wait yields to the loop instead of blocking it.
    flag: list[str] = []

    async def set_later() -> None:
        await asyncio.sleep(0.05)
        flag.append("set")
    task = asyncio.create_task(set_later())
    assert await wait_until_async(lambda: flag, timeout_s=5, what="the flag") == ["set"]
    await task


@pytest.mark.anyio
async def test_the_async_twin_times_out_with_the_last_value() -> None:
    async def predicate() -> dict[str, int]:
        return {}
    expected = r"not within 0.1 s: the job to expire \(last seen: \{\}\)"
    with pytest.raises(AssertionError, match=expected):
        await wait_until_async(predicate, timeout_s=0.1, what="the job to expire")


@pytest.mark.anyio
async def test_the_async_twin_bounds_a_probe_that_hangs() -> None:
    calls = 0

    async def predicate() -> bool:
        nonlocal calls
        calls += 1
        if calls == 1:
            return False
        await asyncio.Event().wait()  # never set: a page that stopped answering
        return True
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"the page \(last seen: False\)"):
        await wait_until_async(predicate, timeout_s=0.3, what="the page", interval_s=0.01)
    assert time.monotonic() - started < 2.0


@pytest.mark.anyio
async def test_a_probes_own_timeout_is_its_error_not_the_waits() -> None:
    async def predicate() -> bool:
        raise TimeoutError("the probe's own")
    with pytest.raises(TimeoutError, match="the probe's own"):
        await wait_until_async(predicate, timeout_s=5, what="x")
