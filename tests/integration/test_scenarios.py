"""Every scenario of the catalogue, in both modes, against the real lab.

One test per scenario and mode, driven from the data in
streamlab/scenarios/catalogue.py: a new scenario there is a new pair of tests
here. Each test asserts two things:

1. the mode's own checks hold on what was measured (the broken setup really
   breaks, the fixed one really works);
2. the *other* mode's checks fail on the same figures. That is the proof that
   no test passes when the thing it checks is broken: the fixed test's checks,
   run against the broken configuration, fail (and the other way round).
"""

from __future__ import annotations

import pytest

from streamlab.scenarios import CATALOGUE, MODES, Mode, Scenario, run, timing_for
from streamlab.scenarios.model import ScenarioUnavailable
from streamlab.target import LabTarget

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

# More slack than the CLI's default: the suite shares two cores with other suites.
TOLERANCE_S = 0.5
# Figures counted in the services' log files: only a lab with the `logs`
# capability has them (the compose lab's services log to their containers).
LOG_FIGURES = {"nginx_upstream_timeouts", "gateway_log_errors"}

# Known not to hold on the compose target, with why (see the note in docs/scenarios.md).
COMPOSE_UNSUPPORTED = {
    ("slow-reader-edge", "broken"):
        "the containerised nginx stops buffering /buffered-to-disk/ at ~1.7 MB (7,999 "
        "of 16,384 tokens), so the broken mode cannot show the whole answer absorbed; "
        "measured once, not yet explained",
}

CASES = [pytest.param(scenario, mode, id=f"{name}-{mode}")
         for name, scenario in CATALOGUE.items() for mode in MODES]


@pytest.mark.parametrize(("scenario", "mode"), CASES)
async def test_scenario_comes_out_as_expected(lab: LabTarget, scenario: Scenario,
                                              mode: Mode) -> None:
    checked = {check.figure for variant in (scenario.broken, scenario.fixed)
               for check in variant.expect}
    if lab.logs is None and checked & LOG_FIGURES:
        pytest.skip(f"checks {sorted(checked & LOG_FIGURES)}, counted in the services' log "
                    "files; this lab has none (on the compose target they log to their "
                    "containers)")
    if lab.pids is None and (why := COMPOSE_UNSUPPORTED.get((scenario.name, mode))):
        pytest.skip(why)
    try:
        outcome = await run(lab, scenario, mode, timing_for(lab, tolerance_s=TOLERANCE_S))
    except ScenarioUnavailable as exc:  # no chromium, no HTTP/2 edge (compose without certs)
        pytest.skip(str(exc))

    assert outcome.as_expected, outcome.explain()
    other = "fixed" if mode == "broken" else "broken"
    assert outcome.discriminates, (
        f"the {other} checks also pass on the {mode} setup, so they cannot tell the two "
        f"apart:\n{outcome.explain()}")
