"""run_plan's policy (skip, error, unreachable) and a mode's one Report, with
its timelines as artifacts, against FakeLab: no processes."""

from __future__ import annotations

import json
from dataclasses import replace
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
from streamlab.experiments.scenarios.model import Mode
from streamlab.experiments.scenarios.runner import Plan
from streamlab.lab.fake import FakeLab
from streamlab.lab.local import LabOptions
from streamlab.lab.target import Capability, LabTarget, MissingCapability
from streamlab.lab.toxiproxy import Toxic, ToxiproxyError
from streamlab.lab.watchdog import Probe, ToxiproxyWatchdog

pytestmark = pytest.mark.anyio
TIMING = Timing()
SLOW = Toxic("latency", {"latency": 600, "jitter": 0}, "downstream")


def fake_lab(run_dir: Path) -> FakeLab:
    """Two gateways: the upstream hop has two replicas, so a toxic must reach both."""
    return FakeLab(LabOptions(run_dir=run_dir, gateways=2))


def scenario(measure: Any) -> Scenario:
    return Scenario(
        name="toy", summary="a toy", measure=measure,
        broken=Variant(Setup(toxics=(("upstream", SLOW),)), (Check("ttft_s", ">=", 0.6),), "slow"),
        fixed=Variant(Setup(), (Check("ttft_s", "<", 0.6),), "plain"))


def read_json(path: str) -> Any:
    return json.loads(Path(path).read_text())


SEEN_DURING_MEASURE: list[dict[str, tuple[str, ...]]] = []


async def ttft(lab: LabTarget, setup: Setup, timing: Timing) -> Figures:
    with lab.toxiproxy() as toxiproxy:
        SEEN_DURING_MEASURE.append({hop: tuple(t["name"] for t in toxiproxy.toxics(hop))
                                    for hop in lab.hops_of("upstream")})
    return {"ttft_s": 0.7 if setup.toxics else 0.1}


async def test_a_mode_is_one_report_judged_by_its_checks_and_the_other_mode_s(
        tmp_path: Path) -> None:
    lab = fake_lab(tmp_path)
    SEEN_DURING_MEASURE.clear()
    report = await run(lab, scenario(ttft), "broken", TIMING)

    assert (report.experiment, report.variant, report.story) == ("toy", "broken", "slow")
    assert report.figures == {"ttft_s": 0.7}
    assert [(c.description, c.holds) for c in report.checks] == [("ttft_s >= 0.6", True)]
    assert [(c.description, c.holds) for c in report.other_checks] == [("ttft_s < 0.6", False)]
    assert (report.verdict, report.discriminates) == ("broke as expected", True)
    # The toxic on every hop of its kind while it measured, between two resets.
    assert [(c.op, c.hop) for c in lab.fake_toxiproxy.calls] == [
        ("reset", ""), ("add_toxic", "upstream"), ("add_toxic", "upstream-2"), ("reset", "")]
    [seen] = SEEN_DURING_MEASURE
    assert seen == {"upstream": ("latency_downstream",), "upstream-2": ("latency_downstream",)}
    assert lab.fake_toxiproxy.active() == {}


async def test_figures_both_modes_accept_do_not_discriminate(tmp_path: Path) -> None:
    async def always(lab: LabTarget, setup: Setup, timing: Timing) -> Figures:
        return {"ttft_s": 0.6}

    lax = Scenario(name="lax", summary="", measure=always,
                   broken=Variant(Setup(), (Check("ttft_s", ">=", 0.5),), ""),
                   fixed=Variant(Setup(), (Check("ttft_s", "<=", 0.7),), ""))
    report = await run(fake_lab(tmp_path), lax, "fixed", TIMING)

    assert report.as_expected
    assert not report.discriminates


async def test_a_measure_s_timelines_become_files_and_artifacts(tmp_path: Path) -> None:
    async def with_timeline(lab: LabTarget, setup: Setup, timing: Timing) -> Measured:
        return Measured({"ttft_s": 0.1}, (Timeline("attempts", "every attempt",
                                                    {"attempts": [[0.5, "200"]]}),))

    lab = fake_lab(tmp_path)
    report = await run(lab, scenario(with_timeline), "fixed", TIMING)

    [artifact] = report.artifacts
    assert (artifact.kind, artifact.title) == ("timeline", "every attempt")
    assert Path(artifact.path) == tmp_path / "scenarios" / "toy-fixed-attempts.json"
    assert read_json(artifact.path) == {"attempts": [[0.5, "200"]]}
    assert report.figures == {"ttft_s": 0.1}


async def test_a_crashing_measure_still_leaves_toxiproxy_reset(tmp_path: Path) -> None:
    async def crash(lab: LabTarget, setup: Setup, timing: Timing) -> Figures:
        raise TimeoutError("no answer")

    lab = fake_lab(tmp_path)
    with pytest.raises(TimeoutError):
        await run(lab, scenario(crash), "broken", TIMING)
    assert lab.fake_toxiproxy.ops()[-1] == "reset"
    assert lab.fake_toxiproxy.active() == {}


