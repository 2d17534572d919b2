"""Runs scenarios against a lab that is up, and judges them: one Report per run.

    run(lab, scenario, mode, timing) -> Report      one mode, judged
    run_plan(lab, plan, timing) -> Report           a plan's runs, with the policy:
                                                    skipped / error / target unreachable
    last_run(folder, name) -> LastRun | None        what `scenario show NAME --last` reads:
                                                    each mode's last report and streams
    needs_of(scenario) -> frozenset[Capability]     what a run of it asks of the target

The runner owns the toxics: it resets Toxiproxy, applies the mode's toxics,
measures, and resets again on every exit path, so a failed run leaves the lab
clean. A mode's report is *as expected* when all of its checks hold; it
*discriminates* when the other mode's checks (its `other_checks`) fail on the
same figures, which is what proves a check would catch the thing it is about.
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, TypedDict

from streamlab.experiments.report import JSON, Artifact, Figures, Report, judge
from streamlab.experiments.scenarios import registry
from streamlab.experiments.scenarios.model import (
    MODES,
    Measured,
    Mode,
    Scenario,
    ScenarioUnavailable,
    noting_streams,
)
from streamlab.experiments.timing import Timing
from streamlab.lab.target import (
    Capability,
    LabTarget,
    MissingCapability,
    TargetUnreachable,
    require,
)
from streamlab.lab.toxiproxy import ToxiproxyError
from streamlab.lab.watchdog import ToxiproxyWatchdog


@dataclass(frozen=True)
class Plan:
    """The runs of `scenario run ... --repeat N [--shuffle] [--seed S]`: one list
    of (scenario, mode) per repeat. Shuffled, each repeat has its own order,
    drawn from one seed, so an order that failed can be replayed with --seed."""

    seed: int | None  # None: not shuffled (catalogue order, broken before fixed)
    rounds: tuple[tuple[tuple[str, Mode], ...], ...]


def plan_runs(names: Sequence[str], modes: Sequence[Mode], *, repeat: int = 1,
              shuffle: bool = False, seed: int | None = None) -> Plan:
    """Every (scenario, mode) pair once per repeat; with `shuffle`, in an order of
    its own per repeat (modes of one scenario are shuffled apart too: a mode
    must not depend on the other having run first). A seed is drawn when none
    is given, and returned so it can be printed."""
    if repeat < 1:
        raise ValueError("repeat must be at least 1")
    pairs = [(name, mode) for name in names for mode in modes]
    if not shuffle:
        return Plan(None, tuple(tuple(pairs) for _ in range(repeat)))
    if seed is None:
        seed = secrets.randbelow(2**32)
    rng = random.Random(seed)
    rounds = []
    for _ in range(repeat):
        order = list(pairs)
        rng.shuffle(order)
        rounds.append(tuple(order))
    return Plan(seed, tuple(rounds))


def timing_for(lab: LabTarget, **overrides: Any) -> Timing:
    """The default timing, with the idle timeout the lab's nginx really has and a
    think pause twice as long, and the gateway's keepalive as the lab sets it
    (unless overridden)."""
    idle = lab.options.nginx.short_read_timeout_s
    # The lab's own overrides on top of this shell's STREAMLAB_* (which the
    # services started from it inherit), on top of the defaults.
    gateway = lab.options.gateway_settings()
    engine = lab.options.engine_settings()
    timing = replace(Timing(), idle_timeout_s=idle, think_s=2 * idle,
                     engine_dead_after_s=gateway.engine_keepalive_s
                     + gateway.engine_keepalive_timeout_s,
                     gateway_dead_after_s=engine.keepalive_s + engine.keepalive_timeout_s)
    return replace(timing, **{k: v for k, v in overrides.items() if v is not None})


# What every run asks of the target whatever the scenario: the runner resets
# Toxiproxy's hops before and after each one, so a leftover toxic cannot
# carry over into the next run.
RUNNER_NEEDS = frozenset({Capability.TOGGLE_HOPS})


def needs_of(scenario: Scenario) -> frozenset[Capability]:
    """The capabilities a run of `scenario` needs: its own and the runner's."""
    return scenario.needs | RUNNER_NEEDS


def artifacts_dir(lab: LabTarget) -> Path:
    """Where a run's timelines go: beside the lab's logs."""
    return lab.run_dir / "scenarios"


