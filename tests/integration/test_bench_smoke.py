"""`streamlab bench transports` and `streamlab bench relay` run end to end on the
real lab, as a user runs them (the CLI, in its own process, attached to the
lab's run dir), at tiny N: figures are printed by the benches, never asserted
as speed targets here. What is checked is the report's shape and that its
figures are possible at all.

In a child process also because the benches drive grpc.aio on event loops of
their own, which must not share a process with the other tests' loops.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from streamlab.experiments.bench.tables import relay_rows, target_rows, transport_rows

from streamlab.lab.local import Lab
from streamlab.lab.topology import REPO_ROOT

pytestmark = pytest.mark.integration

TOKENS = 5


def bench(lab: Lab, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "streamlab.cli", "bench", *args, "--run-dir", str(lab.run_dir),
         "--json"],
        capture_output=True, text=True, timeout=180, cwd=REPO_ROOT, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_bench_transports_report_is_complete_and_sane(lab: Lab, tmp_path: Path) -> None:
    if lab.pids is None:
        pytest.skip("measures the engine's and gateway's CPU by host pid; on the compose "
                    "target they run in containers (STREAMLAB_TARGET=compose)")
    png = tmp_path / "transports.png"
    report = bench(lab, "transports", "--reps", "1", "--tokens", str(TOKENS), "--gap-ms", "20",
                   "--intervals", "50", "--plot", str(png))

    names = [t["name"] for t in report["transports"]]
    assert names == ["grpc", "sse", "sse h1 tls", "sse h2", "curl h1", "curl h2", "websocket",
                     "long poll", "poll 50 ms"]
    assert report["repetitions"] == 1
    assert len(report["model_token_times_ms"]) == TOKENS
    for t in report["transports"]:
        (run,) = t["runs"]
        assert run["done"], (t["name"], run["error"])
        assert run["in_order"], t["name"]
        assert run["tokens"] == TOKENS
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
    # The TLS rows are measured on the edge-h2 hop, and nginx's workers did work.
    wires = {t["name"]: t["wire_proxy"] for t in report["transports"]}
    assert wires["sse h2"] == wires["curl h2"] == wires["sse h1 tls"] == "edge-h2"
    assert wires["sse"] == wires["curl h1"] == "edge"
    assert by_name["sse h2"]["nginx_cpu_ms"] > 0
    assert len(transport_rows(report)) == len(names)
    assert png.read_bytes().startswith(b"\x89PNG")


def test_bench_relay_report_covers_every_path_and_target(lab: Lab) -> None:
    if lab.pids is None:
        pytest.skip("measures the engine's and gateway's CPU by host pid; on the compose "
                    "target they run in containers (STREAMLAB_TARGET=compose)")
    report = bench(lab, "relay", "--concurrency", "1,4", "--streams-c1", "2",
                   "--tokens", str(TOKENS), "--gap-ms", "20", "--load-streams", "4",
                   "--load-gap-ms", "10", "--load-tokens", "5")

    cells = report["cells"]
    paths = ("grpc", "grpc via hop", "gateway", "via nginx", "full chain", "floor", "naive")
    assert [(c["path"], c["concurrency"]) for c in cells] == [
        (p, c) for c in (1, 4) for p in paths] + [("full chain", 4)]
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


def test_bench_slow_readers_shows_the_detached_relay_generating_for_nobody(
    lab: Lab, tmp_path: Path
) -> None:
    if lab.pids is None:
        pytest.skip("reads the gateway's RSS by host pid; on the compose target it runs in "
                    "a container (STREAMLAB_TARGET=compose)")
    png = tmp_path / "readers.png"
    clients, tokens = 3, 6000  # the engine pauses near 2,500 for a silent reader
    report = bench(lab, "slow-readers", "--clients", str(clients), "--tokens", str(tokens),
                   "--timeout-s", "60", "--plot", str(png))

    direct, detached = report["runs"]
    assert (direct["relay"], detached["relay"]) == ("direct", "detached_unbounded")
    for run in report["runs"]:
        assert not run["timed_out"], run["relay"]
        assert sum(run["states"].values()) == clients
        assert run["samples"], run["relay"]
    # Paused by flow control, then cut by the send timeout: short of the end.
    assert direct["states"] == {"cancelled": clients}
    assert direct["tokens_generated"] < clients * tokens
    # Nobody read a byte, and the engine wrote every answer in full anyway.
    assert detached["states"] == {"completed": clients}
    assert detached["tokens_generated"] == clients * tokens
    assert report["tokens_ratio"] > 1
    assert png.read_bytes().startswith(b"\x89PNG")
