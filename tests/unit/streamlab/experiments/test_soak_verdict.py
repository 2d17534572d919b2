"""The soak's verdict on hand-made runs (no lab): a clean run passes every
check, and each check fails on a run broken its way."""

from __future__ import annotations

from dataclasses import replace

import pytest

from streamlab.experiments.report import judge
from streamlab.experiments.soak_verdict import (
    BROKEN,
    CHECKS,
    SELF_TEST,
    Fault,
    SoakRun,
    StreamRun,
    figures,
    report,
    self_test_part,
    self_test_report,
)
from tests.unit.streamlab.experiments.soak_runs import stream


def clean_run() -> SoakRun:
    return SoakRun(
        streams=[
            stream(0, "full", "complete"),
            stream(1, "full", "complete", 1, 2),
            stream(2, "think", "complete", 0, 4),
            stream(3, "resume", "resumed_complete"),
            stream(4, "abandon", "abandoned", left_at=0.3, engine_state="cancelled"),
            stream(5, "stall", "stalled", left_at=0.0, engine_state="cancelled"),
            stream(6, "poll", "polled_away", left_at=0.5, engine_state="cancelled"),
            # Cut by a reset while the toxic was on: it may fail, and its generation
            # may have ended any way at all.
            stream(7, "full", "connection_error", 5, 6, left_at=6, engine_state="completed"),
        ],
        faults=[Fault("edge:reset_peer", 5.5, 6.5, True), Fault("edge:latency", 0, 9, False),
                Fault("engine_kill", 7, 8, True)],
        engine_kills_asked=1, engine_left_running=0, gateway_rss_start_mb=70,
        gateway_rss_end_mb=75, nginx_idle_cuts=0, duration_s=9)


def failed(run: SoakRun) -> set[str]:
    return {c.check.figure for c in judge(CHECKS, figures(run)) if not c.holds}


def test_a_clean_run_passes_every_check() -> None:
    values = figures(clean_run())
    assert failed(clean_run()) == set()
    # The cut stream overlapped a destructive fault; latency does not exclude anyone.
    assert (values["survivors"], values["survivors_completed"]) == (4, 4)
    assert values["leaked_generations"] == 0


@pytest.mark.parametrize(("broken", "figure"), [
    # The detached relay: the engine runs on after the client closed, or writes a
    # stalled reader's whole answer into the gateway's memory.
    (stream(4, "abandon", "abandoned", left_at=0.3, engine_state="running"),
     "leaked_generations"),
    (stream(5, "stall", "stalled", left_at=0.0, engine_state="completed"),
     "leaked_generations"),
    # No job TTL: the poller's job is still generating at the bound.
    (stream(6, "poll", "polled_away", left_at=0.5, engine_state="running"),
     "leaked_generations"),
    # A cut stream's generation still running at its bound.
    (stream(7, "full", "connection_error", 5, 6, left_at=6, engine_state="running"),
     "leaked_generations"),
    # Swallowed engine errors: a cut passed off as a whole answer.
    (stream(0, "full", "corrupt"), "corrupt"),
    (stream(0, "full", "hang"), "hangs"),
])
def test_each_check_fails_on_a_stream_broken_its_way(broken: StreamRun, figure: str) -> None:
    run = clean_run()
    run.streams[broken.index] = broken
    assert figure in failed(run)


def test_streams_nobody_faulted_must_complete() -> None:
    run = clean_run()
    run.streams[0] = stream(0, "full", "error_event", left_at=1.0, engine_state="failed")
    run.streams[1] = stream(1, "full", "connection_error", 1, 2, left_at=2,
                            engine_state="cancelled")
    assert failed(run) == {"survivor_completion"}


def test_a_run_with_too_few_untouched_streams_cannot_pass() -> None:
    run = clean_run()
    run.faults.append(Fault("upstream:timeout", 0, 10, True))
    assert "survivors" in failed(run)


@pytest.mark.parametrize(("change", "figure"), [
    ({"engine_left_running": 2}, "engine_left_running"),
    ({"nginx_idle_cuts": 1}, "nginx_idle_cuts"),
    ({"nginx_idle_cuts": None}, "nginx_idle_cuts"),  # unread is not a pass
    ({"gateway_rss_end_mb": 90.0}, "gateway_rss_growth"),
    ({"engine_kills_asked": 2}, "engine_kills_missed"),
])
def test_each_run_wide_check_fails_on_its_broken_figure(change: dict[str, object],
                                                        figure: str) -> None:
    assert failed(replace(clean_run(), **change)) == {figure}  # type: ignore[arg-type]


def test_an_engine_that_restarted_forgets_a_generation_and_that_is_no_leak() -> None:
    run = stream(4, "abandon", "abandoned", left_at=0.3, engine_state="unseen")
    assert not run.leaked


def test_every_broken_thing_names_checks_that_exist() -> None:
    names = {check.figure for check in CHECKS}
    for thing in SELF_TEST:
        assert set(thing.guarded_by) <= names, thing.name


def test_the_report_is_the_one_judge_on_the_runs_figures() -> None:
    clean = report(clean_run(), {})
    assert clean.as_expected
    assert [c.check for c in clean.checks] == list(CHECKS)
    broken_run = clean_run()
    # Cut by the reset (no survivor): only the corrupt check fails on it.
    broken_run.streams[7] = stream(7, "full", "corrupt", 5, 6)
    broken = report(broken_run, {"relay": "detached_unbounded"}, variant="corrupting")
    assert not broken.as_expected
    assert [c.check.figure for c in broken.failures] == ["corrupt"]
    assert broken.figures["knobs"] == "relay=detached_unbounded"
    assert broken.as_json()["verdict"] == "UNEXPECTED"


def test_the_self_test_passes_only_when_each_broken_thing_fails_its_own_checks() -> None:
    thing = BROKEN["engine_errors=swallow"]  # guarded by `corrupt`
    corrupted = clean_run()
    corrupted.streams[7] = stream(7, "full", "corrupt", 5, 6)
    caught = self_test_part(thing, report(corrupted, thing.knobs, variant=thing.name))
    assert caught.as_expected
    assert caught.discriminates
    assert caught.figures["check_corrupt_holds"] is False
    # The soak failed, but not on the check that guards against this thing: not caught.
    hung = clean_run()
    hung.streams[7] = stream(7, "full", "hang", 5, 6)
    missed = self_test_part(thing, report(hung, thing.knobs, variant=thing.name))
    assert not missed.as_expected
    assert [c.check.figure for c in missed.failures] == ["check_corrupt_holds"]

    lab_as_is = report(clean_run(), {})
    whole = self_test_report([caught, lab_as_is])
    assert whole.as_expected
    (table,) = whole.tables
    assert table.rows == (("engine_errors=swallow", "corrupt", "corrupt", "as expected"),
                          ("(none: the lab as it is)", "nothing", "nothing", "as expected"))
    assert not self_test_report([missed, lab_as_is]).as_expected
