"""The gateway's answers to a reconnect storm (services/gateway/limits.py
ConnectRate, resume_routes.retry_jitter_ms): pure logic, a fake clock."""

from __future__ import annotations

import pytest

from services.gateway.limits import ConnectRate, TooManyConnections
from services.gateway.resume_routes import retry_jitter_ms


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_rate_refuses_past_a_second_worth_and_refills() -> None:
    clock = Clock()
    rate = ConnectRate(10, retry_after_s=1, clock=clock)
    for _ in range(10):
        rate.admit()
    with pytest.raises(TooManyConnections) as refused:
        rate.admit()
    assert refused.value.status_code == 429
    assert refused.value.headers == {"Retry-After": "1"}
    clock.now = 0.5  # five tokens back
    for _ in range(5):
        rate.admit()
    with pytest.raises(TooManyConnections):
        rate.admit()


def test_resumes_first_are_let_in_and_hold_new_streams_back() -> None:
    clock = Clock()
    rate = ConnectRate(10, retry_after_s=1, clock=clock)
    for _ in range(30):  # a storm of resumes, all admitted
        rate.admit(force=True)
    clock.now = 1.0  # a second's refill only pays back part of the debt
    with pytest.raises(TooManyConnections):
        rate.admit()


def test_zero_means_no_limit() -> None:
    rate = ConnectRate(0, retry_after_s=1)
    for _ in range(10_000):
        rate.admit()


def test_jitter_is_stable_per_stream_and_spread_over_the_window() -> None:
    ids = [f"s{k:04d}" for k in range(2000)]
    offsets = [retry_jitter_ms(i, 4000) for i in ids]
    assert offsets == [retry_jitter_ms(i, 4000) for i in ids]  # the same every response
    assert all(0 <= o < 4000 for o in offsets)
    quarters = [sum(q * 1000 <= o < (q + 1) * 1000 for o in offsets) for q in range(4)]
    assert min(quarters) > 400, quarters  # about 500 each: spread, not bunched
    assert retry_jitter_ms("s0001", 0) == 0
