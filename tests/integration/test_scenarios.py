"""Every scenario of the catalogue, in both modes, against the real lab.

One test per scenario and mode, driven from the data in
streamlab/experiments/scenarios/catalogue.py: a new scenario there is a new pair of tests
here. Each test asserts two things:

1. the mode's own checks hold on what was measured (the broken setup really
   breaks, the fixed one really works);
2. the *other* mode's checks fail on the same figures. That is the proof that
   no test passes when the thing it checks is broken: the fixed test's checks,
   run against the broken configuration, fail (and the other way round).
"""

from __future__ import annotations

import pytest

from streamlab.experiments.scenarios import (
    MODES,
    Mode,
    Scenario,
    all_scenarios,
    names,
    run,
    timing_for,
)
from streamlab.experiments.scenarios.model import ScenarioUnavailable
from streamlab.lab.target import LabTarget

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

# More slack than the CLI's default: the suite shares two cores with other suites.
TOLERANCE_S = 0.5
# Load scenarios (rolling-deploy's 200 clients) at this share of their full size:
# the checks are the same, the suite's time is not (docs/scenarios.md).
LOAD_SCALE = 0.15
# reconnect-storm at a CI size: 100 live streams instead of 500 (same ramp and
# cut, so the same ratios; the 500-stream figures in docs/scenarios.md come from
# the full-size CLI run).
CI_STORM_STREAMS = 100
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

# Run on the local target only (CI time: the compose run adds minutes). A broken
# mode shows that a scenario's checks fail on the broken setting; the fixed mode,
# which runs on both targets, shows the deployed lab works *and* that the broken
# checks fail on its figures, so the pair's contrast is kept where it is cheap.
LOCAL_ONLY = {
    **{(name, "broken"): "a broken mode shows the scenario's checks catch the broken "
       "setting (the fixed mode, run here too, shows the containers work)"
       for name in names()},
    ("slow-reader-edge", "fixed"): "40 s on the compose lab (a 16k-token answer to a "
        "throttled reader), and its broken half cannot run there (COMPOSE_UNSUPPORTED)",
}

# Left to `make test-slow` (CI time: a full run must stay under 35 min on two
# cores): the two longest broken halves. Their fixed halves run in CI (and judge
# the broken checks on their figures); what the broken halves add, the fixed
# checks failing on the broken setting, is shown by `make test-slow` and by
# `streamlab scenario run NAME --both`.
SLOW = {
    ("redis-restart", "broken"): "36 s: 50 streams, three Redis kills, readers left to hang",
    ("owner-killed-storm", "broken"): "29 s: a 500-stream storm with its owner killed",
}


def _marks(name: str, mode: Mode) -> list[pytest.MarkDecorator]:
    marks = []
    if (name, mode) in LOCAL_ONLY:
        marks.append(pytest.mark.local_only(LOCAL_ONLY[(name, mode)]))
    if (name, mode) in SLOW:
        marks.append(pytest.mark.slow)
    return marks


CASES = [pytest.param(scenario, mode, id=f"{scenario.name}-{mode}",
                      marks=_marks(scenario.name, mode))
         for scenario in all_scenarios() for mode in MODES]


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
        timing = timing_for(lab, tolerance_s=TOLERANCE_S, storm_streams=CI_STORM_STREAMS,
                            load_scale=LOAD_SCALE)
        report = await run(lab, scenario, mode, timing)
    except ScenarioUnavailable as exc:  # no chromium, no HTTP/2 edge (compose without certs)
        pytest.skip(str(exc))

    assert (report.experiment, report.variant, report.status) == (scenario.name, mode, "ran")
    assert report.as_expected, report.explain()
    other = "fixed" if mode == "broken" else "broken"
    assert report.discriminates, (
        f"the {other} checks also pass on the {mode} setup, so they cannot tell the two "
        f"apart:\n{report.explain()}")
