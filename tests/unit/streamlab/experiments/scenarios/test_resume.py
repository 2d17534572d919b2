"""The resume scenario's figures and checks, on hand-made client results (no lab)."""

from __future__ import annotations

from services.client.resume_stream import Connection, ResumeResult
from streamlab.experiments.report import judge
from streamlab.experiments.scenarios import Timing, get
from streamlab.experiments.scenarios.resume import BROKEN, FIXED, figures_of

TEXTS = ["a", "b", "c", "d", "e"]


def result(indexes: list[int], ends: list[str], terminal: str | None) -> ResumeResult:
    return ResumeResult(tokens=[(i, TEXTS[i]) for i in indexes], terminal=terminal,
                        connections=[Connection(None, 200, ended=end) for end in ends])


REFERENCE = result([0, 1, 2, 3, 4], ["terminal"], "done")
CUT_AND_GONE = result([0, 1], ["eof"], None)  # the client without resume
CUT_AND_BACK = result([0, 1, 2, 3, 4], ["eof", "terminal"], "done")


def test_a_client_without_resume_loses_everything_after_the_cut() -> None:
    figures = figures_of(CUT_AND_GONE, REFERENCE)
    assert (figures["missing"], figures["duplicates"], figures["cuts"]) == (3, 0, 1)
    assert figures["text_equal"] is False
    assert all(r.holds for r in judge(BROKEN, figures, Timing()))
    assert not all(r.holds for r in judge(FIXED, figures, Timing()))


def test_a_resuming_client_gets_every_token_once_and_the_checks_tell_them_apart() -> None:
    figures = figures_of(CUT_AND_BACK, REFERENCE)
    assert (figures["missing"], figures["duplicates"], figures["connections"]) == (0, 0, 2)
    assert all(r.holds for r in judge(FIXED, figures, Timing()))
    assert not all(r.holds for r in judge(BROKEN, figures, Timing()))


def test_a_replayed_token_counts_as_a_duplicate() -> None:
    twice = result([0, 1, 1, 2, 3, 4], ["eof", "terminal"], "done")
    figures = figures_of(twice, REFERENCE)
    assert figures["duplicates"] == 1
    assert not all(r.holds for r in judge(FIXED, figures, Timing()))


def test_resume_runs_on_both_http_hops_as_catalogue_entries() -> None:
    assert get("resume").fixed.setup.knobs["hop"] == "edge"
    assert get("resume-upstream").fixed.setup.knobs["hop"] == "upstream"
