"""`streamlab scenario run ... --plot`: one scenario draws at the path, `all`
draws NAME.png per scenario into a directory and says which recorded nothing
(no lab: the runs are stand-ins for the runner's `run` that record arrivals as
a real measure does; the real thing is tests/integration/test_scenario_plot.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import streamlab.commands.exits as exits
import streamlab.commands.scenario as scenario_command
import streamlab.experiments.scenarios as scenarios
import streamlab.experiments.scenarios.runner as runner
from streamlab.cli import app
from streamlab.experiments.report import Report
from streamlab.experiments.scenarios import Measured, Scenario, Timing
from streamlab.experiments.scenarios.plot import Arrivals
from streamlab.lab.fake import FakeLab
from streamlab.lab.target import Capability
from streamlab.lab.watchdog import Probe, ToxiproxyWatchdog

RECORDS = {"resume", "idle-cut"}  # the stand-in measures that record arrivals


def install(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    async def fake_run(lab: Any, scenario: Scenario, mode: str, timing: Timing,
                       **_: Any) -> Report:
        timelines = ((Arrivals((0.1, 0.2), ((0.3, "cut"),)).timeline(),)
                     if scenario.name in RECORDS else ())
        artifacts = runner._write_timelines(Measured({}, timelines), f"{scenario.name}-{mode}",
                                            folder)
        return Report(scenario.name, mode, artifacts=artifacts)

    monkeypatch.setattr(exits, "attached", lambda run_dir: FakeLab(capabilities=Capability))
    monkeypatch.setattr(scenarios, "timing_for", lambda lab, **_: Timing())
    monkeypatch.setattr(runner, "run", fake_run)
    monkeypatch.setattr(scenario_command, "ToxiproxyWatchdog", lambda lab: ToxiproxyWatchdog(
        lab, probe_api=lambda url, timeout_s: Probe("ok")))


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, ["scenario", "run", *args], env={"COLUMNS": "200"})


def test_one_scenario_is_drawn_at_the_path(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    install(monkeypatch, tmp_path / "runs")
    result = invoke("resume", "--plot", str(tmp_path / "resume.png"))

    assert result.exit_code == 0, result.output
    assert (tmp_path / "resume.png").read_bytes()[:4] == b"\x89PNG"
    assert f"plot written to {tmp_path / 'resume.png'}" in result.output.replace("\n", "")


def test_all_draws_one_png_a_scenario_that_recorded_arrivals(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    install(monkeypatch, tmp_path / "runs")
    result = invoke("all", "--plot", str(tmp_path / "plots"))

    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "idle-cut.png", "resume.png"]
    assert "no plot for buffering" in result.output


def test_without_matplotlib_plot_is_a_usage_error_before_anything_runs(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    install(monkeypatch, tmp_path / "runs")
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: None if name == "matplotlib" else object())
    result = invoke("resume", "--plot", str(tmp_path / "resume.png"))

    assert result.exit_code == 2
    assert "needs matplotlib" in result.output
    assert not (tmp_path / "runs").exists()
