"""The fake model: deterministic text on a deterministic clock.

Timing follows a real model's shape: a prefill delay, then one token per gap, with
optional think pauses ("after token k, stay silent p ms"). Each token is
scheduled on an absolute timeline from the start of the call, so slow event
loop turns do not accumulate drift into the measurements.

Two clocks make the tokens (the request's `clock`, else STREAMLAB_FAKE_CLOCK):

  batched     (the default) one DecodeClock steps every running generation
              together, as continuous batching does (decode_clock.py). A
              request's gap maps onto it so: token i is due on its own
              timeline (prefill, then a gap per token, plus pauses), rounded
              up to the next multiple of the gap in the engine's loop time, and
              it is made on the first step at or after that. Rounding puts
              every generation with the same gap on the same steps: 100
              streams at a 20 ms gap are one step every 20 ms, not 100 timers.
              The first token comes at most one gap later than on its own
              timeline; the gaps after it are exact (pauses round up too). A
              step time of the engine's own (`step_ms`) is a floor under
              every gap.
  per_stream  a timer per generation, each token its own wake-up.

Offered tools (and a tool_choice that is not "none"), it answers with tool
calls instead of text (tool_calls.py): the request's `tool_calls` of them
(default one), each delta one decode step on the same clock as a token. After
a tool's result (the last message's role is "tool") it answers text, unless
tool_choice requires a call.

The timing is this backend's own option: read from the request's
`FakeModelTiming` (each unset field from STREAMLAB_FAKE_*) by `options()`, so
the engine's backend-neutral GenerationInput carries none of it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Literal

from services.engine.backends import tool_calls
from services.engine.backends.base import (
    BackendLoad,
    GenerationInput,
    InvalidRequest,
    StepObserver,
    TokenTracker,
    ToolCallPiece,
)
from services.engine.backends.decode_clock import SLACK_S, DecodeClock
from services.engine.settings import FakeModelDefaults
from streamlab_protocol.engine.v1 import engine_pb2 as pb

# A fixed passage. Two words are multi-byte on purpose: cuts in the middle of a
# UTF-8 character must not corrupt them, and tests can see if they do.
WORDS: tuple[str, ...] = (
    "the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "while", "a",
    "naïve", "café", "owner", "counts", "tokens", "one", "by", "one", "—", "streaming",
    "them", "as", "soon", "as", "each", "is", "ready",
)


Clock = Literal["batched", "per_stream"]
_CLOCKS: dict[int, Clock] = {pb.FAKE_CLOCK_BATCHED: "batched",
                             pb.FAKE_CLOCK_PER_STREAM: "per_stream"}


@dataclass(frozen=True)
class FakeTiming:
    prefill_ms: int
    token_gap_ms: int
    answer_tokens: int
    pauses: tuple[ThinkPause, ...] = ()
    clock: Clock = "batched"
    tool_calls: int = 1  # how many calls to make when tools are offered


@dataclass(frozen=True)
class ThinkPause:
    """After token `after_token` (0-based), `pause_ms` more of silence."""

    after_token: int
    pause_ms: int


def read_timing(request: pb.GenerateRequest, defaults: FakeModelDefaults) -> FakeTiming:
    """The request's timing, each field it leaves unset from the defaults."""
    wire = request.timing if request.HasField("timing") else pb.FakeModelTiming()
    timing = FakeTiming(
        prefill_ms=wire.prefill_ms if wire.HasField("prefill_ms") else defaults.prefill_ms,
        token_gap_ms=(
            wire.token_gap_ms if wire.HasField("token_gap_ms") else defaults.token_gap_ms
        ),
        answer_tokens=(
            wire.answer_tokens if wire.HasField("answer_tokens") else defaults.answer_tokens
        ),
        pauses=tuple(ThinkPause(p.after_token, p.pause_ms) for p in wire.pauses),
        clock=_CLOCKS.get(wire.clock, defaults.clock),
        tool_calls=wire.tool_calls if wire.HasField("tool_calls") else 1,
    )
    if timing.tool_calls == 0:
        raise InvalidRequest("timing.tool_calls must be at least 1")
    if timing.answer_tokens == 0:
        raise InvalidRequest("timing.answer_tokens must be at least 1")
    return timing


def calls_tools(request: GenerationInput) -> bool:
    """Whether the fake model answers with tool calls: tools are offered and
    either a call is required or the conversation does not end in a tool's
    result (as a model answers the results of its calls in text, so a
    client's call-then-answer loop ends)."""
    if not request.tools:
        return False
    answered = bool(request.messages) and request.messages[-1].role == "tool"
    return request.tool_required or not answered


def token_text(index: int) -> str:
    return WORDS[index % len(WORDS)] + " "