async def test_run_plan_skips_errors_and_judges_in_the_plan_s_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake_run(lab: Any, chosen: Scenario, mode: Mode, timing: Timing,
                       **_: Any) -> Any:
        if chosen.name == "seventh-tab":
            raise ScenarioUnavailable("no chromium")
        if (chosen.name, mode) == ("buffering", "fixed"):
            raise RuntimeError("the client broke")
        return await run(lab, scenario(ttft), mode, timing)

    import streamlab.experiments.scenarios.runner as runner

    monkeypatch.setattr(runner, "run", fake_run)
    order: tuple[tuple[str, Mode], ...] = (
        ("seventh-tab", "broken"), ("buffering", "broken"), ("buffering", "fixed"))
    seen: list[str] = []
    report = await run_plan(fake_lab(tmp_path), Plan(7, (order,)), TIMING,
                            on_report=lambda repeat, r: seen.append(r.status))

    [repeat] = report.parts
    assert [(r.status, r.reason) for r in repeat.parts] == [
        ("skipped", "no chromium"), ("ran", ""), ("error", "RuntimeError: the client broke")]
    assert seen == ["skipped", "ran", "error"]
    assert report.figures == {"seed": 7, "runs": 3, "as_expected": 1, "unexpected": 1,
                              "skipped": 1}
    assert not report.as_expected


async def test_run_plan_stops_when_toxiproxy_does_not_answer(tmp_path: Path) -> None:
    order: tuple[tuple[str, Mode], ...] = (("buffering", "broken"), ("buffering", "fixed"))
    lab = fake_lab(tmp_path)
    lab.fake_toxiproxy.answers = False
    with pytest.raises(TargetUnreachable, match="unreachable"):
        await run_plan(lab, Plan(None, (order,)), TIMING)


MEASURED: list[str] = []


async def reads_pids(lab: LabTarget, setup: Setup, timing: Timing) -> Figures:
    MEASURED.append("measured")
    return {"ttft_s": 0.7 if setup.toxics else 0.1}


def needing_pids(monkeypatch: pytest.MonkeyPatch) -> None:
    """A registered scenario that declares it reads pids (CPU, RSS)."""
    from streamlab.experiments.scenarios import registry

    toy = replace(scenario(reads_pids), needs=frozenset({Capability.PIDS}))
    monkeypatch.setattr(registry, "get", lambda name: toy)


async def test_run_plan_skips_a_scenario_whose_needs_the_lab_lacks_before_toxiproxy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    needing_pids(monkeypatch)
    MEASURED.clear()
    lab = fake_lab(tmp_path)
    assert Capability.PIDS not in lab.capabilities

    report = await run_plan(lab, Plan(None, ((("toy", "broken"),),)), TIMING)

    [[part]] = [r.parts for r in report.parts]
    assert part.status == "skipped"
    assert "scenario toy: needs the lab's pids" in part.reason
    assert report.figures["skipped"] == 1
    assert lab.fake_toxiproxy.calls == []  # not even a reset
    assert MEASURED == []


async def test_run_plan_runs_a_scenario_whose_needs_the_lab_has(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    needing_pids(monkeypatch)
    MEASURED.clear()
    lab = fake_lab(tmp_path)
    lab.capabilities = lab.capabilities | {Capability.PIDS}

    report = await run_plan(lab, Plan(None, ((("toy", "broken"),),)), TIMING)

    [[part]] = [r.parts for r in report.parts]
    assert (part.status, part.verdict) == ("ran", "broke as expected")
    assert MEASURED == ["measured"]
    assert lab.fake_toxiproxy.ops()[0] == "reset"


async def test_every_run_needs_hops_to_reset(tmp_path: Path) -> None:
    """The runner resets Toxiproxy around each run: a lab without hops to toggle
    cannot run even a scenario that declares nothing."""
    lab = FakeLab(LabOptions(run_dir=tmp_path), capabilities=())
    with pytest.raises(MissingCapability, match="toggle_hops"):
        await run(lab, scenario(ttft), "fixed", TIMING)
    assert lab.fake_toxiproxy.calls == []


async def test_a_toxiproxy_that_wedges_mid_plan_is_restarted_and_the_plan_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first run's Toxiproxy stops answering (as the upstream wedge does); the
    watchdog finds it wedged, restarts it, that run is an error naming the
    restart, and the second run still runs and is judged."""
    from streamlab.experiments.scenarios import registry

    health = {"now": "ok"}

    def probe_api(url: str, timeout_s: float) -> Probe:
        return Probe("wedged" if health["now"] == "wedged" else "ok")

    async def wedges_then_measures(lab: LabTarget, setup: Setup, timing: Timing) -> Figures:
        if not MEASURED:
            MEASURED.append("wedged")
            health["now"] = "wedged"
            raise ToxiproxyError(0, "ReadTimeout('timed out')")
        MEASURED.append("measured")
        return {"ttft_s": 0.7 if setup.toxics else 0.1}

    toy = scenario(wedges_then_measures)
    monkeypatch.setattr(registry, "get", lambda name: toy)
    MEASURED.clear()
    lab = fake_lab(tmp_path)
    watchdog = ToxiproxyWatchdog(lab, probe_api=probe_api)

    def start_service(name: str) -> None:
        lab.service_calls.append(("start", name))
        health["now"] = "ok"  # the process the watchdog started answers

    monkeypatch.setattr(lab, "start_service", start_service)
    report = await run_plan(lab, Plan(None, ((("toy", "broken"), ("toy", "broken")),)),
                            TIMING, watchdog=watchdog)

    [[first, second]] = [r.parts for r in report.parts]
    assert first.status == "error"
    assert "was wedged: restarted" in first.reason
    assert (second.status, second.as_expected) == ("ran", True)
    assert report.figures["toxiproxy_restarts"] == 1
    assert ("kill", "toxiproxy") in lab.service_calls
