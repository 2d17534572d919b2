"""`streamlab bench memory` end to end, as a user runs it (the CLI in its own
process; it starts its own gateway and engine), at small N on both wires with
`--trace`: every stream completes, each wire's RSS per stream is a number, and
the traced table names allocations (the snapshots were taken in the gateway,
not in the bench). Figures printed, never asserted as targets (tests/unit
judges the 40 KiB target)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from streamlab.lab.topology import REPO_ROOT

# Four gateway runs of 15 s streams (one traced): about a minute, so `make test-slow`.
pytestmark = [pytest.mark.integration, pytest.mark.slow]
STREAMS = 40


def test_bench_memory_measures_and_traces_each_wire() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "streamlab.cli", "bench", "memory", "--concurrency", str(STREAMS),
         "--trace", "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT, check=False)
    # Exit 0 whether or not the target held: a figure to read.
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    print(json.dumps(report["tables"], indent=1))
    figures = report["figures"]
    for wire in ("per_request", "multiplexed"):
        assert figures[f"{wire}_completed"] == STREAMS
        assert figures[f"{wire}_held"] >= STREAMS * 0.9
        assert figures[f"{wire}_kib_per_stream"] > 0
        assert figures[f"{wire}_traced_kib_per_stream"] > 0
    traced = {table["title"]: table["rows"] for table in report["tables"]}
    assert traced["traced-per_request"], "no traced allocations for the per_request wire"
    # The gateway's own code is among what a stream holds (its lease, its response).
    assert any("services/gateway/" in row[0] for row in traced["traced-multiplexed"]
               ) or any("services/gateway/" in row[0] for row in traced["traced-per_request"])
