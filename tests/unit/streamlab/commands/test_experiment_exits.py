"""`streamlab soak` and `streamlab bench ...` exit as `scenario run` does: 0 as
expected, 1 a verdict not as expected, 2 usage (a lab without a capability the
experiment needs among it), 3 target unreachable. The experiments are stand-ins
(no lab) except where the point is their own fail-fast capability check, which
runs for real against a FakeLab."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import streamlab.commands.exits as exits
import streamlab.commands.soak as soak_command
from streamlab.cli import app
from streamlab.experiments.bench import cancel as bench_cancel
from streamlab.experiments.bench import relay as bench_relay
from streamlab.experiments.report import Check, Figures, Report, judge
from streamlab.lab.fake import FakeLab
from streamlab.lab.target import Capability, MissingCapability
from streamlab.lab.toxiproxy import ToxiproxyError

DONE = (Check("done", "==", True),)


def verdict(holds: bool) -> Report:
    figures: Figures = {"done": holds}
    return Report("stand-in", figures=figures, checks=judge(DONE, figures))


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


@pytest.fixture
def lab(monkeypatch: pytest.MonkeyPatch) -> FakeLab:
    """The lab the commands attach to: a FakeLab (no pids, no logs)."""
    fake = FakeLab()
    monkeypatch.setattr(exits, "attached", lambda run_dir: fake)
    return fake


def soak_returns(monkeypatch: pytest.MonkeyPatch, outcome: Report | Exception) -> None:
    async def fake_soak(*args: Any, **kwargs: Any) -> Report:
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(soak_command, "soak_as_asked", fake_soak)


@pytest.mark.parametrize(("outcome", "code"), [
    (verdict(True), 0),
    (verdict(False), 1),
    (MissingCapability(Capability.PIDS, "the soak"), 2),
    (ToxiproxyError(0, "connection refused"), 3),
])
def test_soak_exit_status(lab: FakeLab, monkeypatch: pytest.MonkeyPatch,
                          outcome: Report | Exception, code: int) -> None:
    soak_returns(monkeypatch, outcome)
    result = invoke("soak", "--json")
    assert result.exit_code == code, result.output


def test_soak_with_an_unknown_broken_thing_is_usage(lab: FakeLab) -> None:
    assert invoke("soak", "--broken", "no-such-thing").exit_code == 2


def test_soak_without_a_lab_is_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_lab(run_dir: Any) -> Any:
        raise typer.Exit(1)  # as attached() does, having said why

    monkeypatch.setattr(exits, "attached", no_lab)
    assert invoke("soak").exit_code == 3
    assert invoke("bench", "cancel").exit_code == 3


def test_the_soak_fails_fast_on_a_lab_without_pids(lab: FakeLab) -> None:
    """The real soak: it names the capability and touches nothing first."""
    result = invoke("soak", "--streams", "1")
    assert result.exit_code == 2
    assert "needs the lab's pids" in result.output
    assert lab.fake_toxiproxy.calls == []


def test_the_soak_needs_restarts_only_to_kill_the_engine(lab: FakeLab) -> None:
    lab.capabilities = frozenset({Capability.PIDS, Capability.ENGINE_RECORD,
                                  Capability.TOGGLE_HOPS})
    result = invoke("soak", "--streams", "1", "--engine-kills", "2")
    assert result.exit_code == 2
    assert "restart_service" in result.output


@pytest.mark.parametrize(("holds", "code"), [(True, 0), (False, 1)])
def test_bench_cancel_exits_on_its_verdict(lab: FakeLab, monkeypatch: pytest.MonkeyPatch,
                                           holds: bool, code: int) -> None:
    monkeypatch.setattr(bench_cancel, "bench_cancel", lambda *a, **k: verdict(holds))
    assert invoke("bench", "cancel", "--json").exit_code == code


def test_bench_cancel_in_the_background_fails_fast_on_a_lab_without_restarts(
        lab: FakeLab) -> None:
    lab.capabilities = frozenset({Capability.ENGINE_RECORD})
    result = invoke("bench", "cancel", "--background", "5")
    assert result.exit_code == 2
    assert "bench cancel --background: needs the lab's" in result.output


def test_bench_slow_readers_fails_fast_on_a_lab_without_pids(lab: FakeLab) -> None:
    result = invoke("bench", "slow-readers")
    assert result.exit_code == 2
    assert "bench slow-readers: needs the lab's pids" in result.output


def test_bench_relay_shows_a_missed_target_and_exits_0(
        lab: FakeLab, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its checks are performance targets to read, not a verdict on the run."""
    monkeypatch.setattr(bench_relay, "bench_relay", lambda *a, **k: verdict(False))
    assert invoke("bench", "relay", "--json").exit_code == 0


def test_a_bench_whose_lab_stops_answering_is_unreachable(
        lab: FakeLab, monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(*args: Any, **kwargs: Any) -> Report:
        raise ToxiproxyError(0, "connection refused")

    monkeypatch.setattr(bench_cancel, "bench_cancel", unreachable)
    assert invoke("bench", "cancel").exit_code == 3


def test_a_refusing_toxiproxy_is_the_run_s_failure_not_an_unreachable_lab(
        lab: FakeLab, monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: Any, **kwargs: Any) -> Report:
        raise ToxiproxyError(409, "toxic already exists")

    monkeypatch.setattr(bench_cancel, "bench_cancel", refused)
    assert invoke("bench", "cancel").exit_code == 1


def test_help_documents_the_exit_status() -> None:
    for command in (["soak"], ["bench", "cancel"], ["bench", "relay"]):
        assert "Exit status: 0" in invoke(*command, "--help").output
