"""One decode clock for every running generation, as continuous batching runs a GPU.

A real engine (vLLM, TGI) does not run a timer per request: it runs one step
at a time over the whole batch, and each step makes one token for every
running sequence. The fake model does the same here, so the tokens of one
step leave the engine together: one wake-up of the engine, of the gRPC hop
and of everything behind it, instead of one per stream.

    DecodeClock  one task per engine, alive while some sequence waits for a step
    Seat         one running sequence, from the end of its prefill to its end:
                 the clock makes its tokens, `await seat.take()` hands over all
                 that are ready (one, or several when the consumer was behind)

When the steps happen (loop time, seconds):

    next step = max(previous step + step_s(running), earliest due of a seated sequence)
    step_s(running) = step_ms + step_per_sequence_ms x running      (a GPU step's shape)

Every seated sequence whose next token is due by then gets it in that step,
one token per sequence per step. With `step_ms` 0 the clock steps when some
sequence is due, so a request's own pace (the fake model's gap) decides; with
a step of its own, a sequence cannot go faster than the step, and the step
slows as the batch grows.

A consumer that is behind (gRPC flow control holds its `yield`) does not stop
its sequence at once: the tokens made meanwhile wait in the seat, up to
`max_ready`, and leave together (several tokens in one gRPC message). Past
that bound the sequence sits out the steps until its consumer takes them, so
a reader that stops reading still pauses its own generation and nobody else's.
A cancelled sequence's seat closes before the next step: at most the token of
a step already taken can follow a cancel.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable, Sequence
from types import TracebackType

from services.engine.backends.base import StepObserver

# Due times this close to a step count as reached: timer slack, not a missed step.
SLACK_S = 0.0005
# Tokens a seat holds for a consumer that is behind before its sequence pauses.
MAX_READY = 32


class DecodeClock:
    def __init__(self, step_ms: float = 0.0, step_per_sequence_ms: float = 0.0) -> None:
        self._base_s = step_ms / 1000
        self._per_sequence_s = step_per_sequence_ms / 1000
        self._due: list[tuple[float, int, Seat]] = []
        self._order = itertools.count()
        self._kick: asyncio.Future[None] | None = None
        self._target = float("inf")
        self._task: asyncio.Task[None] | None = None
        self._last_step = float("-inf")
        self.running = 0  # seated sequences
        self.steps = 0
        self.tokens = 0  # made over all steps: tokens / steps is the mean batch
        self.on_step: StepObserver | None = None  # the engine's /metrics

    def step_s(self) -> float:
        return self._base_s + self._per_sequence_s * self.running

    def seat(self, dues: Sequence[float], text: Callable[[int], str],
             made: Callable[[], None], max_ready: int = MAX_READY) -> Seat:
        """A sequence whose token i is due at `dues[i]` (loop time), its text
        `text(i)`; `made()` is called at the step that makes each token."""
        return Seat(self, dues, text, made, max_ready)

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # ---- used by Seat ----------------------------------------------------------------
    def _schedule(self, seat: Seat, due: float) -> None:
        heapq.heappush(self._due, (due, next(self._order), seat))
        seat.scheduled = True
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        elif due < self._target and self._kick is not None and not self._kick.done():
            self._kick.set_result(None)  # earlier than the clock sleeps for

    # ---- the clock -------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        previous: float | None = None  # this busy spell's last step
        while (due := self._earliest()) is not None:
            at = max(self._last_step + self.step_s(), due)
            if at > loop.time() + SLACK_S:
                await self._sleep_until(loop, at)
                continue  # a sequence may have joined with an earlier due
            now = loop.time()
            stepped = self._step(at, now)
            if self.on_step is not None:
                self.on_step(None if previous is None else now - previous, stepped)
            previous = now
            # Let the consumers run (and take their tokens) before the next step.
            await asyncio.sleep(0)
        self._task = None

    def _earliest(self) -> float | None:
        due = self._due
        while due and due[0][2].closed:  # its sequence ended or was cancelled
            heapq.heappop(due)[2].scheduled = False
        return due[0][0] if due else None

    async def _sleep_until(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        kick: asyncio.Future[None] = loop.create_future()
        self._kick, self._target = kick, at
        timer = loop.call_at(at, _resolve, kick)
        try:
            await kick
        finally:
            timer.cancel()
            self._kick, self._target = None, float("inf")

    def _step(self, at: float, now: float) -> int:
        # Spaced from when the step was due, so timer lateness does not add up
        # into a slower clock; a step late by more than a whole step counts
        # from now (a late engine does not catch up in a burst).
        self._last_step = at if now - at < self.step_s() else now
        self.steps += 1
        stepped: list[Seat] = []
        due = self._due
        while due and due[0][0] <= now + SLACK_S:
            seat = heapq.heappop(due)[2]
            seat.scheduled = False
            if not seat.closed:
                seat.make()
                stepped.append(seat)
        self.tokens += len(stepped)
        for seat in stepped:  # next tokens go to later steps: one per sequence per step
            seat.schedule_next()
        return len(stepped)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Seat:
    """One sequence's place in the batch. Use it as a context manager: leaving
    (finish, cancel, error) takes it out before the clock's next step."""

    def __init__(self, clock: DecodeClock, dues: Sequence[float], text: Callable[[int], str],
                 made: Callable[[], None], max_ready: int) -> None:
        self._clock = clock
        self._dues = dues
        self._text = text
        self._made = made
        self._max_ready = max(1, max_ready)
        self._next = 0
        self._ready: list[str] = []
        self._waiter: asyncio.Future[None] | None = None
        self.scheduled = False
        self.closed = False

    def __enter__(self) -> Seat:
        self._clock.running += 1
        self.schedule_next()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.closed = True
        self._clock.running -= 1

    async def take(self) -> list[str]:
        """Every token made and not yet taken, waiting for the next one if none is.
        Empty once the sequence has made all its tokens and they were taken."""
        if not self._ready:
            if self._next >= len(self._dues):
                return []
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter  # a cancel lands here: the seat closes before the next step
            finally:
                self._waiter = None
        ready, self._ready = self._ready, []
        if not self.scheduled:
            self.schedule_next()  # it had paused with a full hand
        return ready

    # ---- used by the clock ---------------------------------------------------------------
    def make(self) -> None:
        self._made()
        self._ready.append(self._text(self._next))
        self._next += 1
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def schedule_next(self) -> None:
        if (not self.closed and not self.scheduled and self._next < len(self._dues)
                and len(self._ready) < self._max_ready):
            self._clock._schedule(self, self._dues[self._next])
