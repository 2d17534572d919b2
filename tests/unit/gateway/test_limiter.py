"""The stream limiter's overall count is kept as slots come and go (not summed
over every client on each acquire), so it must stay the sum of the
per-client counts whatever order slots are taken and released in."""

from __future__ import annotations

import pytest

from services.gateway.limits import StreamLimiter, TooManyStreams


def test_the_overall_cap_counts_every_client_s_slots_and_each_release_once() -> None:
    limiter = StreamLimiter(total=3, per_client=2, retry_after_s=1)
    a1, a2, b1 = limiter.acquire("a"), limiter.acquire("a"), limiter.acquire("b")
    assert limiter.open == 3
    with pytest.raises(TooManyStreams, match="at capacity"):
        limiter.acquire("c")
    a1.release()
    a1.release()  # idempotent: a second release frees nothing more
    assert limiter.open == 2
    c1 = limiter.acquire("c")
    with pytest.raises(TooManyStreams, match="at capacity"):
        limiter.acquire("d")
    for slot in (a2, b1, c1):
        slot.release()
    assert limiter.open == 0
    slots = [limiter.acquire(key) for key in ("x", "x")]
    assert limiter.open == 2
    with pytest.raises(TooManyStreams, match="for this client"):
        limiter.acquire("x")
    for slot in slots:
        slot.release()
    assert limiter.open == 0
