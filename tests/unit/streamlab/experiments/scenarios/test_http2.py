"""The HTTP/2 scenarios' figures and checks, on hand-made results (no lab, no browser)."""

from __future__ import annotations

from services.client.resume_stream import Connection, ResumeResult
from services.engine.backends.fake import token_text
from streamlab.experiments.report import Figures, judge
from streamlab.experiments.scenarios import Timing
from streamlab.experiments.scenarios.h2_shared_fate import (
    H2_SHARED_FATE,
    STREAM_TOKENS,
    STREAMS,
    Cut,
    figures_of,
)
from streamlab.experiments.scenarios.seventh_tab import HOLD_S, SEVENTH_TAB, ConnectionCounter

TIMING = Timing()


def seventh(protocol: str, at_once: int, wait_s: float, after_close_s: float,
            peak: int) -> Figures:
    return {"protocol": protocol, "streaming_at_once": at_once, "pending_tabs": 7 - at_once,
            "seventh_wait_s": wait_s, "seventh_after_close_s": after_close_s,
            "edge_connections_peak": peak, "edge_connections_seen": peak,
            "seventh_streamed": True}


def test_seventh_tab_checks_tell_six_connections_from_one() -> None:
    http1 = seventh("http/1.1", 6, HOLD_S + 0.1, 0.06, 6)
    h2 = seventh("h2", 7, 0.02, -0.04, 1)
    assert all(r.holds for r in judge(SEVENTH_TAB.broken.expect, http1, TIMING))
    assert not any(r.holds for r in judge(SEVENTH_TAB.fixed.expect, http1, TIMING)
                   if r.check.figure != "seventh_streamed")
    assert all(r.holds for r in judge(SEVENTH_TAB.fixed.expect, h2, TIMING))
    assert not all(r.holds for r in judge(SEVENTH_TAB.broken.expect, h2, TIMING))


def test_a_seventh_tab_that_never_streamed_fails_both_modes() -> None:
    hung: Figures = {**seventh("http/1.1", 6, HOLD_S, 0.0, 6), "seventh_streamed": False,
                     "seventh_wait_s": None, "seventh_after_close_s": None}
    assert not all(r.holds for r in judge(SEVENTH_TAB.broken.expect, hung, TIMING))
    assert not all(r.holds for r in judge(SEVENTH_TAB.fixed.expect, hung, TIMING))


def result(sid: str, upto: int, ends: list[str], again: bool) -> ResumeResult:
    indexes = list(range(upto)) + (list(range(upto, STREAM_TOKENS)) if again else [])
    return ResumeResult(stream_id=sid, tokens=[(i, token_text(i)) for i in indexes],
                        terminal="done" if again else None,
                        connections=[Connection(None, 200, ended=e) for e in ends])


def cut_at(connections: int) -> Cut:
    cut = Cut.__new__(Cut)  # no lab: only the figures it recorded
    cut.connections_at_cut, cut.tokens_at_cut = connections, [3] * STREAMS
    return cut


def test_one_cut_without_resume_loses_every_stream() -> None:
    results = [result(f"s{i}", 3, ["transport"], again=False) for i in range(STREAMS)]
    seen = {f"s{i}": 10.0 + i * 0.001 for i in range(STREAMS)}
    figures = figures_of(results, cut_at(1), seen, ConnectionCounter("127.0.0.1", 1))
    assert figures["streams_cut"] == STREAMS
    assert figures["missing_total"] == STREAMS * (STREAM_TOKENS - 3)
    assert figures["cut_spread_s"] == 0.006
    assert all(r.holds for r in judge(H2_SHARED_FATE.broken.expect, figures, TIMING))
    assert not all(r.holds for r in judge(H2_SHARED_FATE.fixed.expect, figures, TIMING))


def test_resume_brings_every_stream_back_once() -> None:
    results = [result(f"s{i}", 3, ["transport", "terminal"], again=True)
               for i in range(STREAMS)]
    seen = {f"s{i}": 10.0 for i in range(STREAMS)}
    figures = figures_of(results, cut_at(1), seen, ConnectionCounter("127.0.0.1", 1))
    assert (figures["streams_exact"], figures["missing_total"], figures["duplicates_total"],
            figures["reconnections"]) == (STREAMS, 0, 0, STREAMS)
    assert all(r.holds for r in judge(H2_SHARED_FATE.fixed.expect, figures, TIMING))
    assert not all(r.holds for r in judge(H2_SHARED_FATE.broken.expect, figures, TIMING))


def test_streams_on_separate_connections_are_not_shared_fate() -> None:
    """Seven HTTP/1.1 connections: the all-on-one check fails in both modes."""
    results = [result(f"s{i}", 3, ["transport", "terminal"], again=True)
               for i in range(STREAMS)]
    figures = figures_of(results, cut_at(7), {f"s{i}": 10.0 for i in range(STREAMS)},
                         ConnectionCounter("127.0.0.1", 1))
    assert not all(r.holds for r in judge(H2_SHARED_FATE.fixed.expect, figures, TIMING))
