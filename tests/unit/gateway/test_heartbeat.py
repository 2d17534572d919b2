"""Every stream's heartbeat on one timer (services/gateway/heartbeat.py): pings
come at the interval, a stream between pings holds no task, a reader that
accepts nothing holds up no other stream's ping and gets no second one, and a
cancelled beat sends nothing more. Each test names the broken shape it catches."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from services.gateway.heartbeat import Heartbeats
from tests.unit.gateway.test_sse_response import SCOPE, Body, Client, response
from tests.wait import wait_until_async

pytestmark = pytest.mark.anyio
INTERVAL_S = 0.05


def counting(pings: list[int], index: int) -> Callable[[], Coroutine[Any, Any, None]]:
    async def ping() -> None:
        pings[index] += 1
    return ping


def no_error(error: BaseException) -> None:
    raise AssertionError(f"no ping should fail here: {error!r}")


async def test_every_beat_pings_at_its_interval_on_one_timer() -> None:
    """Broken: beats lost from the heap after their first ping, or a shorter
    interval's beat starving a longer one (the heap ordered wrongly)."""
    wheel = Heartbeats(asyncio.get_running_loop())
    pings = [0, 0, 0]
    beats = [wheel.add(INTERVAL_S, counting(pings, 0), no_error),
             wheel.add(INTERVAL_S, counting(pings, 1), no_error),
             wheel.add(INTERVAL_S * 2, counting(pings, 2), no_error)]
    await wait_until_async(lambda: pings[2] >= 3, timeout_s=5, what="three slow pings")
    # The fast beats ping about twice as often as the slow one (never fewer than it).
    assert pings[0] >= pings[2]
    assert pings[1] >= pings[2]
    for beat in beats:
        beat.cancel()
    assert len(wheel) == 0


async def test_a_stream_between_pings_holds_no_task() -> None:
    """Broken: a task per stream for its heartbeat (sse-starlette's `_ping`), a
    coroutine frame and a sleep held by every open stream between pings. An
    open response holds two tasks: its own (the body) and the disconnect
    listener (with a task per heartbeat: 61 tasks for 20 streams)."""
    streams = 20
    clients = [Client() for _ in range(streams)]
    bodies = [Body(then_wait=True) for _ in range(streams)]
    hooks: list[str] = []
    before = len(asyncio.all_tasks())
    running = [asyncio.ensure_future(response(body, hooks, ping_s=30)(
        SCOPE, client.receive, client.send)) for body, client in zip(bodies, clients, strict=True)]
    try:
        await wait_until_async(lambda: all(b.started.is_set() for b in bodies), timeout_s=5,
                               what="every body started")
        # At most one more: the loop's shutdown watcher, started by the first stream.
        assert len(asyncio.all_tasks()) - before <= 2 * streams + 1
    finally:
        for client in clients:
            client.leave()
        await asyncio.wait_for(asyncio.gather(*running), 5)
    assert hooks.count("close") == streams


async def test_a_reader_that_accepts_nothing_gets_no_second_ping_and_holds_up_no_other() -> None:
    """Broken: pings sent one after another from one task (a stuck send then
    holds every stream's heartbeat), or a second ping queued behind the stuck
    one each interval."""
    wheel = Heartbeats(asyncio.get_running_loop())
    stuck_sends = [0]
    release = asyncio.Event()

    async def stuck() -> None:
        stuck_sends[0] += 1
        await release.wait()

    pings = [0]
    stuck_beat = wheel.add(INTERVAL_S, stuck, no_error)
    beat = wheel.add(INTERVAL_S, counting(pings, 0), no_error)
    await wait_until_async(lambda: pings[0] >= 5, timeout_s=5, what="five pings past the stuck one")
    assert stuck_sends == [1]
    release.set()
    stuck_beat.cancel()
    beat.cancel()


async def test_a_failed_ping_is_reported_once_and_a_cancelled_beat_sends_nothing() -> None:
    """Broken: a ping's error lost in its task, or pings going on after the
    stream ended (into a closed response)."""
    wheel = Heartbeats(asyncio.get_running_loop())
    errors: list[BaseException] = []
    sends = [0]

    async def failing() -> None:
        sends[0] += 1
        raise OSError("the socket is gone")

    beat = wheel.add(INTERVAL_S, failing, errors.append)
    await wait_until_async(lambda: errors, timeout_s=5, what="the ping's error")
    beat.cancel()  # as the response does when its heartbeat fails
    sent = sends[0]
    pings = [0]
    other = wheel.add(INTERVAL_S, counting(pings, 0), no_error)
    await wait_until_async(lambda: pings[0] >= 3, timeout_s=5, what="three later pings")
    other.cancel()
    assert sends[0] == sent
    assert len(errors) == 1
    assert isinstance(errors[0], OSError)


async def test_beats_of_ended_streams_do_not_pile_up() -> None:
    """Broken: a cancelled beat left in the heap until its turn with nothing to
    bound them: thousands of short streams a second under a long interval."""
    wheel = Heartbeats(asyncio.get_running_loop())
    pings = [0]
    for _ in range(5000):
        wheel.add(3600, counting(pings, 0), no_error).cancel()
    assert len(wheel) == 0
    assert len(wheel._heap) < 1024


async def test_a_cancelled_beat_lets_go_of_its_stream_at_once() -> None:
    """Broken: a cancelled beat, left in the heap until its turn, holding its
    ping and so the response and everything it holds (the body, the lease) for
    up to an interval after the stream ended: at hundreds of short streams a
    second, thousands of dead streams kept."""
    wheel = Heartbeats(asyncio.get_running_loop())

    class Stream:
        async def ping(self) -> None:
            pass

    stream = Stream()
    gone = weakref.ref(stream)
    beat = wheel.add(3600, stream.ping, no_error)
    beat.cancel()
    del stream
    gc.collect()
    assert gone() is None
