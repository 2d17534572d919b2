"""`streamlab bench scale` end to end on the real lab, as a user runs it (the CLI
in its own process, attached to the lab's run dir), every cell at small N:
the report's parts, cell c once per admission mode side by side, and the
targets table with a row per target of each cell that ran, its measured
figure the cell's own. Figures are printed, never asserted as speed targets
here (tests/unit/streamlab/experiments/bench/test_targets.py judges them)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from streamlab.lab.local import Lab
from streamlab.lab.topology import REPO_ROOT

# Every cell of the bench at small N: minutes on 2 cores, so `make test-slow`.
pytestmark = [pytest.mark.integration, pytest.mark.slow]

SLOW, STORM, BACKGROUND = 40, 20, 20


def test_bench_scale_runs_every_cell_and_judges_each_target(lab: Lab) -> None:
    if lab.pids is None:
        pytest.skip("reads each process's CPU by host pid and restarts services; on the "
                    "compose target they run in containers (STREAMLAB_TARGET=compose)")
    done = subprocess.run(
        [sys.executable, "-m", "streamlab.cli", "bench", "scale", "--run-dir",
         str(lab.run_dir), "--sweep", "10", "--tokens", "10", "--clocks", "batched",
         "--setup-streams", "30", "--slow-streams", str(SLOW), "--slow-tokens", "5",
         "--slow-ramp-s", "3", "--admission", "off,on", "--admission-rate", "100",
         "--storm-streams", str(STORM), "--cancel-background", str(BACKGROUND),
         "--cancel-streams", "10", "--json"],
        capture_output=True, text=True, timeout=420, cwd=REPO_ROOT, check=False)
    # Exit 0 whether or not the targets held: they are figures to read.
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    parts = {part["variant"] or part["experiment"]: part for part in report["parts"]}
    assert list(parts) == ["bench setup", "cadence", "slow", "storm", "bench cancel",
                           "targets"]

    slow = parts["slow"]
    assert [p["variant"] for p in slow["parts"]] == ["slow, admission off",
                                                    "slow, admission on"]
    admission = next(t for t in slow["tables"] if t["title"] == "admission")
    print(json.dumps(admission, indent=1))
    assert [row[:2] for row in admission["rows"]] == [["off", None], ["on", 100.0]]
    for mode in slow["parts"]:
        figures = mode["figures"]
        assert figures["completed"] + figures["failed"] == SLOW
        # The fake model's first token comes a gap after the head: a 3 s ramp
        # sees the first streams' second and third tokens.
        assert "ramp_token_late_ms_p99" in figures
    # The report's own figures are the protected mode's.
    assert slow["figures"]["admission"] == "on"

    targets = parts["targets"]
    (table,) = targets["tables"]
    print(json.dumps(table, indent=1))
    assert table["columns"] == ["target", "figure", "measured", "bound", "met"]
    rows = {row[1]: row for row in table["rows"]}
    # No 100-stream cadence cell in this sweep: no paced rows; every other cell's.
    assert set(rows) == {
        "setup_ms_gateway", "setup_ms_engine", "slow_completed", "slow_ttft_ms_p99",
        "slow_heartbeat_late_ms_p99", "slow_gateway_kib_per_stream", "storm_lost",
        "storm_next_token_s", "storm_complete_exactly_once", "storm_duplicates",
        "cancel_per_request_cancel_latency_p99_ms",
        "cancel_multiplexed_cancel_latency_p99_ms"}
    assert rows["setup_ms_gateway"][2] == parts["bench setup"]["figures"]["setup_ms_gateway"]
    assert rows["slow_completed"][2] == slow["figures"]["completed"]
    assert rows["storm_next_token_s"][2] == parts["storm"]["figures"]["next_token_s"]
    assert parts["storm"]["figures"]["streams"] == STORM
    cancel = parts["bench cancel"]["figures"]
    assert cancel["per_request_background_streams"] == BACKGROUND
    assert rows["cancel_multiplexed_cancel_latency_p99_ms"][2] == cancel[
        "multiplexed_cancel_latency_p99_ms"]
    checks = {(c["figure"], c["check"]): c["holds"] for c in targets["checks"]}
    assert [row[-1] for row in table["rows"]] == [
        checks[(row[1], f"{row[1]} {row[3]}")] for row in table["rows"]]
