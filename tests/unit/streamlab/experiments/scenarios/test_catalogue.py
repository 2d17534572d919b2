"""The scenario catalogue's data and the checks' logic (no lab needed)."""

from __future__ import annotations

import pytest

from streamlab.experiments.report import Figure, judge
from streamlab.experiments.scenarios import MODES, Check, Timing, get, names
from streamlab.lab.target import Capability
from streamlab.lab.toxiproxy import TOXIC_TYPES

TIMING = Timing()
HOPS = {"edge", "upstream", "engine"}


def test_catalogue_has_the_proxy_and_client_scenarios() -> None:
    assert {"buffering", "idle-cut", "client-watchdog", "websocket-upgrade", "slicer",
    "latency-edge", "latency-upstream", "latency-engine",
    "bandwidth"} <= set(names())


@pytest.mark.parametrize("name", list(names()))
def test_each_scenario_is_complete_data(name: str) -> None:
    scenario = get(name)
    assert scenario.name == name
    for mode in MODES:
        variant = scenario.variant(mode)
        assert variant.expect, f"{name} {mode} has no checks: it could never fail"
        assert variant.story
        for hop, toxic in variant.setup.toxics:
            assert hop in HOPS
            assert set(toxic.attributes) <= set(TOXIC_TYPES[toxic.type])
    assert scenario.broken.setup != scenario.fixed.setup, "the two modes must differ"


def test_a_check_bound_can_follow_the_timing() -> None:
    check = Check("ttft_s", "<=", lambda t: t.prefill_s + 2 * t.gap_s + t.tolerance_s)
    assert check.holds({"ttft_s": 0.6}, Timing(prefill_ms=300, gap_ms=50, tolerance_s=0.3))
    assert not check.holds({"ttft_s": 0.6}, Timing(prefill_ms=100, gap_ms=50, tolerance_s=0.3))
    assert check.describe(Timing(tolerance_s=0.3)) == "ttft_s <= 0.7"


@pytest.mark.parametrize("figures", [{}, {"ttft_s": None}, {"ttft_s": "n/a"}])
def test_a_missing_or_unordered_figure_fails_the_check(figures: dict[str, Figure]) -> None:
    assert not Check("ttft_s", "<=", 1.0).holds(figures, TIMING)


def test_buffering_checks_tell_a_lump_from_a_stream() -> None:
    lump = {"first_byte_share": 0.99, "ttft_s": 1.33, "done": True}
    stream = {"first_byte_share": 0.28, "ttft_s": 0.37, "done": True}
    scenario = get("buffering")
    assert all(r.holds for r in judge(scenario.broken.expect, lump, TIMING))
    assert not all(r.holds for r in judge(scenario.fixed.expect, lump, TIMING))
    assert all(r.holds for r in judge(scenario.fixed.expect, stream, TIMING))
    assert not all(r.holds for r in judge(scenario.broken.expect, stream, TIMING))


# Figures from real runs (tests/integration/test_scenarios.py's scale, 2 loaded cores).
ROLLING_BROKEN: dict[str, Figure] = {
    "streams": 30, "streams_lost": 30, "tokens_lost": 4579,
    "tokens_duplicated": 0, "readers_reconnected": 0, "resume_404s": 20,
    "gateways_restarted": 3, "live_at_last_restart": 5}
ROLLING_FIXED: dict[str, Figure] = {
    "streams": 150, "streams_lost": 0, "tokens_lost": 0, "tokens_duplicated": 0,
    "readers_reconnected": 35, "resume_404s": 0, "gateways_restarted": 3,
    "live_at_last_restart": 30}
LOSS_BROKEN: dict[str, Figure] = {
    "streams": 6, "tokens_at_kill": 10, "streams_whole": 0, "streams_lost": 6,
    "tokens_lost": 516, "tokens_duplicated": 0, "end_reasons": "owner_lost 6",
    "engine_generations_started": 6, "engine_generations_reattached": 0}
LOSS_FIXED: dict[str, Figure] = {
    "streams": 6, "tokens_at_kill": 10, "streams_whole": 6, "streams_lost": 0,
    "tokens_lost": 0, "tokens_duplicated": 0, "end_reasons": "done",
    "engine_generations_started": 6, "engine_generations_reattached": 6}


@pytest.mark.parametrize(("name", "broken", "fixed"), [
    ("rolling-deploy", ROLLING_BROKEN, ROLLING_FIXED),
    ("replica-loss", LOSS_BROKEN, LOSS_FIXED),
])
def test_replica_scenarios_checks_tell_the_modes_apart(
        name: str, broken: dict[str, Figure], fixed: dict[str, Figure]) -> None:
    scenario = get(name)
    assert all(r.holds for r in judge(scenario.broken.expect, broken, TIMING))
    assert not all(r.holds for r in judge(scenario.fixed.expect, broken, TIMING))
    assert all(r.holds for r in judge(scenario.fixed.expect, fixed, TIMING))
    assert not all(r.holds for r in judge(scenario.broken.expect, fixed, TIMING))


def test_a_duplicated_token_fails_the_fixed_replica_checks() -> None:
    """Exactly once, not at least once: a re-attach that replays a token it
    already logged must fail the fixed mode."""
    for name, fixed in (("rolling-deploy", ROLLING_FIXED), ("replica-loss", LOSS_FIXED)):
        twice = {**fixed, "tokens_duplicated": 1}
        assert not all(r.holds for r in judge(get(name).fixed.expect, twice, TIMING))


LOG_FIGURES = {"nginx_upstream_timeouts", "gateway_log_errors"}  # counted in log files


@pytest.mark.parametrize("name", list(names()))
def test_a_scenario_declares_what_its_setup_and_checks_use(name: str) -> None:
    """Needs follow from the data where they can: toxics in a setup need hops to
    toggle; a check on a figure counted in a log file needs the logs."""
    scenario = get(name)
    variants = [scenario.variant(mode) for mode in MODES]
    if any(v.setup.toxics for v in variants):
        assert Capability.TOGGLE_HOPS in scenario.needs
    if any(c.figure in LOG_FIGURES for v in variants for c in v.expect):
        assert Capability.LOGS in scenario.needs


def test_the_catalogue_s_needs() -> None:
    """Each scenario's declared needs, as the measures use the target: the
    engine's record (lifecycle, engine faults), hops toggled inside the measure
    (resume, engine faults, h2), logs (idle-cut). Private-lab scenarios need
    nothing of the target's: their own lab has the replicas and restarts."""
    needs = {name: sorted(get(name).needs) for name in names()}
    toggle, record, logs = Capability.TOGGLE_HOPS, Capability.ENGINE_RECORD, Capability.LOGS
    assert {n for n, v in needs.items() if v == [logs]} == {"idle-cut"}
    assert {n for n, v in needs.items() if v == [record]} == {
        "abandoned-tab", "abandoned-prefill", "slow-reader", "poll-leak", "slow-reader-edge"}
    assert {n for n, v in needs.items() if v == sorted([record, toggle])} == {
        "engine-reset", "engine-cut", "engine-down", "engine-blackhole"}
    assert {n for n, v in needs.items() if v == [toggle]} == {
        "client-watchdog", "slicer", "latency-edge", "latency-upstream", "latency-engine",
        "bandwidth", "resume", "resume-upstream", "h2-shared-fate", "responses-resume"}
    assert {n for n, v in needs.items() if not v} == {
        "buffering", "buffering-header", "gzip", "websocket-upgrade", "seventh-tab",
        "reconnect-storm", "store-faults", "rolling-deploy", "replica-loss",
        "owner-killed-storm", "transient-blip", "redis-restart", "store-partition"}
