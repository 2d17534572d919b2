"""The arrivals plot's data: what a measure records, how it travels through the
runner (a timeline file, not the report's JSON), and what the plot reads back
of a plan's report. Against FakeLab: no processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamlab.experiments.report import Check, Report
from streamlab.experiments.scenarios import (
    Measured,
    Scenario,
    Setup,
    Timing,
    Variant,
    plan_runs,
    run,
)
from streamlab.experiments.scenarios import plot as plots
from streamlab.experiments.scenarios.plot import ArrivalClock, Arrivals
from streamlab.lab.fake import FakeLab
from streamlab.lab.local import LabOptions
from streamlab.lab.target import LabTarget

pytestmark = pytest.mark.anyio

# broken: three tokens, then the cut; fixed: cut, restore, and the rest.
RECORDED = {
    "broken": Arrivals((0.1, 0.2, 0.3), ((0.35, "cut"),)),
    "fixed": Arrivals((0.1, 0.2, 0.3, 0.55, 0.6), ((0.35, "cut"), (0.45, "restore"))),
}


async def recorded(lab: LabTarget, setup: Setup, timing: Timing) -> Measured:
    mode = str(setup.knobs["mode"])
    return Measured({"tokens": len(RECORDED[mode].tokens)}, (RECORDED[mode].timeline(),))


def toy(measure: object = recorded) -> Scenario:
    return Scenario(
        name="toy", summary="a toy", measure=measure,  # type: ignore[arg-type]
        broken=Variant(Setup(knobs={"mode": "broken"}), (Check("tokens", "<", 5),), "cut"),
        fixed=Variant(Setup(knobs={"mode": "fixed"}), (Check("tokens", "==", 5),), "resumed"))


async def test_arrivals_travel_as_a_timeline_file_and_read_back_whole(tmp_path: Path) -> None:
    lab = FakeLab(LabOptions(run_dir=tmp_path))
    report = await run(lab, toy(), "fixed", Timing())

    [artifact] = report.artifacts
    assert artifact.path.endswith("toy-fixed-arrivals.json")
    # The report's JSON names the file; the arrivals themselves are not in it.
    assert "0.55" not in json.dumps(report.as_json())
    assert plots.arrivals_of(report) == RECORDED["fixed"]


async def test_lanes_are_broken_above_fixed_each_mode_s_last_run(tmp_path: Path) -> None:
    lab = FakeLab(LabOptions(run_dir=tmp_path))
    plan = plan_runs(["toy"], ["fixed", "broken"], repeat=2)
    rounds = []
    for order in plan.rounds:
        rounds.append(Report("scenarios", parts=tuple(
            [await run(lab, toy(), mode, Timing()) for _, mode in order])))
    # A skipped run records nothing and is not a lane.
    rounds.append(Report("scenarios", parts=(Report("toy", "fixed", status="skipped"),)))
    lanes = plots.lanes(Report("scenarios", parts=tuple(rounds)), "toy")

    assert [mode for mode, _ in lanes] == ["broken", "fixed"]
    assert dict(lanes) == RECORDED
    assert plots.lanes(Report("scenarios", parts=tuple(rounds)), "other") == []


async def test_a_measure_without_arrivals_has_no_lane(tmp_path: Path) -> None:
    async def figures_only(lab: LabTarget, setup: Setup, timing: Timing) -> dict[str, int]:
        return {"tokens": 5}

    report = await run(FakeLab(LabOptions(run_dir=tmp_path)), toy(figures_only), "fixed",
                       Timing())
    assert plots.arrivals_of(report) is None
    assert plots.lanes(report, "toy") == []


def test_the_clock_times_tokens_and_events_from_the_request() -> None:
    clock = ArrivalClock(started=0.0)
    clock.now = lambda: 2.0  # type: ignore[method-assign]
    clock.token(7, "text")  # any client's on_token arguments
    clock.event("restore")
    clock.event("cut", ago_s=0.5)  # learnt of after the retry wait: placed before
    clock.event("cancel", ago_s=5.0)  # never before the request

    assert clock.arrivals() == Arrivals((2.0,), ((0.0, "cancel"), (1.5, "cut"), (2.0, "restore")))


def test_timed_tokens_keep_the_events_that_happened_in_order() -> None:
    cut = plots.from_token_times([0.1, 0.2], [(1.2, "cancel"), (None, "error"), (0.9, "leave")])
    whole = plots.from_token_times([0.1, 0.2])

    assert Arrivals.from_json(cut.data) == Arrivals((0.1, 0.2), ((0.9, "leave"),
                                                                 (1.2, "cancel")))
    assert Arrivals.from_json(whole.data) == Arrivals((0.1, 0.2), ())


@pytest.mark.parametrize("data", [
    [0.1], {"tokens": "0.1"}, {"tokens": [True]}, {"events": [{"at_s": 1}]},
    {"events": [{"at_s": "1", "kind": "cut"}]},
])
def test_a_timeline_of_another_shape_is_refused(data: object) -> None:
    with pytest.raises(ValueError, match="arrivals"):
        Arrivals.from_json(data)  # type: ignore[arg-type]


def test_the_plot_is_a_png_with_a_row_per_mode(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = plots.draw("toy", list(RECORDED.items()), tmp_path / "toy.png")

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    one_row = plots.draw("toy", [("fixed", RECORDED["fixed"])], tmp_path / "one.png")
    assert path.stat().st_size > one_row.stat().st_size  # the second row was drawn
    with pytest.raises(ValueError, match="no run recorded"):
        plots.draw("toy", [], tmp_path / "none.png")
