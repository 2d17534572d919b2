"""Waiting for something to become true, with a deadline: the one helper the
tests use instead of sleeps and hand-rolled `while time.monotonic() < deadline`
loops.

    record = wait_until(lambda: ended(lab, rid), timeout_s=5, what=f"{rid} to end")
    stats = await wait_until_async(gateway_metrics, timeout_s=5, what="the cancel counted")

The predicate is asked at once and then every `interval_s` until it returns a
truthy value, which is returned (so a probe can hand back what it found). At
the deadline the wait fails with an AssertionError that names what it waited
for and the last value the predicate returned: a red test says what never
happened and what was there instead. A predicate that raises ends the wait
with its exception; catch inside the predicate what "not yet" may raise.
A predicate typed `X | None` gives an `X`: the wait never returns the None.

`wait_until_async` takes a coroutine function or a plain function and sleeps
with `asyncio.sleep`, so the event loop (an in-process gateway or engine, a
stream being read) runs while it waits.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")

# Short against the waits it serves (a stream's token gap is 50 ms, a process
# start a second), long enough that polling a lab costs it nothing measurable.
DEFAULT_INTERVAL_S = 0.05


def _timed_out(what: str, timeout_s: float, last: object) -> AssertionError:
    return AssertionError(f"not within {timeout_s:g} s: {what} (last seen: {last!r})")


def wait_until(predicate: Callable[[], T | None], *, timeout_s: float, what: str,
               interval_s: float = DEFAULT_INTERVAL_S) -> T:
    """Call `predicate` until it returns something truthy and return that;
    raise AssertionError naming `what` and the last value after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            raise _timed_out(what, timeout_s, value)
        time.sleep(min(interval_s, left))


@overload
async def wait_until_async(predicate: Callable[[], Awaitable[T | None]], *, timeout_s: float,
                           what: str, interval_s: float = ...) -> T: ...
@overload
async def wait_until_async(predicate: Callable[[], T | None], *, timeout_s: float,
                           what: str, interval_s: float = ...) -> T: ...
async def wait_until_async(predicate: Callable[[], object], *, timeout_s: float, what: str,
                           interval_s: float = DEFAULT_INTERVAL_S) -> object:
    """`wait_until` for async tests: `predicate` may be a coroutine function,
    and the wait yields to the event loop between tries. The deadline bounds an
    awaited try too: a probe that hangs (a page that stopped answering) fails
    the wait at the deadline instead of hanging the test."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    value: object = None
    while True:
        attempt = predicate()
        if inspect.isawaitable(attempt):
            bound = asyncio.timeout_at(deadline)
            try:
                async with bound:
                    attempt = await attempt
            except TimeoutError:
                if not bound.expired():
                    raise  # the probe's own timeout: its error, not the wait's
                raise _timed_out(what, timeout_s, value) from None
        value = attempt
        if value:
            return value
        left = deadline - loop.time()
        if left <= 0:
            raise _timed_out(what, timeout_s, value)
        await asyncio.sleep(min(interval_s, left))
