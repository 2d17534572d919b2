"""Set-up admission: a burst of new streams must not starve the streams already
running.

Every new engine call (EngineLease.open) passes `SetupAdmission.wait()` once
it holds its slot and before it opens the engine call. The admission is a
token bucket on set-ups (`admission_rate_per_s`, a burst of 50 ms worth): a
set-up beyond the rate waits its turn, first come first served, rather than
running at once. Waiting is one timer; a set-up is the engine call, its
accept, the response head and the SSE task: about 2 ms of the gateway's CPU
and 3 ms more in the engine and the hops (docs/cost.md). On a 2-core machine a ramp of 500
new streams a second is more set-up than the cores can run, and without
admission the set-ups and the running streams' tokens and heartbeats share
one event loop in arrival order: every running stream's next write waits
behind the whole backlog (`streamlab bench scale`, cell c, measures it), and
the new ones wait past the engine's accept deadline (504).

The rate alone cannot know what the machine leaves the gateway: on a shared
2-core machine the gateway may get a quarter of a core, and a rate it could
hold alone is four times too much. So a set-up also waits while the event
loop is behind: a monitor sleeps 50 ms at a time and notes how late it woke
(the loop's lag: everything runnable ahead of it, or the process not being
scheduled at all); while the lag is over 100 ms, new set-ups wait for a
calm tick, and the running streams' writes go first. Then each takes its
turn in the bucket, so a calm tick after a stall does not release them all
at once.

A set-up whose turn is more than `admission_max_wait_s` away (calm and turn
together) is refused: 503 `server_busy` with Retry-After (the queue's
length, whole seconds), before anything was started for it. The queue is
virtual (the next free turn, GCRA): O(1) per request, and a waiter that
leaves (its client disconnected) only wastes its turn.

`admission_rate_per_s: 0` turns it off: every set-up runs as it arrives (the
broken mode the bench shows beside it).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from services.gateway.errors import GatewayError

# The burst a bucket lets through at once, as a share of a second's rate: a
# few streams arriving together are not spaced out, a ramp is.
BURST_S = 0.05
# The loop-lag monitor's period, and the lag past which set-ups wait.
TICK_S = 0.05
MAX_LAG_S = 0.1


class ServerBusy(GatewayError):
    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(503, "server_busy", message,
                         headers={"Retry-After": str(retry_after_s)})


class SetupAdmission:
    """A token bucket on stream set-ups with a bounded wait (see the module)."""

    def __init__(self, rate_per_s: float, max_wait_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate_per_s = rate_per_s
        self.max_wait_s = max_wait_s
        self._clock = clock
        self._interval = 1.0 / rate_per_s if rate_per_s > 0 else 0.0
        # How far ahead of now the next turn may be and still run at once.
        self._tolerance = max(0.0, (math.ceil(rate_per_s * BURST_S) - 1) * self._interval)
        self._next_turn = 0.0  # the theoretical arrival time of the next set-up
        self.waited = 0  # set-ups that waited for their turn
        self.refused = 0
        self.lag_s = 0.0  # the loop's lag at the monitor's last tick
        self._calm: asyncio.Event | None = None
        self._monitor: asyncio.Task[None] | None = None

    def turn(self, waited_s: float = 0.0) -> float:
        """Claim the next turn: seconds to wait for it (0: now). ServerBusy when
        it is past `max_wait_s` after `waited_s` already spent (no turn claimed)."""
        if self._interval == 0.0:
            return 0.0
        now = self._clock()
        start = max(self._next_turn, now)
        delay = start - self._tolerance - now
        if delay < 1e-6:  # within the burst (the turns' sums carry float error)
            delay = 0.0
        if waited_s + delay > self.max_wait_s:
            self.refused += 1
            raise ServerBusy(f"too many new streams: over {self.rate_per_s:g}/s with "
                             f"{delay:.1f} s of set-ups queued on this gateway",
                             max(1, math.ceil(delay)))
        self._next_turn = start + self._interval
        if delay > 0:
            self.waited += 1
        return delay

    async def wait(self) -> None:
        """Wait for a calm loop, then for the set-up's turn (see the module)."""
        if self._interval == 0.0:
            return
        calm = self._watch()
        waited = 0.0
        if not calm.is_set():
            loop = asyncio.get_running_loop()
            started = loop.time()
            try:
                await asyncio.wait_for(calm.wait(), self.max_wait_s)
            except TimeoutError:
                self.refused += 1
                raise ServerBusy("the gateway is behind on its running streams: no new "
                                 "stream set up for now", max(1, math.ceil(self.max_wait_s))
                                 ) from None
            waited = loop.time() - started
        delay = self.turn(waited)
        if delay > 0:
            await asyncio.sleep(delay)

    def _watch(self) -> asyncio.Event:
        """The calm event, set while the loop's lag is under MAX_LAG_S; starts
        the monitor on first use (in the serving loop)."""
        if self._calm is None:
            self._calm = asyncio.Event()
            self._calm.set()
            self._monitor = asyncio.get_running_loop().create_task(self._measure(self._calm))
        return self._calm

    async def _measure(self, calm: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(TICK_S)
            self.lag_s = loop.time() - before - TICK_S
            if self.lag_s > MAX_LAG_S:
                calm.clear()
            else:
                calm.set()
