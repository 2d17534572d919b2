"""`bench scale`'s targets table (streamlab/experiments/bench/targets.py): each
target a row, measured / target / met, and each one failing when its figure
misses, alone."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from streamlab.experiments.bench.targets import Cells, targets_report
from streamlab.experiments.report import Figure, Report


def part(variant: str, figures: Mapping[str, Figure], parts: tuple[Report, ...] = ()
         ) -> Report:
    return Report("bench scale", variant, figures=dict(figures), parts=parts)


SETUP: dict[str, Figure] = {"setup_ms_gateway": 0.9, "setup_ms_engine": 0.25}
SLOW: dict[str, Figure] = {
    "streams": 5000, "admission": "on", "completed": 5000, "ttft_ms_p99": 800.0,
    "heartbeat_late_ms_p99": 300.0, "gateway_kib_per_stream": 35.0}
PACED: dict[str, Figure] = {
    "clock": "batched", "streams": 100, "completed": 100, "icl_ms_p50": 20.1,
    "icl_ms_p99": 26.0, "us_per_token_engine": 40.0, "us_per_token_toxiproxy": 40.0,
    "us_per_token_toxiproxy-backend": 40.0, "us_per_token_gateway": 50.0,
    "us_per_token_nginx": 10.0, "us_per_token_client": 500.0, "running_tokens": 7000,
    "us_per_running_token_engine": 30.0, "us_per_running_token_toxiproxy": 30.0,
    "us_per_running_token_toxiproxy-backend": 30.0, "us_per_running_token_gateway": 40.0,
    "us_per_running_token_nginx": 10.0, "us_per_running_token_client": 400.0}
STORM: dict[str, Figure] = {
    "streams": 2000, "cut_streams": 2000, "lost": 0, "next_token_s": 4.2,
    "complete_exactly_once": 2000, "duplicates": 0}
CANCEL: dict[str, Figure] = {
    "per_request_cancel_latency_p99_ms": 30.0, "per_request_background_streams": 1000,
    "multiplexed_cancel_latency_p99_ms": 20.0, "multiplexed_background_streams": 1000}


def cells(setup: Mapping[str, Figure] = SETUP, slow: Mapping[str, Figure] = SLOW,
          paced: Mapping[str, Figure] = PACED, storm: Mapping[str, Figure] = STORM,
          cancel: Mapping[str, Figure] = CANCEL) -> Cells:
    other = {**paced, "clock": "per_stream", "icl_ms_p99": 90.0}  # not the target's cell
    cadence = part("cadence", {}, (part("per_stream × 100", other),
                                   part("batched × 100", paced),
                                   part("batched × 50", {**paced, "streams": 50})))
    return Cells(setup=part("", setup), cadence=cadence, slow=part("slow", slow),
                 storm=part("storm", storm), cancel=part("", cancel))


def test_every_target_is_a_row_and_all_hold_on_figures_that_meet_them() -> None:
    report = targets_report(cells())
    (table,) = report.tables
    assert table.title == "targets"
    assert table.columns == ("target", "figure", "measured", "bound", "met")
    assert [row[1] for row in table.rows] == [
        "setup_ms_gateway", "setup_ms_engine", "slow_completed", "slow_ttft_ms_p99",
        "slow_heartbeat_late_ms_p99", "slow_gateway_kib_per_stream",
        "paced_lab_us_per_running_token", "paced_icl_ms_p50", "paced_icl_ms_p50",
        "paced_icl_ms_p99", "storm_lost", "storm_next_token_s", "storm_complete_exactly_once",
        "storm_duplicates",
        "cancel_per_request_cancel_latency_p99_ms", "cancel_multiplexed_cancel_latency_p99_ms"]
    assert all(row[-1] is True for row in table.rows), report.explain()
    # The lab's CPU per token is its processes' sum, the client not counted;
    # the cell is the batched clock's at 100 streams. Judged per running token;
    # the whole cell's figure (set-ups included) is printed beside it.
    assert report.figures["paced_lab_us_per_running_token"] == 140.0
    assert report.figures["paced_lab_us_per_token"] == 180.0
    assert report.figures["paced_clock"] == "batched"
    rows = {row[1]: row for row in table.rows}
    assert str(rows["paced_lab_us_per_running_token"][0]).endswith(
        "(whole cell, set-ups included: 180)")
    assert table.rows[0][2:4] == (0.9, "<= 1")


MISSES = [
    ("setup", {**SETUP, "setup_ms_gateway": 1.9}, "setup_ms_gateway"),
    ("setup", {**SETUP, "setup_ms_engine": 1.0}, "setup_ms_engine"),
    ("slow", {**SLOW, "completed": 2500}, "slow_completed"),
    ("slow", {**SLOW, "ttft_ms_p99": 1500.0}, "slow_ttft_ms_p99"),
    ("slow", {**SLOW, "ttft_ms_p99": None}, "slow_ttft_ms_p99"),
    ("slow", {**SLOW, "heartbeat_late_ms_p99": 900.0}, "slow_heartbeat_late_ms_p99"),
    ("slow", {**SLOW, "gateway_kib_per_stream": 85.0}, "slow_gateway_kib_per_stream"),
    ("paced", {**PACED, "us_per_running_token_gateway": 110.0},
     "paced_lab_us_per_running_token"),
    ("paced", {**PACED, "us_per_running_token_nginx": None}, "paced_lab_us_per_running_token"),
    ("paced", {**PACED, "icl_ms_p50": 18.5}, "paced_icl_ms_p50"),
    ("paced", {**PACED, "icl_ms_p50": 21.5}, "paced_icl_ms_p50"),
    ("paced", {**PACED, "icl_ms_p99": 31.0}, "paced_icl_ms_p99"),
    ("storm", {**STORM, "lost": 3}, "storm_lost"),
    ("storm", {**STORM, "next_token_s": 5.5}, "storm_next_token_s"),
    ("storm", {**STORM, "complete_exactly_once": 1999}, "storm_complete_exactly_once"),
    ("storm", {**STORM, "duplicates": 1}, "storm_duplicates"),
    ("cancel", {**CANCEL, "per_request_cancel_latency_p99_ms": 60.0},
     "cancel_per_request_cancel_latency_p99_ms"),
    ("cancel", {**CANCEL, "multiplexed_cancel_latency_p99_ms": 51.0},
     "cancel_multiplexed_cancel_latency_p99_ms"),
]


@pytest.mark.parametrize(("cell", "figures", "fails"), MISSES,
                         ids=[f"{c}-{f}-{i}" for i, (c, _, f) in enumerate(MISSES)])
def test_each_target_fails_alone_when_its_figure_misses(
        cell: str, figures: Mapping[str, Figure], fails: str) -> None:
    report = targets_report(cells(**{cell: figures}))
    assert [r.check.figure for r in report.failures] == [fails]
    (table,) = report.tables
    assert [row[-1] for row in table.rows].count(False) == 1


def test_a_cell_that_did_not_run_has_no_rows() -> None:
    report = targets_report(Cells(setup=part("", SETUP)))
    (table,) = report.tables
    assert [row[1] for row in table.rows] == ["setup_ms_gateway", "setup_ms_engine"]
    assert table.caption.startswith("2 of 2 targets met")


def test_a_set_up_row_names_the_grpc_floor_measured_beside_it() -> None:
    with_floor = {**SETUP, "floor_ms_engine": 0.49, "floor_ms_gateway": 0.72}
    rows = {row[1]: row for row in targets_report(Cells(setup=part("", with_floor))).tables[0].rows}
    assert str(rows["setup_ms_engine"][0]).endswith("(bare gRPC floor 0.49)")
    assert str(rows["setup_ms_gateway"][0]).endswith("(bare gRPC floor 0.72)")
    plain = {row[1]: row for row in targets_report(Cells(setup=part("", SETUP))).tables[0].rows}
    assert "floor" not in str(plain["setup_ms_engine"][0])  # none measured: none claimed


def test_the_paced_row_judges_a_running_token_not_its_share_of_set_ups() -> None:
    # 100-token streams: over the whole cell each token also carries a hundredth
    # of its stream's set-up (its own row); the paced row prices a running token.
    heavy_set_ups = {**PACED, "us_per_token_gateway": 120.0}  # whole cell: 250
    report = targets_report(cells(paced=heavy_set_ups))
    assert report.figures["paced_lab_us_per_token"] == 250.0
    assert not report.failures, report.explain()


def test_a_paced_cell_without_a_steady_window_fails_its_row() -> None:
    # A stream that never had its first token leaves no window: not measured, not met.
    no_window = {k: v for k, v in PACED.items() if not k.startswith("us_per_running_token")}
    report = targets_report(cells(paced={**no_window, "running_tokens": None}))
    assert [r.check.figure for r in report.failures] == ["paced_lab_us_per_running_token"]