async def run(lab: LabTarget, scenario: Scenario, mode: Mode, timing: Timing, *,
              out_dir: Path | None = None) -> Report:
    """One mode of one scenario, judged: its own checks, and the other mode's on
    the same figures. Timelines the measure recorded are written under `out_dir`
    (default: artifacts_dir(lab)) and listed as the report's artifacts.
    MissingCapability, before Toxiproxy is touched, when the target lacks what
    the scenario needs (needs_of)."""
    require(lab, needs_of(scenario), f"scenario {scenario.name}")
    variant = scenario.variant(mode)
    other: Mode = MODES[1] if mode == MODES[0] else MODES[0]
    folder = out_dir or artifacts_dir(lab)
    with lab.toxiproxy() as toxiproxy, noting_streams() as noted:
        toxiproxy.reset()
        try:
            for hop, toxic in variant.setup.toxics:
                # Every hop of the kind: with replicas, a stream may use any of them.
                for each in lab.hops_of(hop):
                    toxiproxy.add_toxic(each, toxic)
            measured = await scenario.measure(lab, variant.setup, timing)
        except ScenarioUnavailable as exc:
            remember(lab, not_run(scenario.name, mode, "skipped", str(exc)), noted)
            raise
        except Exception as exc:  # the plan's policy makes it an error: the streams stay named
            remember(lab, not_run(scenario.name, mode, "error",
                                  f"{type(exc).__name__}: {exc}"[:200]), noted)
            raise
        finally:
            toxiproxy.reset()
    if not isinstance(measured, Measured):
        measured = Measured(measured)
    figures: Figures = dict(measured.figures)
    streams = _streams_of(figures, noted)
    if streams and streams != [figures.get("request_id")]:
        figures["request_ids"] = ",".join(streams)
    report = Report(
        experiment=scenario.name, variant=mode, story=variant.story, figures=figures,
        checks=judge(variant.expect, figures, timing),
        other_checks=judge(scenario.variant(other).expect, figures, timing),
        artifacts=_write_timelines(measured, f"{scenario.name}-{mode}", folder),
    )
    remember(lab, report, streams)
    return report


def _streams_of(figures: Figures, noted: Sequence[str]) -> list[str]:
    """The streams a run judged: the measure's `request_id` figure, then those
    it noted (note_stream), each once."""
    first = figures.get("request_id")
    return list(dict.fromkeys([*([first] if isinstance(first, str) and first else []),
                               *noted]))


LAST = "last"  # <artifacts dir>/last/<scenario>.json: each mode's last run


class ModeRun(TypedDict):
    """One mode's last run, as `scenario show NAME --last` reads it."""

    ran_unix: float
    status: str  # ran | skipped | error
    verdict: str
    as_expected: bool
    reason: str
    traced: bool  # the lab was up with --tracing: `streamlab trace ID` can draw them
    request_ids: list[str]  # the streams it judged (the X-Request-Id each was sent with)
    report: JSON  # Report.as_json()


class LastRun(TypedDict):
    scenario: str
    run_dir: str
    modes: dict[str, ModeRun]


def remember(lab: LabTarget, report: Report, streams: Sequence[str]) -> None:
    """Keep `report` as its scenario's last run of its mode, with the streams it
    judged (what `scenario show NAME --last` lists, each with the `streamlab
    trace ID` that opens it), under the lab's artifacts_dir whatever a run's
    `out_dir`. Only beside a lab's run dir that exists (a FakeLab has none); a
    file that cannot be written costs the run nothing."""
    if not Path(lab.run_dir).is_dir():
        return
    folder = artifacts_dir(lab)
    path = folder / LAST / f"{report.experiment}.json"
    try:
        previous = last_run(folder, report.experiment)
        modes = dict(previous["modes"]) if previous is not None else {}
        options = getattr(lab, "options", None)
        modes[report.variant] = ModeRun(
            ran_unix=time.time(), status=report.status,
            verdict=report.verdict if report.status == "ran" else report.status,
            as_expected=report.as_expected, reason=report.reason,
            traced=bool(getattr(options, "tracing", False)),
            request_ids=list(streams), report=report.as_json())
        kept = LastRun(scenario=report.experiment, run_dir=str(lab.run_dir), modes=modes)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(kept, indent=1))
    except (OSError, ValueError):
        return


def last_run(folder: Path, name: str) -> LastRun | None:
    """The last run of each mode of scenario `name` kept under `folder` (a lab's
    artifacts_dir), or None when none was (or the file is not one)."""
    path = folder / LAST / f"{name}.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("modes"), dict):
        return None
    kept: LastRun = doc  # type: ignore[assignment]  # written by remember() above
    return kept


