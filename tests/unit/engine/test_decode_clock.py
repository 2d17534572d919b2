"""The batched decode clock: one step for every running sequence, one token per
sequence per step, a consumer that is behind gets what piled up in one take
(and pauses its sequence past a bound), and a cancel removes the sequence
before the next step."""

from __future__ import annotations

import asyncio

import pytest

from services.engine.backends.base import GenerationInput
from services.engine.backends.decode_clock import DecodeClock
from services.engine.backends.fake import FakeModel, FakeTiming, on_grid, token_text
from services.engine.settings import FakeModelDefaults

pytestmark = pytest.mark.anyio


class Counter:
    def __init__(self, until: int = 0) -> None:
        self.made = 0
        self.until = until
        self.reached = asyncio.Event()  # set when `until` tokens were made

    def generated(self) -> None:
        self.made += 1
        if self.made >= self.until:
            self.reached.set()


async def drain(clock: DecodeClock, dues: list[float], counter: Counter) -> list[str]:
    texts: list[str] = []
    with clock.seat(dues, token_text, counter.generated) as seat:
        while len(texts) < len(dues):
            texts += await seat.take()
    return texts


async def test_sequences_due_together_share_every_step() -> None:
    clock = DecodeClock()
    now = asyncio.get_running_loop().time()
    dues = [now + 0.002 * (i + 1) for i in range(10)]
    counters = [Counter() for _ in range(20)]
    results = await asyncio.gather(*(drain(clock, dues, c) for c in counters))
    assert all(texts == [token_text(i) for i in range(10)] for texts in results)
    assert clock.tokens == 200
    assert clock.steps == 10  # 20 sequences, one step per token index
    assert clock.running == 0


async def test_one_token_per_sequence_per_step_even_when_all_are_overdue() -> None:
    clock = DecodeClock()
    counter = Counter()
    texts = await drain(clock, [0.0] * 5, counter)
    assert texts == [token_text(i) for i in range(5)]
    assert clock.steps == 5
    assert counter.made == 5


async def test_a_consumer_that_is_behind_takes_what_piled_up_at_once_then_its_sequence_pauses(
) -> None:
    clock = DecodeClock()
    counter = Counter(until=1 + 8)
    dues = [0.0] * 100
    with clock.seat(dues, token_text, counter.generated, max_ready=8) as seat:
        first = await seat.take()
        await counter.reached.wait()  # the consumer is busy elsewhere; the clock steps on
        for _ in range(20):  # more steps' worth of turns: a full hand pauses the sequence
            await asyncio.sleep(0)
        assert counter.made == 1 + 8
        behind = await seat.take()
        assert behind == [token_text(i) for i in range(1, 9)]
        rest: list[str] = []
        while len(first) + len(behind) + len(rest) < 100:
            rest += await seat.take()
    assert first + behind + rest == [token_text(i) for i in range(100)]
    assert counter.made == 100


async def test_a_cancelled_sequence_leaves_before_the_next_step() -> None:
    clock = DecodeClock()
    other, cancelled = Counter(), Counter(until=3)
    now = asyncio.get_running_loop().time()
    dues = [now + 0.005 * (i + 1) for i in range(400)]
    running = asyncio.create_task(drain(clock, dues[:6], other))
    victim = asyncio.create_task(drain(clock, dues, cancelled))
    await cancelled.reached.wait()
    victim.cancel()
    made_at_cancel = cancelled.made
    await asyncio.gather(victim, return_exceptions=True)
    await running
    assert cancelled.made - made_at_cancel <= 1
    assert other.made == 6
    assert clock.running == 0


def test_the_step_grows_with_the_batch() -> None:
    clock = DecodeClock(step_ms=10, step_per_sequence_ms=0.5)
    assert clock.step_s() == pytest.approx(0.010)
    clock.running = 40
    assert clock.step_s() == pytest.approx(0.030)


async def test_a_step_of_its_own_is_a_floor_under_the_gap() -> None:
    clock = DecodeClock(step_ms=5)
    loop = asyncio.get_running_loop()
    counter = Counter()
    start = loop.time()
    await drain(clock, [0.0] * 4, counter)  # due at once: only the step paces them
    assert loop.time() - start >= 3 * 0.005 - 0.001


def test_the_same_gap_lands_on_the_same_steps() -> None:
    assert on_grid(1.003, 0.02) == pytest.approx(1.02)
    assert on_grid(1.019, 0.02) == pytest.approx(1.02)
    assert on_grid(1.0201, 0.02) == pytest.approx(1.02)  # within the slack: on it
    assert on_grid(1.003, 0.0) == 1.003


async def test_the_fake_model_on_the_batched_clock_says_the_same_text_as_on_its_own_timer(
) -> None:
    model = FakeModel(FakeModelDefaults())
    request = GenerationInput(request_id="r", prompt="p", messages=(), max_tokens=7)
    texts: dict[str, list[str]] = {}
    for clock in ("batched", "per_stream"):
        timing = FakeTiming(prefill_ms=0, token_gap_ms=1, answer_tokens=10, clock=clock)
        counter = Counter()
        out: list[str] = []
        async for item in model.generate(request, timing, counter):
            assert isinstance(item, str | list)  # no tools offered: text only
            out += item if isinstance(item, list) else [item]
        texts[clock] = out
        assert counter.made == 7
    assert texts["batched"] == texts["per_stream"] == [token_text(i) for i in range(7)]
    await model.aclose()


async def test_the_step_observer_sees_each_step_its_batch_and_its_spacing() -> None:
    """What the engine's /metrics records: one call per step, batches adding up
    to every token made, and no interval for a busy spell's first step."""
    clock = DecodeClock()
    seen: list[tuple[float | None, int]] = []
    clock.on_step = lambda interval, batch: seen.append((interval, batch))
    now = asyncio.get_running_loop().time()
    dues = [now + 0.01 * (i + 1) for i in range(5)]
    await asyncio.gather(*(drain(clock, dues, Counter()) for _ in range(4)))
    assert [batch for _, batch in seen] == [4] * 5
    assert seen[0][0] is None
    intervals = [interval for interval, _ in seen[1:] if interval is not None]
    assert len(intervals) == 4
    # Four 10 ms steps apart (less what a late first step ate into the next).
    assert 0.03 <= sum(intervals) <= 0.5, intervals
