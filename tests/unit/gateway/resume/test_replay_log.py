"""The replay log: bounded, numbered without holes, and honest about what it dropped."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.gateway.resume.replay_log import (
    ENTRY_OVERHEAD_BYTES,
    BadEventId,
    ReplayLog,
    event_id,
    is_stream_id,
    parse_event_id,
)

SID = "0123456789abcdef0123456789abcdef"


def test_replays_everything_after_a_sequence_number() -> None:
    log = ReplayLog(max_events=100, max_bytes=1 << 20)
    for word in ["the ", "naïve ", "café "]:
        log.append("token", word)
    replay = log.after(1)
    assert [e.seq for e in replay.entries] == [2, 3]
    assert [e.data for e in replay.entries] == ["naïve ", "café "]
    assert replay.missed is None
    assert log.after(3).entries == []
    assert log.after(0).entries[0].seq == 1


def test_over_its_bound_it_drops_the_oldest_and_says_which() -> None:
    log = ReplayLog(max_events=3, max_bytes=1 << 20)
    for i in range(10):
        log.append("token", str(i))
    assert (log.first_seq, log.last_seq, len(log)) == (8, 10, 3)
    replay = log.after(2)
    assert replay.missed == (3, 7)
    assert [e.seq for e in replay.entries] == [8, 9, 10]
    assert log.after(7).missed is None


def test_byte_bound_counts_utf8_bytes_and_keeps_the_newest_even_if_alone_too_big() -> None:
    log = ReplayLog(max_events=100, max_bytes=ENTRY_OVERHEAD_BYTES * 3)
    log.append("token", "é" * 10)  # 20 bytes of UTF-8
    log.append("token", "x" * 500)
    assert len(log) == 1
    assert log.last_seq == 2
    assert log.bytes == 500 + len("token") + ENTRY_OVERHEAD_BYTES


def test_a_sequence_outside_the_log_is_an_error() -> None:
    log = ReplayLog(max_events=5, max_bytes=1 << 20)
    log.append("token", "a")
    with pytest.raises(ValueError, match="outside"):
        log.after(2)
    with pytest.raises(ValueError, match="outside"):
        log.after(-1)


@given(count=st.integers(0, 60), max_events=st.integers(1, 20), data=st.data())
def test_missed_and_replayed_together_are_exactly_what_came_after(
    count: int, max_events: int, data: st.DataObject
) -> None:
    log = ReplayLog(max_events=max_events, max_bytes=1 << 20)
    for i in range(count):
        log.append("token", str(i))
    after = data.draw(st.integers(0, count))
    replay = log.after(after)
    missed = list(range(replay.missed[0], replay.missed[1] + 1)) if replay.missed else []
    assert missed + [e.seq for e in replay.entries] == list(range(after + 1, count + 1))
    assert len(log) == min(count, max_events)


def test_event_ids_name_the_stream_and_the_place_in_it() -> None:
    assert is_stream_id(SID)
    assert parse_event_id(event_id(SID, 42)) == (SID, 42)
    assert parse_event_id(f"{SID}:0") == (SID, 0)


@pytest.mark.parametrize("bad", [
    "", "42", f"{SID}", f"{SID}:", f"{SID}:-1", f"{SID}:01", f"{SID}:1.5", f"{SID}:1 ",
    f"{SID}:1\n", f"{SID.upper()}:1", f"{SID}x:1", f"{SID}:{'9' * 19}", "ÿ:1",
])
def test_malformed_event_ids_are_refused(bad: str) -> None:
    with pytest.raises(BadEventId):
        parse_event_id(bad)


def test_a_log_taken_over_continues_the_shared_logs_numbering() -> None:
    """A replica that takes a stream over starts its log after the shared
    log's last event; what comes before is not held here (Redis has it)."""
    log = ReplayLog(max_events=10, max_bytes=1 << 20, start_after=12)
    assert (log.last_seq, log.first_seq) == (12, 13)
    assert log.append("token", "x").seq == 13
    assert log.after(12).entries[0].seq == 13
    assert log.after(5).missed == (6, 12)
