from __future__ import annotations

import pytest

from services.engine.backends.base import InvalidRequest
from services.engine.backends.fake import FakeModel, FakeTiming, ThinkPause, schedule
from services.engine.settings import FakeModelDefaults
from streamlab_protocol.engine.v1 import engine_pb2 as pb

DEFAULTS = FakeModelDefaults(prefill_ms=300, token_gap_ms=50, answer_tokens=50)


def test_first_token_after_prefill_plus_one_gap_then_one_per_gap() -> None:
    offsets = schedule(FakeTiming(prefill_ms=300, token_gap_ms=50, answer_tokens=3), 3)
    assert offsets == pytest.approx([0.35, 0.40, 0.45])


def test_think_pause_follows_the_named_token() -> None:
    timing = FakeTiming(prefill_ms=0, token_gap_ms=10, answer_tokens=4,
                        pauses=(ThinkPause(after_token=1, pause_ms=1000),))
    assert schedule(timing, 4) == pytest.approx([0.01, 0.02, 1.03, 1.04])


def test_timing_is_the_fake_models_option_with_defaults_for_unset_fields() -> None:
    request = pb.GenerateRequest(prompt="x", timing=pb.FakeModelTiming(
        token_gap_ms=5, pauses=[pb.ThinkPause(after_token=2, pause_ms=100)]))
    assert FakeModel(DEFAULTS).options(request) == FakeTiming(
        prefill_ms=300, token_gap_ms=5, answer_tokens=50,
        pauses=(ThinkPause(after_token=2, pause_ms=100),))
    assert FakeModel(DEFAULTS).options(pb.GenerateRequest(prompt="x")) == FakeTiming(
        prefill_ms=300, token_gap_ms=50, answer_tokens=50)


def test_an_explicit_zero_answer_is_refused_naming_the_field() -> None:
    request = pb.GenerateRequest(prompt="x", timing=pb.FakeModelTiming(answer_tokens=0))
    with pytest.raises(InvalidRequest, match=r"timing\.answer_tokens"):
        FakeModel(DEFAULTS).options(request)
