"""`streamlab bench gpu` on the CPU with the tiny model: the command a GPU machine
runs, known to work before one is at hand (short: few tokens)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from streamlab.lab.topology import REPO_ROOT

pytestmark = pytest.mark.integration


def test_bench_gpu_reports_each_batch_size_on_the_cpu(tiny_model_dir: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "streamlab", "bench", "gpu", "--device", "cpu",
         "--model", str(tiny_model_dir),
         "--batches", "1,8,32", "--max-tokens", "8", "--cpu-threads", "1", "--json"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["figures"]["device"] == "cpu"
    assert report["figures"]["max_batch"] == 32
    assert report["as_expected"], report
    rows = {p["figures"]["batch"]: p["figures"] for p in report["parts"]}
    assert sorted(rows) == [1, 8, 32]
    for batch, row in rows.items():
        assert row["tokens"] == batch * 8
        assert row["tokens_per_s"] > 0
        assert row["model_step_ms"] > 0
        assert row["token_gap_ms"] > 0
        assert 1 <= row["rows_per_step"] <= batch
        assert 0 < row["ttft_ms_p50"] <= row["ttft_ms_max"]
        assert row["tokens_after_cancel_max"] <= 1
        assert row["not_cancelled"] == 0
        assert row["memory_kept"] is None  # on the CPU: not measured, not judged
        assert 0 <= row["cancel_seen_ms"] <= row["cancel_ended_ms"]
    # Batched: one forward pass served several sequences.
    assert rows[1]["mean_batch"] == 1.0
    assert rows[8]["mean_batch"] > 1.0
    assert rows[32]["mean_batch"] > rows[8]["mean_batch"]
    assert rows[8]["rows_per_step"] > 1.0
    (batches,) = report["tables"]
    assert [row[0] for row in batches["rows"]] == [1, 8, 32]