def _write_timelines(measured: Measured, stem: str, folder: Path) -> tuple[Artifact, ...]:
    artifacts = []
    for timeline in measured.timelines:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{stem}-{timeline.name}.json"
        path.write_text(json.dumps(timeline.data))
        artifacts.append(Artifact("timeline", str(path), timeline.title))
    return tuple(artifacts)


def not_run(scenario: str, mode: Mode, status: Literal["skipped", "error"], reason: str
            ) -> Report:
    return Report(experiment=scenario, variant=mode, status=status, reason=reason)


async def run_plan(lab: LabTarget, plan: Plan, timing: Timing, *,
                   on_start: Callable[[int, str, Mode], None] | None = None,
                   on_report: Callable[[int, Report], None] | None = None,
                   out_dir: Path | None = None,
                   watchdog: ToxiproxyWatchdog | None = None) -> Report:
    """Every run of the plan, in its order, as one report: its parts are the
    repeats (variant "repeat N"), and theirs each run's report.

    The policy, the same for one scenario as for all of them:
      - a scenario this lab or machine cannot run (a capability it needs that the
        target lacks, checked before Toxiproxy is touched; ScenarioUnavailable:
        no chromium, no HTTP/2 edge) is a part with status "skipped" and the
        reason: no verdict, and no wrong one;
      - a measure that crashes (a browser call that timed out, a client error)
        is a part with status "error" and the reason, which is a wrong verdict,
        and the rest of the plan still runs;
      - a lab that is not there (its Toxiproxy API does not answer) raises
        TargetUnreachable: nothing after it could run either (a Toxiproxy that
        answers but refuses an operation is that run's error).
      - with a `watchdog` (lab/watchdog.py), every Toxiproxy process is probed
        before each run and after a run that Toxiproxy failed: one that has
        wedged or died is restarted with its proxies and toxics, the run it
        broke is that run's error naming the restart, and the plan goes on
        (figure `toxiproxy_restarts`).
    `on_start(repeat, scenario, mode)` and `on_report(repeat, report)` let a
    caller show progress as the runs go."""
    rounds: list[Report] = []
    for number, order in enumerate(plan.rounds, 1):
        parts: list[Report] = []
        for name, mode in order:
            if on_start is not None:
                on_start(number, name, mode)
            if watchdog is not None:
                await asyncio.to_thread(watchdog.check)
            report = await _run_one(lab, registry.get(name), mode, timing, out_dir, watchdog)
            parts.append(report)
            if on_report is not None:
                on_report(number, report)
        rounds.append(Report(experiment="scenarios", variant=f"repeat {number}",
                             parts=tuple(parts)))
    runs = [p for r in rounds for p in r.parts]
    figures: Figures = {
        "seed": plan.seed, "runs": len(runs),
        "as_expected": sum(p.status == "ran" and p.as_expected for p in runs),
        "unexpected": sum(not p.as_expected for p in runs),
        "skipped": sum(p.status == "skipped" for p in runs),
    }
    if watchdog is not None:
        figures["toxiproxy_restarts"] = len(watchdog.restarts)
    story = f"{len(runs)} run{'' if len(runs) == 1 else 's'}" + (
        f", shuffled with --seed {plan.seed}" if plan.seed is not None else "")
    return Report(experiment="scenarios", story=story, figures=figures, parts=tuple(rounds))


async def _run_one(lab: LabTarget, scenario: Scenario, mode: Mode, timing: Timing,
                   out_dir: Path | None, watchdog: ToxiproxyWatchdog | None = None) -> Report:
    """One run under run_plan's policy (its docstring)."""
    try:
        # Declared needs first: a lab without them skips before Toxiproxy is touched.
        require(lab, needs_of(scenario), f"scenario {scenario.name}")
    except MissingCapability as exc:
        return not_run(scenario.name, mode, "skipped", str(exc))
    try:
        return await run(lab, scenario, mode, timing, out_dir=out_dir)
    except ToxiproxyError as exc:
        restarts = await asyncio.to_thread(watchdog.check) if watchdog is not None else []
        if restarts:  # it had wedged or died under this run: restarted, the plan goes on
            healed = "; ".join(r.describe() for r in restarts)
            return not_run(scenario.name, mode, "error", f"{str(exc)[:120]} ({healed})")
        if exc.status_code:  # it answered, and refused this run's toxic: its error
            return not_run(scenario.name, mode, "error", str(exc)[:200])
        raise TargetUnreachable(str(exc)) from exc
    except ScenarioUnavailable as exc:
        return not_run(scenario.name, mode, "skipped", str(exc))
    except Exception as exc:  # any crash is this run's error, not the plan's
        return not_run(scenario.name, mode, "error", f"{type(exc).__name__}: {exc}"[:200])
