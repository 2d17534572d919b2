"""The runner's own logic, on a stand-in lab that only records what the
runner asks of Toxiproxy (the real lab runs in tests/integration/test_scenarios.py):
one Report per mode, the other mode's checks beside its own, a measure's
timelines as files, toxics reset on every exit path, and run_plan's policy."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamlab.experiments.report import Check, Figures
from streamlab.experiments.scenarios import (
    Measured,
    Scenario,
    ScenarioUnavailable,
    Setup,
    TargetUnreachable,
    Timeline,
    Timing,
    Variant,
    run,
    run_plan,
)
from streamlab.experiments.scenarios.runner import Plan
from streamlab.lab.toxiproxy import Toxic, ToxiproxyError

pytestmark = pytest.mark.anyio
TIMING = Timing()
SLOW = Toxic("latency", {"latency": 600, "jitter": 0}, "downstream")


class RecordingToxiproxy:
    def __init__(self, calls: list[str], answers: bool) -> None:
        self.calls, self.answers = calls, answers

    def reset(self) -> None:
        if not self.answers:
            raise ToxiproxyError(0, "connection refused")
        self.calls.append("reset")

    def add_toxic(self, hop: str, toxic: Toxic) -> None:
        self.calls.append(f"add {toxic.type} {hop}")


class StandInLab:
    def __init__(self, run_dir: Path, *, answers: bool = True) -> None:
        self.run_dir = run_dir
        self.calls: list[str] = []
        self.answers = answers

    @contextlib.contextmanager
    def toxiproxy(self) -> Iterator[RecordingToxiproxy]:
        yield RecordingToxiproxy(self.calls, self.answers)

    def hops_of(self, kind: str) -> tuple[str, ...]:
        return (kind, f"{kind}-2")  # two replicas of every hop


def scenario(measure: Any) -> Scenario:
    return Scenario(
        name="toy", summary="a toy", measure=measure,
        broken=Variant(Setup(toxics=(("edge", SLOW),)), (Check("ttft_s", ">=", 0.6),), "slow"),
        fixed=Variant(Setup(), (Check("ttft_s", "<", 0.6),), "plain"))


def read_json(path: str) -> Any:
    return json.loads(Path(path).read_text())


async def ttft(lab: Any, setup: Setup, timing: Timing) -> Figures:
    lab.calls.append("measure")
    return {"ttft_s": 0.7 if setup.toxics else 0.1}


async def test_a_mode_is_one_report_judged_by_its_checks_and_the_other_mode_s(
        tmp_path: Path) -> None:
    lab = StandInLab(tmp_path)
    report = await run(lab, scenario(ttft), "broken", TIMING)  # type: ignore[arg-type]

    assert (report.experiment, report.variant, report.story) == ("toy", "broken", "slow")
    assert report.figures == {"ttft_s": 0.7}
    assert [(c.description, c.holds) for c in report.checks] == [("ttft_s >= 0.6", True)]
    assert [(c.description, c.holds) for c in report.other_checks] == [("ttft_s < 0.6", False)]
    assert (report.verdict, report.discriminates) == ("broke as expected", True)
    # The toxic on every hop of its kind, between two resets.
    assert lab.calls == ["reset", "add latency edge", "add latency edge-2", "measure", "reset"]


async def test_figures_both_modes_accept_do_not_discriminate(tmp_path: Path) -> None:
    async def always(lab: Any, setup: Setup, timing: Timing) -> Figures:
        return {"ttft_s": 0.6}

    lax = Scenario(name="lax", summary="", measure=always,
                   broken=Variant(Setup(), (Check("ttft_s", ">=", 0.5),), ""),
                   fixed=Variant(Setup(), (Check("ttft_s", "<=", 0.7),), ""))
    report = await run(StandInLab(tmp_path), lax, "fixed", TIMING)  # type: ignore[arg-type]

    assert report.as_expected
    assert not report.discriminates


async def test_a_measure_s_timelines_become_files_and_artifacts(tmp_path: Path) -> None:
    async def with_timeline(lab: Any, setup: Setup, timing: Timing) -> Measured:
        return Measured({"ttft_s": 0.1}, (Timeline("attempts", "every attempt",
                                                    {"attempts": [[0.5, "200"]]}),))

    lab = StandInLab(tmp_path)
    report = await run(lab, scenario(with_timeline), "fixed", TIMING)  # type: ignore[arg-type]

    [artifact] = report.artifacts
    assert (artifact.kind, artifact.title) == ("timeline", "every attempt")
    assert Path(artifact.path) == tmp_path / "scenarios" / "toy-fixed-attempts.json"
    assert read_json(artifact.path) == {"attempts": [[0.5, "200"]]}
    assert report.figures == {"ttft_s": 0.1}


async def test_a_crashing_measure_still_leaves_toxiproxy_reset(tmp_path: Path) -> None:
    async def crash(lab: Any, setup: Setup, timing: Timing) -> Figures:
        raise TimeoutError("no answer")

    lab = StandInLab(tmp_path)
    with pytest.raises(TimeoutError):
        await run(lab, scenario(crash), "broken", TIMING)  # type: ignore[arg-type]
    assert lab.calls[-1] == "reset"


async def test_run_plan_skips_errors_and_judges_in_the_plan_s_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake_run(lab: Any, chosen: Scenario, mode: str, timing: Timing,
                       **_: Any) -> Any:
        if chosen.name == "seventh-tab":
            raise ScenarioUnavailable("no chromium")
        if (chosen.name, mode) == ("idle-cut", "fixed"):
            raise RuntimeError("the client broke")
        return await run(lab, scenario(ttft), mode, timing)  # type: ignore[arg-type]

    import streamlab.experiments.scenarios.runner as runner

    monkeypatch.setattr(runner, "run", fake_run)
    order = (("seventh-tab", "broken"), ("idle-cut", "broken"), ("idle-cut", "fixed"))
    seen: list[str] = []
    report = await run_plan(StandInLab(tmp_path), Plan(7, (order,)), TIMING,  # type: ignore[arg-type]
                            on_report=lambda repeat, r: seen.append(r.status))

    [repeat] = report.parts
    assert [(r.status, r.reason) for r in repeat.parts] == [
        ("skipped", "no chromium"), ("ran", ""), ("error", "RuntimeError: the client broke")]
    assert seen == ["skipped", "ran", "error"]
    assert report.figures == {"seed": 7, "runs": 3, "as_expected": 1, "unexpected": 1,
                              "skipped": 1}
    assert not report.as_expected


async def test_run_plan_stops_when_toxiproxy_does_not_answer(tmp_path: Path) -> None:
    order = (("idle-cut", "broken"), ("idle-cut", "fixed"))
    with pytest.raises(TargetUnreachable, match="unreachable"):
        await run_plan(StandInLab(tmp_path, answers=False), Plan(None, (order,)),  # type: ignore[arg-type]
                       TIMING)
