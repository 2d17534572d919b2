"""`streamlab scenario run all --shuffle`: the order printed, every pair run, a
summary at the end, and the exit status (no lab: the runs are stand-ins)."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

import streamlab.commands.scenario as scenario_command
import streamlab.experiments.scenarios as scenarios
from streamlab.cli import app
from streamlab.experiments.report import CheckResult
from streamlab.experiments.scenarios import CATALOGUE, MODES, Check, Outcome, Scenario, Timing
from streamlab.experiments.scenarios.runner import plan_runs

RUNS = len(CATALOGUE) * len(MODES)


def install(monkeypatch: pytest.MonkeyPatch, wrong: tuple[str, str] | None = None,
            crash: tuple[str, str] | None = None) -> list[tuple[str, str]]:
    ran: list[tuple[str, str]] = []

    async def fake_run(lab: Any, scenario: Scenario, mode: str, timing: Timing) -> Outcome:
        ran.append((scenario.name, mode))
        if (scenario.name, mode) == crash:
            raise TimeoutError("the browser did not answer")
        holds = (scenario.name, mode) != wrong
        return Outcome(scenario.name, mode, "story", {},  # type: ignore[arg-type]
                       checks=[CheckResult(Check("done", "==", True), "done", holds, holds)])

    monkeypatch.setattr(scenario_command, "attached", lambda run_dir: object())
    monkeypatch.setattr(scenarios, "timing_for", lambda lab, **_: Timing())
    monkeypatch.setattr(scenarios, "run", fake_run)
    return ran


def run_all(*args: str) -> Any:
    return CliRunner().invoke(app, ["scenario", "run", "all", "--shuffle", *args],
                              env={"COLUMNS": "200"})


def test_every_pair_runs_in_the_printed_seed_s_order_and_the_summary_counts_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ran = install(monkeypatch)
    result = run_all("--repeat", "2", "--seed", "42")

    assert result.exit_code == 0, result.output
    assert "--seed 42" in result.output
    plan = plan_runs(list(CATALOGUE), MODES, repeat=2, shuffle=True, seed=42)
    assert ran == [pair for order in plan.rounds for pair in order]
    assert f"{2 * RUNS} as expected, 0 unexpected, 0 skipped, of {2 * RUNS} runs" in result.output


def test_one_wrong_verdict_exits_1_and_the_summary_names_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, wrong=("idle-cut", "fixed"))
    result = run_all("--seed", "1")

    assert result.exit_code == 1
    assert f"{RUNS - 1} as expected, 1 unexpected" in result.output


def test_a_measure_that_raises_is_an_error_row_and_the_others_still_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ran = install(monkeypatch, crash=("seventh-tab", "broken"))
    result = run_all("--seed", "1")

    assert result.exit_code == 1
    assert len(ran) == RUNS
    assert "ERROR" in result.output
    assert "the browser did not answer" in result.output
    assert f"{RUNS - 1} as expected, 1 unexpected" in result.output
