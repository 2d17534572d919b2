"""`streamlab scenario run`: the order printed, every pair run, a summary at the
end, and the exit status, 0 / 1 / 2 / 3 (no lab: the runs are stand-ins for
the runner's `run`; the policy around them, run_plan's, is the real one)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import streamlab.commands.exits as exits
import streamlab.commands.scenario as scenario_command
import streamlab.experiments.scenarios as scenarios
import streamlab.experiments.scenarios.runner as runner
from streamlab.cli import app
from streamlab.experiments.report import Figures, Report, judge
from streamlab.experiments.scenarios import (
    MODES,
    Check,
    Scenario,
    ScenarioUnavailable,
    Timing,
    names,
    plan_runs,
)
from streamlab.lab.fake import FakeLab
from streamlab.lab.target import Capability
from streamlab.lab.toxiproxy import ToxiproxyError
from streamlab.lab.watchdog import Probe, ToxiproxyWatchdog

RUNS = len(names()) * len(MODES)
DONE = (Check("done", "==", True),)


def install(monkeypatch: pytest.MonkeyPatch, wrong: tuple[str, str] | None = None,
            crash: tuple[str, str] | None = None, unavailable: str | None = None,
            unreachable: bool = False) -> list[tuple[str, str]]:
    ran: list[tuple[str, str]] = []

    async def fake_run(lab: Any, scenario: Scenario, mode: str, timing: Timing,
                       **_: Any) -> Report:
        ran.append((scenario.name, mode))
        if unreachable:
            raise ToxiproxyError(0, "connection refused")
        if (scenario.name, mode) == crash:
            raise TimeoutError("the browser did not answer")
        if scenario.name == unavailable:
            raise ScenarioUnavailable("no chromium on this machine")
        figures: Figures = {"done": (scenario.name, mode) != wrong}
        return Report(scenario.name, mode, "story", figures, judge(DONE, figures, timing))

    # A lab with every capability: each scenario's needs are met, so every pair runs.
    monkeypatch.setattr(exits, "attached",
                        lambda run_dir: FakeLab(capabilities=Capability))
    monkeypatch.setattr(scenarios, "timing_for", lambda lab, **_: Timing())
    monkeypatch.setattr(runner, "run", fake_run)
    # The fake lab can restart services, so the command gives it the Toxiproxy
    # watchdog; its probes would dial the fake's never-resolving host and find
    # every process down. Here both answer: what a Toxiproxy failure does to the
    # plan is this module's subject, not the watchdog's (test_run_plan.py's).
    monkeypatch.setattr(scenario_command, "ToxiproxyWatchdog", lambda lab: ToxiproxyWatchdog(
        lab, probe_api=lambda url, timeout_s: Probe("ok")))
    return ran


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, ["scenario", "run", *args], env={"COLUMNS": "200"})


def run_all(*args: str) -> Any:
    return invoke("all", "--shuffle", *args)


def test_every_pair_runs_in_the_printed_seed_s_order_and_the_summary_counts_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ran = install(monkeypatch)
    result = run_all("--repeat", "2", "--seed", "42")

    assert result.exit_code == 0, result.output
    assert "--seed 42" in result.output
    plan = plan_runs(list(names()), MODES, repeat=2, shuffle=True, seed=42)
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


def test_one_scenario_crashing_is_an_error_report_and_exit_1(
        monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, crash=("idle-cut", "fixed"))
    result = invoke("idle-cut", "--json")

    assert result.exit_code == 1, result.output
    runs = json.loads(result.output)["parts"][0]["parts"]
    assert [(r["variant"], r["status"]) for r in runs] == [("broken", "ran"), ("fixed", "error")]
    assert runs[1]["reason"] == "TimeoutError: the browser did not answer"


def test_a_scenario_this_machine_cannot_run_is_skipped_with_its_reason_not_wrong(
        monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, unavailable="seventh-tab")
    result = invoke("seventh-tab")

    assert result.exit_code == 0, result.output
    assert "skipped" in result.output
    assert "no chromium on this machine" in result.output


def test_the_json_is_one_report_whose_parts_are_each_mode_s_report(
        monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, wrong=("buffering", "broken"))
    result = invoke("buffering", "--json")

    assert result.exit_code == 1
    report = json.loads(result.output)
    assert (report["experiment"], report["as_expected"]) == ("scenarios", False)
    runs = report["parts"][0]["parts"]
    assert [(r["experiment"], r["variant"], r["verdict"]) for r in runs] == [
        ("buffering", "broken", "UNEXPECTED"), ("buffering", "fixed", "works as expected")]
    # A lab that can restart services runs with the watchdog, which counts its restarts.
    assert report["figures"] == {"seed": None, "runs": 2, "as_expected": 1, "unexpected": 1,
                                 "skipped": 0, "toxiproxy_restarts": 0}


def test_an_unknown_scenario_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch)
    result = invoke("no-such-scenario")

    assert result.exit_code == 2
    assert "no scenario 'no-such-scenario'" in result.output


def test_a_toxiproxy_that_does_not_answer_stops_the_run_with_exit_3(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ran = install(monkeypatch, unreachable=True)
    result = run_all("--seed", "1")

    assert result.exit_code == 3
    assert len(ran) == 1  # nothing after it could run either
    assert "is the lab up?" in result.output


def test_no_lab_to_attach_to_exits_3(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch)

    def no_lab(run_dir: Any) -> Any:
        raise typer.Exit(1)  # as attached() does, having said why

    monkeypatch.setattr(exits, "attached", no_lab)
    assert invoke("idle-cut").exit_code == 3


def test_the_exit_codes_are_in_the_help() -> None:
    result = invoke("--help")

    assert result.exit_code == 0
    assert "3 the target is unreachable" in " ".join(result.output.split())


def test_a_single_scenario_says_each_mode_s_start_and_end_as_it_goes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, wrong=("idle-cut", "fixed"))
    lines = invoke("idle-cut").output.splitlines()

    said = [line for line in lines if line.startswith("[")]
    assert said[0] == "[1/2] idle-cut broken ..."
    assert re.fullmatch(r"\[1/2\] idle-cut broken \.\.\. broke as expected \(\d+ s\)", said[1])
    assert said[2] == "[2/2] idle-cut fixed ..."
    assert re.fullmatch(r"\[2/2\] idle-cut fixed \.\.\. UNEXPECTED \(\d+ s\)", said[3])
    # Each end line comes before the table of both modes, not after it.
    assert lines.index(said[3]) < next(i for i, line in enumerate(lines) if "idle-cut:" in line)
