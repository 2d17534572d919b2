from __future__ import annotations

import functools
import inspect
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from hypothesis import settings

# Property tests draw anew on every local run (more inputs over time), but CI
# (CI=true) replays one fixed set, so a red run can be replayed as it was;
# HYPOTHESIS_PROFILE picks either explicitly. print_blob: a failure prints the
# `@reproduce_failure` line that replays it anywhere.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get(
    "HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI", "").lower() in ("1", "true") else "dev"))


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session", autouse=True)
async def one_event_loop_for_the_session(anyio_backend: str) -> AsyncIterator[None]:
    """Every async test runs on one event loop, which this fixture keeps open
    (anyio's runner lives while a fixture holds it).

    grpc.aio polls one completion queue for every loop that ever used it, and
    hands each event to the loop its call was made on. With a loop per test, a
    call of one test that completes after that test's loop closed (a stream's
    last status, a channel's close) reaches `call_soon_threadsafe` on a closed
    loop, inside whichever test runs next: `RuntimeError: Event loop is closed`
    failed an unrelated test in CI twice. On one loop a late event lands on a
    live loop and is handled."""
    yield  # noqa: PT022 (the yield is the point: the runner lives while it waits)


def _outcomes_unwrapped(test: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(test)
    async def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return await test(*args, **kwargs)
        except BaseExceptionGroup as group:
            # pytest.fail/skip inside a task group arrive grouped: a BaseException
            # that is not an OutcomeException, which ends anyio's runner task, and
            # on the one loop of the session every later async test then errors
            # (ClosedResourceError: 60 tests after one failure in a compose run).
            # Pass on the outcome itself, which the runner reports and survives.
            first = _first_outcome(group)
            if first is None:
                raise
            raise first from group

    return run


def _first_outcome(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    from _pytest.outcomes import OutcomeException

    for exc in group.exceptions:
        if isinstance(exc, OutcomeException):
            return exc
        if isinstance(exc, BaseExceptionGroup) and (inner := _first_outcome(exc)) is not None:
            return inner
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if isinstance(item, pytest.Function) and inspect.iscoroutinefunction(item.obj):
            item.obj = _outcomes_unwrapped(item.obj)
