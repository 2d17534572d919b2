"""`streamlab resume run --both`: the same measurement the CLI prints, checked."""

from __future__ import annotations

import pytest

from streamlab.lab import Lab
from streamlab.resume_scenario import ResumeTiming, run

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


@pytest.mark.parametrize("hop", ["edge", "upstream"])
async def test_without_resume_the_cut_loses_data_with_it_nothing(lab: Lab, hop: str) -> None:
    timing = ResumeTiming(tokens=30, gap_ms=10, retry_ms=50, hop=hop, cut_bytes=900)
    broken, fixed = await run(lab, ("broken", "fixed"), timing)

    assert broken.as_expected, broken.as_json()
    assert fixed.as_expected, fixed.as_json()
    # What the broken client lost is exactly what the fixed one got back.
    assert broken.figures["missing"] == 30 - int(str(broken.figures["tokens_received"]))
    assert fixed.figures["tokens_received"] == 30
