from __future__ import annotations

from services.engine.stats import EngineStats
from streamlab_protocol.generation import GenerationState


def test_tokens_after_the_cancel_are_counted_as_waste() -> None:
    stats = EngineStats(history=10)
    record = stats.begin("r1")
    record.generated()
    record.generated()
    stats.mark_cancel(record)
    record.generated()  # a decode step that was already under way
    stats.end(record, GenerationState.CANCELLED)

    assert (record.tokens_generated, record.tokens_after_cancel) == (3, 1)
    assert (stats.tokens_generated, stats.tokens_after_cancel, stats.cancelled) == (3, 1, 1)
    assert stats.active == 0


def test_history_evicts_finished_generations_but_never_running_ones() -> None:
    stats = EngineStats(history=2)
    running = stats.begin("running")
    for i in range(5):
        stats.end(stats.begin(f"done-{i}"), GenerationState.COMPLETED)
    ids = [r.request_id for r in stats.records()]
    assert ids == ["running", "done-4"]  # the newest finished one, and the running one
    assert stats.records("running") == [running]


def test_history_keeps_every_record_until_it_is_full() -> None:
    """Below the bound nothing is evicted (a negative excess once trimmed the
    log to about half of it)."""
    stats = EngineStats(history=10)
    for i in range(9):
        stats.end(stats.begin(f"done-{i}"), GenerationState.COMPLETED)
    assert [r.request_id for r in stats.records()] == [f"done-{i}" for i in range(9)]
    stats.end(stats.begin("done-9"), GenerationState.COMPLETED)
    stats.end(stats.begin("done-10"), GenerationState.COMPLETED)
    assert stats.records()[0].request_id == "done-1"  # the oldest went first
    assert len(stats.records()) == 10
