"""A small chaos soak on the real topology (docs/scenarios.md has a large run)."""

from __future__ import annotations

import pytest

from streamlab.soak import soak
from streamlab.target import LabTarget

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def test_small_chaos_soak_loses_nothing_and_leaks_nothing(lab: LabTarget) -> None:
    if lab.pids is None:
        pytest.skip("measures the gateway process's RSS from the host by pid; the compose "
                    "lab's gateway runs in a container (STREAMLAB_TARGET=compose)")
    report = await soak(lab, streams=60, concurrency=12, duration_s=60,
                        engine_kills=1, seed=11)
    print(dict(report.outcomes), report)
    assert report.outcomes["hang"] == 0
    assert report.outcomes["corrupt"] == 0
    assert report.engine_left_running == 0
    assert report.gateway_rss_end_mb <= 1.2 * report.gateway_rss_start_mb
    assert report.engine_restarts == 1
    assert report.toxics_applied >= 1
    assert report.outcomes["complete"] > 0  # the lab did real work between the faults
    assert report.passed
