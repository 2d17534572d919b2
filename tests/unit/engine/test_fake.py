from __future__ import annotations

import pytest

from services.engine.backends.base import FakeTiming, ThinkPause
from services.engine.backends.fake import schedule


def test_first_token_after_prefill_plus_one_gap_then_one_per_gap() -> None:
    offsets = schedule(FakeTiming(prefill_ms=300, token_gap_ms=50, answer_tokens=3), 3)
    assert offsets == pytest.approx([0.35, 0.40, 0.45])


def test_think_pause_follows_the_named_token() -> None:
    timing = FakeTiming(prefill_ms=0, token_gap_ms=10, answer_tokens=4,
                        pauses=(ThinkPause(after_token=1, pause_ms=1000),))
    assert schedule(timing, 4) == pytest.approx([0.01, 0.02, 1.03, 1.04])
