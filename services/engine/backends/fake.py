"""The fake model: deterministic text on a deterministic clock.

Timing follows the seed lesson: a prefill delay, then one token per gap, with
optional think pauses ("after token k, stay silent p ms"). Each token is
scheduled on an absolute timeline from the start of the call, so slow event
loop turns do not accumulate drift into the measurements.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator

from services.engine.backends.base import BackendLoad, FakeTiming, GenerationInput, TokenTracker

# A fixed passage. Two words are multi-byte on purpose: cuts in the middle of a
# UTF-8 character must not corrupt them, and tests can see if they do.
WORDS: tuple[str, ...] = (
    "the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "while", "a",
    "naïve", "café", "owner", "counts", "tokens", "one", "by", "one", "—", "streaming",
    "them", "as", "soon", "as", "each", "is", "ready",
)


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


def answer_length(request: GenerationInput) -> int:
    return min(request.timing.answer_tokens, request.max_tokens)


class FakeModel:
    name = "fake"
    defers_acceptance = False
    max_concurrency: int | None = None

    async def generate(
        self, request: GenerationInput, tracker: TokenTracker
    ) -> AsyncGenerator[str, None]:
        start = time.monotonic()
        for index, offset in enumerate(schedule(request.timing, answer_length(request))):
            delay = start + offset - time.monotonic()
            # A cancel lands here (CancelledError out of sleep): the next decode
            # step never happens, so nothing is generated after the cancel.
            await asyncio.sleep(max(0.0, delay))
            tracker.generated()
            yield token_text(index)

    def finished_by_length(self, request: GenerationInput, produced: int) -> bool:
        return request.timing.answer_tokens > request.max_tokens and produced >= request.max_tokens

    def load(self) -> BackendLoad:
        return BackendLoad()  # a clock, not a device

    async def aclose(self) -> None:
        pass
