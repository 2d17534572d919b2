"""The chaos soak on the real topology, and its self-test: against each broken
thing it guards against, the soak's verdict fails, on the check named for it
(streamlab/experiments/soak_verdict.py SELF_TEST; docs/scenarios.md has a large run)."""

from __future__ import annotations

import pytest

from streamlab.experiments.soak import soak, soak_broken
from streamlab.experiments.soak_verdict import SELF_TEST, BrokenThing, failed, self_test_part
from streamlab.lab.target import LabTarget

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

# One cycle of the soak's behaviours (full ×2, think, resume, abandon, stall, poll).
CYCLE = 7


def _needs_pids(lab: LabTarget) -> None:
    if lab.pids is None:
        pytest.skip("measures the gateway process's RSS from the host by pid; the compose "
                    "lab's gateway runs in a container (STREAMLAB_TARGET=compose)")


async def test_small_chaos_soak_passes_every_check(lab: LabTarget) -> None:
    _needs_pids(lab)
    report = await soak(lab, streams=3 * CYCLE, concurrency=CYCLE, duration_s=60,
                        engine_kills=1, seed=11)
    figures = report.figures
    print(figures)
    assert report.as_expected, report.explain()
    assert figures["engine_kills"] == 1
    assert isinstance(figures["toxics_applied"], int)
    assert figures["toxics_applied"] >= 1
    # Every behaviour ran; what the stalled readers' generations did is judged
    # by leaked_generations (the engine kill may wipe their records: unseen).
    assert figures["stalls"] == 3


# The two lab faults take 20 s each (clients waiting out their watchdogs):
# `make test-slow` runs them; CI runs the four knob-broken things, one per check
# family beside them (leaked generations, corruption, idle cuts).
SLOW_THINGS = {"engine hop disabled", "edge black-holed"}


@pytest.mark.parametrize("thing", [
    pytest.param(t, id=t.name, marks=[pytest.mark.slow] if t.name in SLOW_THINGS else [])
    for t in SELF_TEST])
async def test_the_soak_fails_on_what_it_guards_against(lab: LabTarget,
                                                        thing: BrokenThing) -> None:
    """Without toxics (the broken thing alone), one cycle of behaviours: the
    verdict fails, and on the check named for it."""
    _needs_pids(lab)
    report = await soak_broken(lab, thing.name, streams=CYCLE, concurrency=CYCLE,
                               duration_s=60, toxics=False, seed=3)
    print(report.explain())
    assert not report.as_expected
    assert set(thing.guarded_by) <= set(failed(report)), report.figures
    # The self-test's judgement of the same run (`streamlab soak --self-test`).
    assert self_test_part(thing, report).as_expected
