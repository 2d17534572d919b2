"""Scenarios in any order: one scenario's faults must not break the next one.

The order that broke (issue 14): `engine-reset` resets the engine hop, so the
gateway's channel goes down and reconnects; `latency-engine --broken` then puts
600 ms on that hop. A connect deadline shorter than the handshake across the
slow hop left the gateway unable to reach the engine ("failed to connect to all
addresses; ... connection attempt timed out", a 503), every time.
"""

from __future__ import annotations

import pytest

from streamlab.experiments.scenarios import CATALOGUE, run, timing_for
from streamlab.lab.target import LabTarget

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TOLERANCE_S = 0.5


async def test_latency_on_the_engine_hop_after_an_engine_reset(lab: LabTarget) -> None:
    timing = timing_for(lab, tolerance_s=TOLERANCE_S)
    for mode in ("broken", "fixed"):
        outcome = await run(lab, CATALOGUE["engine-reset"], mode, timing)
        assert outcome.as_expected, outcome.explain()
    outcome = await run(lab, CATALOGUE["latency-engine"], "broken", timing)
    assert outcome.as_expected, outcome.explain()
