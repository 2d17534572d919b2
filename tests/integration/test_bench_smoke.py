"""The benchmarks run end to end on the real lab (tiny N: figures are printed
by `streamlab bench`, never asserted as speed targets here). What is checked
is the report's shape and that its figures are possible at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from streamlab.bench.plot import plot_transports
from streamlab.bench.relay import lab_paths, reference_servers, run_relay
from streamlab.bench.tables import relay_rows, target_rows, transport_rows
from streamlab.bench.transports import Targets, Timing, run_transports
from streamlab.lab import Lab

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TINY = Timing(prefill_ms=1, token_gap_ms=20, answer_tokens=5)


async def test_bench_transports_report_is_complete_and_sane(lab: Lab, tmp_path: Path) -> None:
    report = (await anyio.to_thread.run_sync(
        lambda: run_transports(Targets.of(lab), TINY, 1, [50]))).as_json()

    names = [t["name"] for t in report["transports"]]
    assert names == ["grpc", "sse", "websocket", "long poll", "poll 50 ms"]
    assert report["repetitions"] == 1
    assert len(report["model_token_times_ms"]) == TINY.answer_tokens
    for t in report["transports"]:
        (run,) = t["runs"]
        assert run["done"], (t["name"], run["error"])
        assert run["in_order"], t["name"]
        assert run["tokens"] == TINY.answer_tokens
        # The first token cannot beat the model, and the run ends after the last one.
        assert run["ttft_ms"] >= report["model_token_times_ms"][0] * 0.9
        assert run["total_ms"] >= report["model_token_times_ms"][-1] * 0.9
        assert run["bytes_down"] > 0
        assert run["bytes_up"] > 0
        assert run["engine_cpu_ms"] > 0
        assert t["summary"]["ttft_ms"]["median"] == run["ttft_ms"]
    by_name = {t["name"]: t["runs"][0] for t in report["transports"]}
    assert by_name["sse"]["requests"] == by_name["websocket"]["requests"] == 1
    assert by_name["poll 50 ms"]["requests"] >= 2  # the start, then at least one poll
    assert by_name["sse"]["gateway_cpu_ms"] > 0
    assert len(transport_rows(report)) == len(names)

    png = tmp_path / "transports.png"
    plot_transports(report, png)
    assert png.read_bytes().startswith(b"\x89PNG")


async def test_bench_relay_report_covers_every_path_and_target(lab: Lab) -> None:
    def run() -> dict[str, Any]:
        with reference_servers(Targets.of(lab).engine_hop, lab.run_dir / "logs") as refs:
            paths, pids = lab_paths(lab, refs)
            load = (next(p for p in paths if p.name == "full chain"), 4, 10, 5)
            return run_relay(paths, pids, TINY, [1, 4], 2, load).as_json()

    report = await anyio.to_thread.run_sync(run)

    cells = report["cells"]
    assert isinstance(cells, list)
    assert [(c["path"], c["concurrency"]) for c in cells] == [
        (p, c) for c in (1, 4)
        for p in ("grpc", "grpc via hop", "gateway", "via nginx", "full chain", "floor", "naive")
    ] + [("full chain", 4)]
    for cell in cells:
        assert cell["completed"] == cell["streams"], (cell["path"], cell["errors"])
        assert cell["ttft_ms"]["p50"] > 0
        assert cell["icl_ms"]["p50"] > 0
        if cell["server"] != "engine":
            assert cell["server_cpu_per_1k_tokens_ms"] > 0
    assert {t["target"].split(" ")[0] for t in report["targets"]} >= {
        "full", "gateway", "naive", "inter-chunk"}
    assert len(relay_rows(report)) == len(cells)
    assert len(target_rows(report)) == len(report["targets"])
