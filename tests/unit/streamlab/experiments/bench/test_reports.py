"""Each bench's measurements become the one Report (no lab: hand-made cells and
runs): its targets judged by the one judge, a row and a part per cell, and a
plot drawn from the report alone (as `--plot` draws it)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from streamlab.experiments.bench import plot as plots
from streamlab.experiments.bench.cancel import AbandonReport
from streamlab.experiments.bench.load import LoadResult
from streamlab.experiments.bench.relay import Cell, RelayPath, RelayRun
from streamlab.experiments.bench.relay import report as relay_report
from streamlab.experiments.bench.scale import ScaleCell, cadence_report
from streamlab.experiments.bench.scale_slow import SlowCell
from streamlab.experiments.bench.slow_readers import ReadersRun, readers_report
from streamlab.experiments.bench.transports import (
    BENCH_TIMING,
    Sample,
    TransportResult,
    TransportsRun,
)
from streamlab.experiments.bench.transports import report as transports_report
from streamlab.experiments.report import Report
from streamlab.experiments.timing import Timing

TIMING = Timing(prefill_ms=1, gap_ms=50, tokens=20)
CHAIN = RelayPath("full chain", "sse", "http://edge", "gateway")
LOAD = (CHAIN, 100, 20, 100)


def cell(path: str, concurrency: int, ttft_p50: float, server: str = "gateway",
         cpu_ms: float | None = 100.0, gap_ms: int = 50, icl_p50: float = 50.0,
         icl_p99: float = 55.0) -> Cell:
    return Cell(path, concurrency, streams=concurrency, gap_ms=gap_ms, completed=concurrency,
                ttft_ms={"p50": ttft_p50, "p90": ttft_p50 + 1, "p99": ttft_p50 + 2},
                icl_ms={"p50": icl_p50, "p90": icl_p99 - 1, "p99": icl_p99}, tokens=1000,
                server=server, server_cpu_ms=None if server == "engine" else cpu_ms,
                engine_cpu_ms=50.0, client_cpu_ms=80.0)


def relay_cells(added_ms: float = 2.0, icl_p99: float = 25.0) -> list[Cell]:
    return [cell("grpc", 1, 51.0, server="engine"), cell("full chain", 1, 51.0 + added_ms),
            cell("gateway", 4, 52.0, cpu_ms=200.0), cell("floor", 4, 52.0, "floor", 100.0),
            cell("naive", 4, 53.0, "naive", 500.0),
            cell("full chain", 100, 30.0, gap_ms=20, icl_p50=20.0, icl_p99=icl_p99)]


def test_relay_targets_are_checks_judged_on_the_measured_figures() -> None:
    report = relay_report(RelayRun(TIMING, relay_cells()), [1, 4], LOAD)
    assert report.figures["ttft_added_ms"] == 2.0
    assert report.figures["gateway_cpu_vs_floor"] == 2.0
    assert report.figures["naive_cpu_vs_gateway"] == 2.5
    assert [c.check.figure for c in report.checks] == [
        "ttft_added_ms", "gateway_cpu_vs_floor", "naive_cpu_vs_gateway", "load_icl_p50_ms",
        "load_icl_p50_ms", "load_icl_p99_ms"]
    assert report.as_expected
    (table,) = report.tables
    assert len(table.rows) == len(report.parts) == 6
    assert table.rows[-1][0] == "full chain @ 20 ms"
    assert report.parts[0].figures["server_cpu_per_1k_tokens_ms"] is None  # gRPC: no relay


def test_relay_targets_missed_fail_and_targets_not_run_are_not_judged() -> None:
    missed = relay_report(RelayRun(TIMING, relay_cells(added_ms=5.0, icl_p99=40.0)), [1, 4],
                          LOAD)
    assert {c.check.figure for c in missed.failures} == {"ttft_added_ms", "load_icl_p99_ms"}
    assert missed.as_json()["verdict"] == "UNEXPECTED"
    # `--paths gateway,floor --load-streams 0`: only the CPU ratio can be judged.
    only = relay_report(RelayRun(TIMING, relay_cells()[2:4]), [1, 4], None)
    assert [c.check.figure for c in only.checks] == ["gateway_cpu_vs_floor"]


def test_load_figures_are_flat_and_name_their_errors() -> None:
    result = LoadResult(streams=10, completed=8, errors={"timeout": 1, "HTTP 503": 1},
                        tokens=80, ttft_ms={"p50": 5.0}, icl_ms={"p50": 20.0, "p99": 25.0},
                        client_cpu_ms=40.0)
    figures = result.figures()
    assert figures["failed"] == 2
    assert figures["errors"] == "HTTP 503: 1, timeout: 1"
    assert (figures["ttft_ms_p50"], figures["icl_ms_p99"]) == (5.0, 25.0)
    assert figures["client_us_per_token"] == 500.0
    assert "heartbeats" not in figures


def test_cancel_fails_on_a_cancel_that_never_arrived_or_a_background_stream_lost() -> None:
    ok = AbandonReport(streams=3, cancelled=3, still_running=0, latencies_ms=[5.0, 6.0, 9.0])
    assert ok.report(gap_ms=20).as_expected
    assert ok.report(gap_ms=20).figures["cancel_latency_p50_ms"] == 6.0
    lost = AbandonReport(streams=3, cancelled=2, still_running=1, latencies_ms=[5.0, 6.0])
    assert {c.check.figure for c in lost.report(20).failures} == {"cancelled",
                                                                  "still_running"}
    ok.background = LoadResult(streams=5, completed=4, errors={"closed": 1})
    beside = ok.report(20)
    assert [c.check.figure for c in beside.failures] == ["background_completed"]
    assert beside.figures["background_errors"] == "closed: 1"


def scale_cell(clock: str, streams: int, p99: float) -> ScaleCell:
    load = LoadResult(streams=streams, completed=streams, tokens=streams * 100,
                      ttft_ms={"p50": 12.0, "p99": 30.0},
                      icl_ms={"p50": 20.0, "p90": p99 - 2, "p99": p99}, client_cpu_ms=100.0)
    cpu = {"engine": 50.0, "gateway": 200.0, "nginx": None, "client": 100.0}
    # The steady window: half the tokens, for less than half the CPU (no set-ups in it).
    running = {"engine": 20.0, "gateway": 80.0, "nginx": None, "client": 40.0}
    return ScaleCell(clock, streams, load, cpu, (1.5, 1.0, 0.5),
                     mean_batch=streams if clock == "batched" else None,
                     running_cpu_ms=running, running_tokens=streams * 50, running_s=0.9)


def scale_report() -> Report:
    cells = [scale_cell("batched", 10, 22.0), scale_cell("per_stream", 10, 24.0),
             scale_cell("batched", 50, 28.0), scale_cell("per_stream", 50, 45.0)]
    return cadence_report(cells, {"per_stream": 50}, 100, 20, (10, 50), ("batched",
                                                                         "per_stream"), "edge")


def test_scale_cells_are_judged_on_cadence_and_the_break_points_are_figures() -> None:
    report = scale_report()
    assert (report.figures["break_point_batched"], report.figures["break_point_per_stream"]
            ) == (None, 50)
    assert [p.as_expected for p in report.parts] == [True, True, True, False]
    assert [c.check.figure for c in report.failures] == ["icl_ms_p99"]
    (table,) = report.tables
    # µs per token over the processes that were read: the whole cell, and the
    # steady window's (every stream running) beside it.
    totals = [row[-2:] for row in table.rows]
    assert totals == [(350, 280), (350, 280), (70, 56), (70, 56)]
    assert report.parts[0].figures["us_per_running_token_gateway"] == 160.0
    assert report.parts[0].figures["running_tokens"] == 500


def test_a_scale_cell_without_a_steady_window_has_no_running_figures() -> None:
    cell = scale_cell("batched", 10, 22.0)
    cell.running_cpu_ms, cell.running_tokens, cell.running_s = {}, None, None
    assert cell.row()[-1] is None
    assert cell.figures()["running_tokens"] is None
    assert not any(k.startswith("us_per_running_token_") for k in cell.figures())


def slow_cell(streams: int, completed: int, late_p99: float,
              ttft_p99: float = 400.0) -> SlowCell:
    load = LoadResult(streams=streams, completed=completed, tokens=completed * 20,
                      ttft_ms={"p50": 20.0, "p99": ttft_p99},
                      heartbeats=streams * 4,
                      heartbeat_late_ms={"p50": 5.0, "p90": 50.0, "p99": late_p99})
    mib = 2**20
    return SlowCell(streams, 20, load, gateway_rss_before=100 * mib, gateway_fds_before=10,
                    peak_rss={"gateway": 100 * mib + streams * 20 * 1024},
                    peak_fds={"gateway": 10 + streams, "nginx": 2 * streams},
                    cpu_ms={"gateway": 500.0})


def test_the_slow_cell_is_judged_on_its_bounds() -> None:
    good = slow_cell(1000, 1000, 300.0).report()
    assert good.figures["gateway_kib_per_stream"] == 20.0
    assert good.as_expected, good.explain()
    bad = slow_cell(1000, 990, 600.0, ttft_p99=1200.0).report()
    assert {c.check.figure for c in bad.failures} == {"completed", "heartbeat_late_ms_p99",
                                                      "ttft_ms_p99"}
    (processes,) = bad.tables
    assert processes.rows[0][:2] == ("gateway", 1010)


def readers(relay: str, growth: float, tokens: int) -> ReadersRun:
    run = ReadersRun(relay, clients=3, answer_tokens=1000, base_rss_mb=50.0,
                     peak_rss_mb=50.0 + growth, tokens_generated=tokens,
                     states=Counter({"cancelled": 3}), seconds=4.0)
    run.samples = [(0.0, 50.0, 0), (1.0, 50.0 + growth, tokens)]
    return run


def transports_run() -> TransportsRun:
    timing = BENCH_TIMING
    times = [t * 1000 + 2 for t in timing.model_token_times_s()]

    def sample(ttft: float) -> Sample:
        return Sample(ttft_ms=ttft, total_ms=times[-1], requests=1, tokens=timing.tokens,
                      bytes_up=500, bytes_down=9000, gateway_cpu_ms=20.0, engine_cpu_ms=5.0,
                      token_times_ms=times, done=True, error=None, in_order=True)

    results = [TransportResult("sse", "edge", [sample(60.0), sample(64.0)]),
               TransportResult("grpc", "engine", [sample(52.0), sample(53.0)])]
    return TransportsRun(timing, 2, results)


def test_transports_rows_show_the_median_and_half_the_range() -> None:
    report = transports_report(transports_run())
    costs = next(t for t in report.tables if t.title == "transports")
    assert costs.rows[0][:3] == ("sse", 62.0, 2.0)
    assert [p.variant for p in report.parts] == ["sse", "grpc"]
    assert len(report.parts[0].parts) == 2  # a part per run
    arrivals = next(t for t in report.tables if t.title == "arrivals")
    assert len(arrivals.rows) == 3 * BENCH_TIMING.tokens  # the model's lane and two more


@pytest.mark.parametrize("make", [
    lambda: transports_report(transports_run()),
    lambda: readers_report([readers("direct", 2.0, 600),
                            readers("detached_unbounded", 30.0, 3000)], 3, 1000),
    lambda: Report("bench scale", parts=(scale_report(), slow_cell(100, 100, 10.0).report())),
])
def test_each_plot_is_drawn_from_the_report_and_listed_among_its_artifacts(
        make: object, tmp_path: Path) -> None:
    assert callable(make)
    report = plots.plot(make(), tmp_path / "bench.png")
    assert report.artifacts
    for artifact in report.artifacts:
        assert Path(artifact.path).read_bytes().startswith(b"\x89PNG")
    assert report.as_json()["artifacts"]


def test_a_report_without_a_plot_says_so() -> None:
    with pytest.raises(ValueError, match="no plot"):
        plots.plot(Report("bench load"), Path("unused.png"))
