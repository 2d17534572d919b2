"""`bench memory`'s arithmetic and verdict (streamlab/experiments/bench/memory.py):
KiB per stream over the streams the gateway held, the 40 KiB target judged on
it, and the traced table naming the line that made what each stream holds."""

from __future__ import annotations

import tracemalloc

from streamlab.experiments.bench.load import LoadResult
from streamlab.experiments.bench.memory import WireRun, memory_report, traced_top

MIB = 2**20


def wire_run(wire: str, kib_per_stream: float, streams: int = 1000) -> WireRun:
    before = 80 * MIB
    return WireRun(wire, streams, LoadResult(streams, completed=streams), rss_before=before,
                   rss_peak=before + int(kib_per_stream * 1024 * streams), fds_before=20,
                   fds_peak=20 + streams, rss_held=before + int(kib_per_stream * 1024 * streams))


def test_kib_per_stream_is_over_the_streams_held_not_those_asked_for() -> None:
    """Broken: dividing by the streams asked for, when only some reached the
    gateway, flatters the figure."""
    run = wire_run("per_request", 30.0)
    run.fds_peak = run.fds_before + 500  # only half were held at once
    assert run.kib_per_stream == 60.0


def test_the_target_fails_a_wire_above_40_kib_and_holds_one_below() -> None:
    """Broken: a check that cannot fail (the 66 KiB per_request wire passing)."""
    report = memory_report([wire_run("per_request", 66.0), wire_run("multiplexed", 33.0)])
    verdicts = {r.check.figure: r.holds for r in report.checks}
    assert verdicts["per_request_kib_per_stream"] is False
    assert verdicts["multiplexed_kib_per_stream"] is True
    assert verdicts["per_request_completed"] is True


def test_the_traced_table_names_the_line_that_made_what_each_stream_holds() -> None:
    """Broken: the table attributing the allocations to tracemalloc's own
    bookkeeping or to the wrong line."""
    tracemalloc.start(4)
    try:
        before = tracemalloc.take_snapshot()
        held = [bytearray(4096) for _ in range(100)]  # the line to find
        during = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    rows, total = traced_top(before, during, held=len(held))
    where, kib, _ = rows[0]
    assert where.startswith("tests/unit/streamlab/experiments/bench/test_memory.py:"), rows[:3]
    assert 4.0 <= kib < 4.5
    assert total >= kib
