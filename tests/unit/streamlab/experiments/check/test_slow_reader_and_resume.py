"""The pure parts of the slow-reader and resume checks: what a stalled read is
called, how a resumed read is compared with what was missed, and the target
that reaches the server straight past the check's hop."""

from __future__ import annotations

from services.client.openai_stream import StreamResult
from streamlab.experiments.check.resume import once
from streamlab.experiments.check.slow_reader import behaviour
from streamlab.experiments.check.target import CheckTarget


def test_a_stalled_read_is_paused_while_the_gauge_still_counts_it() -> None:
    done = StreamResult(done=True)
    assert behaviour(done, running_before=0, running_at_end=1) == "paused"
    assert behaviour(done, running_before=0, running_at_end=0) == "buffered"
    assert behaviour(done, running_before=2, running_at_end=2) == "buffered"  # others', not ours
    assert behaviour(done, running_before=0, running_at_end=None) == "buffered"
    # No [DONE] after the reader came back: the server (or a hop) cut it.
    assert behaviour(StreamResult(done=False), running_before=0, running_at_end=1) == "cut"


def test_a_resume_is_exactly_once_only_when_it_is_what_was_missed() -> None:
    before, missed = ["1", "2", "3"], ["4", "5", "6"]
    assert once(before, missed, missed) == {
        "duplicates": 0, "missing": 0, "unexpected": 0, "exactly_once": True}
    replayed = once(before, before + missed, missed)
    assert (replayed["duplicates"], replayed["missing"], replayed["exactly_once"]) == (
        3, 0, False)
    skipped = once(before, ["6"], missed)
    assert (skipped["duplicates"], skipped["missing"], skipped["exactly_once"]) == (0, 2, False)
    assert once(before, ["4", "x", "5", "6"], missed)["unexpected"] == 1
    assert once(before, ["5", "4", "6"], missed)["exactly_once"] is False  # out of order


def test_the_target_behind_a_hop_remembers_the_server() -> None:
    given = CheckTarget("http://10.0.0.5:8000/v1", "m")
    hopped = given.via("127.0.0.1", 4100).via("127.0.0.1", 4200)
    assert hopped.chat_url == "http://127.0.0.1:4200/v1/chat/completions"
    assert hopped.direct().chat_url == "http://10.0.0.5:8000/v1/chat/completions"
    assert given.direct() == given
