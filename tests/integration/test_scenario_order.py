"""Scenarios in any order: one scenario's faults must not break the next one.

The order that once broke: `engine-reset` resets the engine hop, so the
gateway's channel goes down and reconnects; `latency-engine --broken` then puts
600 ms on that hop. A connect deadline shorter than the handshake across the
slow hop left the gateway unable to reach the engine ("failed to connect to all
addresses; ... connection attempt timed out", a 503), every time.
"""

from __future__ import annotations

import pytest

from streamlab.experiments.scenarios import Mode, run_plan, timing_for
from streamlab.experiments.scenarios.runner import Plan
from streamlab.lab.target import LabTarget

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TOLERANCE_S = 0.5


async def test_latency_on_the_engine_hop_after_an_engine_reset(lab: LabTarget) -> None:
    timing = timing_for(lab, tolerance_s=TOLERANCE_S)
    # The order, as `scenario run --seed` would replay it: one repeat, three runs.
    order: tuple[tuple[str, Mode], ...] = (
        ("engine-reset", "broken"), ("engine-reset", "fixed"), ("latency-engine", "broken"))
    report = await run_plan(lab, Plan(seed=None, rounds=(order,)), timing)

    runs = [run for repeat in report.parts for run in repeat.parts]
    assert [(run.experiment, run.variant, run.status) for run in runs] == [
        (name, mode, "ran") for name, mode in order]
    assert report.as_expected, report.explain()