def schedule(timing: FakeTiming, count: int) -> list[float]:
    """Offsets in seconds, from the start of the call, at which each token is ready.

    Token 0 is ready after prefill + one gap (the first decode step); each later
    token one gap after the previous, plus any pause set after the previous one
    (`after_token` is the 0-based index of the token the pause follows).
    """
    pauses: dict[int, int] = {}
    for pause in timing.pauses:
        pauses[pause.after_token] = pauses.get(pause.after_token, 0) + pause.pause_ms
    offsets: list[float] = []
    at_ms = float(timing.prefill_ms)
    for index in range(count):
        at_ms += timing.token_gap_ms + pauses.get(index - 1, 0)
        offsets.append(at_ms / 1000.0)
    return offsets


def on_grid(at: float, gap_s: float) -> float:
    """`at` rounded up to the next multiple of the gap: the step every generation
    with this gap shares (a due time within the clock's slack counts as on it)."""
    if gap_s <= 0:
        return at
    return math.ceil((at - SLACK_S) / gap_s) * gap_s


class FakeModel:
    name = "fake"
    defers_acceptance = False
    max_concurrency: int | None = None
    calls_tools = True

    def __init__(self, defaults: FakeModelDefaults) -> None:
        self._defaults = defaults
        self._clock: DecodeClock | None = None  # made in the engine's loop, on first use
        self._step_observer: StepObserver | None = None

    @property
    def clock(self) -> DecodeClock:
        if self._clock is None:
            self._clock = DecodeClock(self._defaults.step_ms, self._defaults.step_per_sequence_ms)
            self._clock.on_step = self._step_observer
        return self._clock

    def observe_steps(self, observer: StepObserver) -> None:
        self._step_observer = observer
        if self._clock is not None:
            self._clock.on_step = observer

    def options(self, request: pb.GenerateRequest) -> FakeTiming:
        return read_timing(request, self._defaults)

    def generate(
        self, request: GenerationInput, timing: FakeTiming, tracker: TokenTracker
    ) -> AsyncGenerator[str | list[str] | ToolCallPiece, None]:
        if calls_tools(request):
            return self._tool_calls(request, timing, tracker)
        if timing.clock == "per_stream":
            return self._own_timer(request, timing, tracker)
        return self._batched(request, timing, tracker)

    async def _tool_calls(
        self, request: GenerationInput, timing: FakeTiming, tracker: TokenTracker
    ) -> AsyncGenerator[ToolCallPiece, None]:
        """The tool-call answer: one delta per decode step, on the timing's clock
        (answer_tokens and max_tokens do not cut it: a call's JSON stays whole)."""
        calls = tool_calls.plan(request.tools, request.forced_tool, timing.tool_calls,
                                request.request_id)
        pieces = tool_calls.deltas(calls)
        steps = (self._own_timer(request, timing, tracker, len(pieces))
                 if timing.clock == "per_stream"
                 else self._batched(request, timing, tracker, len(pieces)))
        taken = 0
        async with aclosing(steps) as made:
            async for step in made:
                for _ in (step if isinstance(step, list) else (step,)):
                    yield pieces[taken]
                    taken += 1

    async def _batched(
        self, request: GenerationInput, timing: FakeTiming, tracker: TokenTracker,
        count: int | None = None,
    ) -> AsyncGenerator[str | list[str], None]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        if count is None:
            count = min(timing.answer_tokens, request.max_tokens)
        gap_s = timing.token_gap_ms / 1000
        dues = [on_grid(start + offset, gap_s) for offset in schedule(timing, count)]
        # Prefill: the generation takes its seat at the step after it.
        await asyncio.sleep(timing.prefill_ms / 1000)
        with self.clock.seat(dues, token_text, tracker.generated) as seat:
            taken = 0
            while taken < count:
                # A cancel lands here: the seat closes before the next step.
                texts = await seat.take()
                taken += len(texts)
                yield texts[0] if len(texts) == 1 else texts

    async def _own_timer(
        self, request: GenerationInput, timing: FakeTiming, tracker: TokenTracker,
        count: int | None = None,
    ) -> AsyncGenerator[str, None]:
        start = time.monotonic()
        if count is None:
            count = min(timing.answer_tokens, request.max_tokens)
        for index, offset in enumerate(schedule(timing, count)):
            delay = start + offset - time.monotonic()
            # A cancel lands here (CancelledError out of sleep): the next decode
            # step never happens, so nothing is generated after the cancel.
            await asyncio.sleep(max(0.0, delay))
            tracker.generated()
            yield token_text(index)

    def finished_by_length(
        self, request: GenerationInput, timing: FakeTiming, produced: int
    ) -> bool:
        if calls_tools(request):
            return False  # a tool-call answer is never cut (see _tool_calls)
        return timing.answer_tokens > request.max_tokens and produced >= request.max_tokens

    def load(self) -> BackendLoad:
        clock = self._clock  # a clock, not a device
        if clock is None:
            return BackendLoad()
        return BackendLoad(decode_steps=clock.steps, decode_step_tokens=clock.tokens)

    async def aclose(self) -> None:
        if self._clock is not None:
            await self._clock.aclose()
