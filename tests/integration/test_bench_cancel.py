from __future__ import annotations

import json
import subprocess
import sys

import pytest

from streamlab.target import LabTarget

pytestmark = pytest.mark.integration


def test_bench_cancel_reports_every_abandoned_stream_cancelled(lab: LabTarget) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "streamlab.cli", "bench", "cancel", "--run-dir", str(lab.run_dir),
         "--streams", "20", "--concurrency", "5", "--json"],
        capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    figures = json.loads(out.stdout)
    assert figures["streams"] == figures["cancelled"] == 20
    assert figures["still_running"] == 0
    assert figures["tokens_after_cancel"] <= 20  # at most one decode step each
    assert 0 <= figures["cancel_latency_p50_ms"] <= figures["cancel_latency_p99_ms"] < 2000
