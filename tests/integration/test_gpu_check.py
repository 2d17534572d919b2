"""scripts/gpu_check.py, smoke-tested on the CPU with the tiny model: the same
script a GPU machine runs, so it is known to work before one is at hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from streamlab.lab.topology import REPO_ROOT
from tests.integration.hf_fixtures import require_hf

pytestmark = pytest.mark.integration


def test_gpu_check_runs_on_the_cpu_and_reports_its_figures(tmp_path: Path) -> None:
    require_hf()
    out = tmp_path / "figures.json"
    run = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--size", "tiny",
         "--requests", "2", "--cancels", "2", "--cancel-after", "3", "--burst", "2",
         "--max-tokens", "16", "--cancel-max-tokens", "2000", "--json", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "checks  passed" in run.stdout
    figures = json.loads(out.read_text())
    assert figures["device"] == "cpu"
    assert [s["tokens"] for s in figures["full"]] == [16, 16]
    assert all(s["ttft_s"] > 0 and s["decode_tok_s"] > 0 for s in figures["full"])
    assert len(figures["cancels"]) == 2
    for sample in figures["cancels"]:
        assert sample["tokens_after_cancel"] <= 1
        assert sample["tokens_generated"] < 2000
        assert 0 <= sample["seen_ms"] <= sample["ended_ms"]
    assert figures["burst"]["requests"] == 2
