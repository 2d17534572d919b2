"""The responses-resume scenario's figures and checks, on hand-made reads (no
lab): the broken and fixed checks each fail on the other mode's figures."""

from __future__ import annotations

import json

from streamlab.experiments.report import judge
from streamlab.experiments.scenarios import Timing
from streamlab.experiments.scenarios.responses_resume import (
    BROKEN,
    COMPLETED,
    DELTA,
    FIXED,
    Read,
    figures_of,
)

TEXTS = ["a", "b", "c", "d", "e"]
OPENING = 4  # created, in_progress, output_item.added, content_part.added


def events(first: int, last: int, *, completed: bool) -> list[str]:
    """The events numbered first..last of a 5-delta response, as the wire has them."""
    out = []
    for n in range(first, last + 1):
        if n == 0:
            out.append({"type": "response.created", "sequence_number": 0,
                        "response": {"id": "resp_1"}})
        elif n < OPENING:
            out.append({"type": "response.in_progress", "sequence_number": n})
        elif n < OPENING + len(TEXTS):
            out.append({"type": DELTA, "sequence_number": n, "delta": TEXTS[n - OPENING]})
    if completed:
        out.append({"type": COMPLETED, "sequence_number": OPENING + len(TEXTS)})
    return [json.dumps(e) for e in out]


def read(*connections: list[str], starting_after: int | None = None) -> Read:
    result = Read(starting_after=starting_after)
    for connection in connections:
        result.connections += 1
        for data in connection:
            result.add(data)
        result.cuts += not result.completed
    return result


CUT = events(0, 5, completed=False)  # two deltas in, then the cut


def test_asking_again_without_starting_after_replays_what_was_read() -> None:
    figures = figures_of(read(CUT, events(0, 8, completed=True)), "abcde", 5)

    assert (figures["deltas_received"], figures["duplicates"], figures["missing"]) == (7, 2, 0)
    assert figures["text_equal"] is False
    assert all(r.holds for r in judge(BROKEN, figures, Timing()))
    assert not all(r.holds for r in judge(FIXED, figures, Timing()))


def test_starting_after_the_last_event_read_gives_each_delta_once() -> None:
    figures = figures_of(read(CUT, events(6, 8, completed=True), starting_after=5), "abcde", 5)

    assert (figures["deltas_received"], figures["duplicates"], figures["missing"]) == (5, 0, 0)
    assert (figures["text_equal"], figures["completed"], figures["cuts"]) == (True, True, 1)
    assert all(r.holds for r in judge(FIXED, figures, Timing()))
    assert not all(r.holds for r in judge(BROKEN, figures, Timing()))


def test_a_stream_that_was_never_cut_proves_nothing() -> None:
    figures = figures_of(read(events(0, 8, completed=True)), "abcde", 5)

    assert figures["cuts"] == 0
    assert not all(r.holds for r in judge(FIXED, figures, Timing()))
    assert not all(r.holds for r in judge(BROKEN, figures, Timing()))


def test_the_response_id_comes_from_response_created() -> None:
    assert read(CUT).response_id == "resp_1"
