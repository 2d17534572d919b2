"""Lateness while a ramp runs (streamlab/experiments/bench/load.py): heartbeats
and tokens against their schedule, only what arrived before the ramp ended."""

from __future__ import annotations

import asyncio

import pytest

from streamlab.experiments.bench.load import _Stream, heartbeat_lateness_ms, token_lateness_ms


def stream(head_at: float, pings: list[float], arrivals: list[tuple[float, int]]) -> _Stream:
    async def made() -> _Stream:
        one = _Stream(b"", started=head_at, track_pings=True)
        one.head_at, one.pings, one.arrivals = head_at, pings, arrivals
        return one

    return asyncio.run(made())


def test_tokens_late_against_their_gap_only_until_the_ramp_ends() -> None:
    # A token a second; the third 400 ms late, the fourth back on the clock
    # (600 ms after it: not late), the fifth after the ramp ended (not counted).
    one = stream(0.0, [], [(1.0, 1), (2.0, 1), (3.4, 1), (4.0, 1), (9.0, 1)])
    assert token_lateness_ms([one], 1.0, until=5.0) == pytest.approx([0.0, 400.0, 0.0])
    assert token_lateness_ms([one], 1.0) == pytest.approx([0.0, 400.0, 0.0, 4000.0])


def test_bunched_tokens_are_on_time_after_the_first_of_them() -> None:
    one = stream(0.0, [], [(1.0, 1), (2.5, 3)])
    assert token_lateness_ms([one], 1.0) == pytest.approx([500.0, 0.0, 0.0])


def test_heartbeats_late_only_until_the_ramp_ends() -> None:
    # Every 5 s from the head: the first 700 ms late, the second on time after
    # it, the third after the ramp.
    one = stream(10.0, [15.7, 20.7, 30.0], [])
    assert heartbeat_lateness_ms([one], 5.0, until=21.0) == pytest.approx([700.0, 0.0])
    assert heartbeat_lateness_ms([one], 5.0) == pytest.approx([700.0, 0.0, 4300.0])
