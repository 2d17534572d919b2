"""Timing: the one set of time constants scenarios and benches share."""

from __future__ import annotations

import pytest

from streamlab.experiments.timing import Timing


def test_the_fake_models_pace_in_the_requests_own_names() -> None:
    timing = Timing(prefill_ms=1, gap_ms=50, tokens=3)
    assert timing.fake_model() == {"prefill_ms": 1, "token_gap_ms": 50, "answer_tokens": 3}


def test_token_times_follow_prefill_then_one_gap_per_token() -> None:
    timing = Timing(prefill_ms=300, gap_ms=50, tokens=3)
    assert timing.model_token_times_s() == pytest.approx([0.35, 0.4, 0.45])
    assert timing.model_ttft_s == pytest.approx(timing.model_token_times_s()[0])
    assert timing.model_total_s == pytest.approx(0.45)
