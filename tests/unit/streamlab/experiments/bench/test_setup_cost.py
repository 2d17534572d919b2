"""`bench setup`'s report, from hand-made cells (no lab): CPU per stream and per
paced token from each process's CPU, and the set-up targets as checks that
fail when a figure is over its target."""

from __future__ import annotations

import pytest

from streamlab.experiments.bench.load import LoadResult
from streamlab.experiments.bench.setup_cost import (
    SETUP_TARGET_MS,
    CellCost,
    SetupRun,
    merge,
    setup_report,
)
from streamlab.experiments.bench.setup_floor import FloorRun

STREAMS = 1000


def run(gateway_ms: float, engine_ms: float, completed: int = STREAMS,
        paced: bool = True) -> SetupRun:
    """A run whose set-up cell cost `gateway_ms` and `engine_ms` in all."""
    setup = CellCost(LoadResult(streams=STREAMS, completed=completed, tokens=2 * completed,
                                client_cpu_ms=500.0),
                     {"gateway": gateway_ms, "engine": engine_ms, "toxiproxy": 1500.0,
                      "nginx": 300.0})
    cell = None
    if paced:
        # 10 streams x 100 tokens: the set-up share (10 x per stream) is taken off.
        cell = CellCost(LoadResult(streams=10, completed=10, tokens=1000, client_cpu_ms=30.0),
                        {"gateway": gateway_ms / STREAMS * 10 + 100.0,
                         "engine": engine_ms / STREAMS * 10 + 50.0,
                         "toxiproxy": None, "nginx": 20.0})
    return SetupRun(STREAMS, 100.0, setup, {"gateway": 3.0, "engine": 1.0},
                    (10, 100, 20) if paced else None, cell)


def verdicts(report_run: SetupRun) -> dict[str, bool]:
    return {r.check.figure: r.holds for r in setup_report(report_run).checks}


def test_cpu_per_stream_and_per_paced_token_come_from_each_process() -> None:
    report = setup_report(run(gateway_ms=800.0, engine_ms=250.0))
    figures = report.figures
    assert figures["setup_ms_gateway"] == 0.8
    assert figures["setup_ms_engine"] == 0.25
    assert figures["setup_ms_toxiproxy"] == 1.5
    assert figures["setup_ms_client"] == 0.5
    # Per token, with the streams' own set-up taken off: 100 ms / 1000 tokens.
    assert figures["paced_us_gateway"] == 100.0
    assert figures["paced_us_engine"] == 50.0
    assert figures["paced_us_toxiproxy"] is None  # not read: not made up
    assert figures["idle_ms_per_s_gateway"] == 3.0
    (table,) = report.tables
    rows = {row[0]: row for row in table.rows}
    assert rows["gateway"] == ("gateway", 0.8, 1.0, True, None, 100.0, 3.0)
    assert rows["nginx"][2] is None  # no target, so no verdict
    assert report.as_expected


@pytest.mark.parametrize("process", sorted(SETUP_TARGET_MS))
def test_a_set_up_figure_over_its_target_fails_its_check(process: str) -> None:
    within = {"gateway": 900.0, "engine": 290.0}
    over = dict(within, **{process: SETUP_TARGET_MS[process] * STREAMS * 1.5})
    assert all(verdicts(run(within["gateway"], within["engine"])).values())
    held = verdicts(run(over["gateway"], over["engine"]))
    assert held[f"setup_ms_{process}"] is False
    assert [figure for figure, ok in held.items() if not ok] == [f"setup_ms_{process}"]
    report = setup_report(run(over["gateway"], over["engine"]))
    assert not report.as_expected
    rows = {row[0]: row for row in report.tables[0].rows}
    assert rows[process][3] is False


def test_lost_streams_fail_and_a_run_without_completions_has_no_figure() -> None:
    held = verdicts(run(800.0, 250.0, completed=STREAMS - 3))
    assert held["completed"] is False
    empty = setup_report(run(800.0, 250.0, completed=0, paced=False))
    assert empty.figures["setup_ms_gateway"] is None
    assert "paced_us_gateway" not in empty.figures
    assert not {r.check.figure: r.holds for r in empty.checks}["setup_ms_gateway"]


def test_the_set_up_waves_merge_into_one_result() -> None:
    waves = [LoadResult(streams=50, completed=50, tokens=100, client_cpu_ms=10.0,
                        ttft_ms={"p50": 5.0, "p90": 6.0, "p99": 9.0}),
             LoadResult(streams=50, completed=48, tokens=96, client_cpu_ms=12.0,
                        errors={"HTTP 429": 2}, ttft_ms={"p50": 7.0, "p90": 8.0, "p99": 30.0}),
             LoadResult(streams=20, completed=20, tokens=40, client_cpu_ms=4.0,
                        ttft_ms={"p50": 6.0, "p90": 7.0, "p99": 8.0})]
    merged = merge(waves)
    assert (merged.streams, merged.completed, merged.tokens) == (120, 118, 236)
    assert merged.errors == {"HTTP 429": 2}
    assert merged.client_cpu_ms == 26.0
    assert merged.ttft_ms == {"p50": 6.0, "p99": 30.0}
    waves[1].client_cpu_ms = None  # one wave's CPU unread: the sum would be a guess
    assert merge(waves).client_cpu_ms is None


def test_the_engine_wire_measured_on_is_named() -> None:
    # The engine's set-up differs by wire: a reader must know which one it was.
    measured = run(gateway_ms=800.0, engine_ms=250.0)
    report = setup_report(SetupRun(**{**measured.__dict__, "engine_wire": "multiplexed"}))
    assert report.figures["engine_wire"] == "multiplexed"
    assert "engine wire multiplexed" in (report.tables[0].caption or "")
    assert setup_report(measured).figures["engine_wire"] is None  # not known: not made up


def test_the_grpc_floor_is_printed_beside_its_process_and_never_judged() -> None:
    # The floor says how much of a figure the transport alone takes: a reader
    # needs it next to the figure, and a floor above a target fails nothing.
    floor = FloorRun(streams=STREAMS, completed=STREAMS, messages_per_stream=1.0,
                     server_ms=0.55, client_ms=0.8)
    measured = run(gateway_ms=1200.0, engine_ms=600.0)
    report = setup_report(SetupRun(**{**measured.__dict__, "floor": floor}))
    assert report.figures["floor_ms_engine"] == 0.55
    assert report.figures["floor_ms_gateway"] == 0.8
    assert report.figures["floor_messages_per_stream"] == 1.0
    rows = {row[0]: row for row in report.tables[0].rows}
    assert rows["engine"][4] == 0.55
    assert rows["gateway"][4] == 0.8
    assert rows["nginx"][4] is None  # no floor measured for it: none shown
    assert "gRPC floor" in (report.tables[0].caption or "")
    assert {r.check.figure for r in report.checks} == {
        r.check.figure for r in setup_report(measured).checks}
    assert "floor_ms_engine" not in setup_report(measured).figures  # not run: not made up
