"""`streamlab bench transports` and `streamlab bench relay` run end to end on the
real lab, as a user runs them (the CLI, in its own process, attached to the
lab's run dir), at tiny N: figures are printed by the benches, never asserted
as speed targets here. What is checked is the report's shape (the one Report's
JSON: figures, checks, tables, parts, artifacts) and that its figures are
possible at all.

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


def table(report: dict[str, Any], title: str) -> list[dict[str, Any]]:
    """A table of the report's JSON as rows keyed by column."""
    found = next(t for t in report["tables"] if t["title"] == title)
    return [dict(zip(found["columns"], row, strict=True)) for row in found["rows"]]


def test_bench_transports_report_is_complete_and_sane(lab: Lab, tmp_path: Path) -> None:
    if lab.pids is None:
        pytest.skip("measures the engine's and gateway's CPU by host pid; on the compose "
                    "target they run in containers (STREAMLAB_TARGET=compose)")
    png = tmp_path / "transports.png"
    report = bench(lab, "transports", "--repeat", "1", "--tokens", str(TOKENS), "--gap-ms", "20",
                   "--intervals", "50", "--plot", str(png))

    transports = {p["variant"]: p for p in report["parts"]}
    names = list(transports)
    assert names == ["grpc", "sse", "sse h1 tls", "sse h2", "curl h1", "curl h2", "websocket",
                     "long poll", "poll 50 ms"]
    assert report["figures"]["repetitions"] == 1
    arrivals = table(report, "arrivals")
    model_ms = [row["ms"] for row in arrivals if row["lane"] == "model"]
    assert len(model_ms) == TOKENS
    by_name = {}
    for name, t in transports.items():
        (run_part,) = t["parts"]
        run = run_part["figures"]
        by_name[name] = run
        assert run["done"], (name, run["error"])
        assert run["in_order"], name
        assert run["tokens"] == TOKENS
        # The first token cannot beat the model, and the run ends after the last one.
        assert run["ttft_ms"] >= model_ms[0] * 0.9
        assert run["total_ms"] >= model_ms[-1] * 0.9
        assert run["bytes_down"] > 0
        assert run["bytes_up"] > 0
        assert run["engine_cpu_ms"] > 0
        assert t["figures"]["ttft_ms_median"] == run["ttft_ms"]
        # The median run's arrivals are the plot's lane.
        assert len([row for row in arrivals if row["lane"] == name]) == TOKENS
    assert by_name["sse"]["requests"] == by_name["websocket"]["requests"] == 1
    assert by_name["poll 50 ms"]["requests"] >= 2  # the start, then at least one poll
    assert by_name["sse"]["gateway_cpu_ms"] > 0
    # The TLS rows are measured on the edge-h2 hop, and nginx's workers did work.
    wires = {name: t["figures"]["wire_proxy"] for name, t in transports.items()}
    assert wires["sse h2"] == wires["curl h2"] == wires["sse h1 tls"] == "edge-h2"
    assert wires["sse"] == wires["curl h1"] == "edge"
    assert by_name["sse h2"]["nginx_cpu_ms"] > 0
    assert [row["transport"] for row in table(report, "transports")] == names
    assert [a["path"] for a in report["artifacts"]] == [str(png)]
    assert png.read_bytes().startswith(b"\x89PNG")


def test_bench_relay_report_covers_every_path_and_target(lab: Lab) -> None:
    if lab.pids is None:
        pytest.skip("measures the engine's and gateway's CPU by host pid; on the compose "
                    "target they run in containers (STREAMLAB_TARGET=compose)")
    report = bench(lab, "relay", "--concurrency", "1,4", "--streams-c1", "2",
                   "--tokens", str(TOKENS), "--gap-ms", "20", "--load-streams", "4",
                   "--load-gap-ms", "10", "--load-tokens", "5")

    cells = [part["figures"] for part in report["parts"]]
    paths = ("grpc", "grpc via hop", "gateway", "via nginx", "full chain", "floor", "naive")
    assert [(c["path"], c["concurrency"]) for c in cells] == [
        (p, c) for c in (1, 4) for p in paths] + [("full chain", 4)]
    for cell in cells:
        assert cell["completed"] == cell["streams"], (cell["path"], cell["errors"])
        assert cell["ttft_ms_p50"] > 0
        assert cell["icl_ms_p50"] > 0
        if cell["server"] != "engine":
            assert cell["server_cpu_per_1k_tokens_ms"] > 0
    # Every target judged: measured, the check, whether it was met (not asserted here).
    assert [c["figure"] for c in report["checks"]] == [
        "ttft_added_ms", "gateway_cpu_vs_floor", "naive_cpu_vs_gateway", "load_icl_p50_ms",
        "load_icl_p50_ms", "load_icl_p99_ms"]
    for check in report["checks"]:
        assert check["measured"] == report["figures"][check["figure"]]
        assert isinstance(check["holds"], bool)
    assert len(table(report, "cells")) == len(cells)


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

    direct, detached = (part["figures"] for part in report["parts"])
    assert (direct["relay"], detached["relay"]) == ("direct", "detached_unbounded")
    samples = table(report, "samples")
    for run in (direct, detached):
        assert not run["timed_out"], run["relay"]
        assert sum(v for k, v in run.items() if k.startswith("engine_")) == clients
        assert [s for s in samples if s["relay"] == run["relay"]], run["relay"]
    # Paused by flow control, then cut by the send timeout: short of the end.
    assert direct["engine_cancelled"] == clients
    assert direct["tokens_generated"] < clients * tokens
    # Nobody read a byte, and the engine wrote every answer in full anyway.
    assert detached["engine_completed"] == clients
    assert "engine_cancelled" not in detached
    assert detached["tokens_generated"] == clients * tokens
    assert report["figures"]["tokens_ratio"] > 1
    assert png.read_bytes().startswith(b"\x89PNG")
