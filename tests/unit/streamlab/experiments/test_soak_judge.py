"""The soak's checks, judged by the one judge (report.judge) on scripted runs:
each broken thing of the soak's self-test, scripted as the streams a real soak
would record for it, fails the checks that guard against it, and a clean run
fails none. A leaked generation is read from the engine's own record, as the
soak reads it, here from a FakeLab's scripted engine."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from streamlab.experiments.generation_end import state_name, wait_for_end
from streamlab.experiments.report import judge
from streamlab.experiments.soak_verdict import (
    CHECKS,
    SELF_TEST,
    BrokenThing,
    Fault,
    SoakRun,
    figures,
)
from streamlab.experiments.timing import Timing
from streamlab.lab.fake import FakeLab
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from tests.unit.streamlab.experiments.soak_runs import stream

# The soak's bounds are plain numbers: any timing judges them the same.
TIMING = Timing()


def failing(run: SoakRun) -> set[str]:
    return {result.check.figure for result in judge(CHECKS, figures(run), TIMING)
            if not result.holds}


def clean() -> SoakRun:
    """A soak as a fixed lab records it: readers complete, leavers' generations
    are cancelled, a stream cut by a reset fails without counting against completion."""
    return SoakRun(
        streams=[stream(0, "full", "complete"), stream(1, "full", "complete", 1, 2),
                 stream(2, "think", "complete", 0, 6), stream(3, "resume", "resumed_complete"),
                 stream(4, "abandon", "abandoned", left_at=0.3, engine_state="cancelled"),
                 stream(5, "stall", "stalled", left_at=0.1, engine_state="cancelled"),
                 stream(6, "poll", "polled_away", left_at=0.5, engine_state="cancelled"),
                 stream(7, "full", "connection_error", 7, 8, left_at=8,
                        engine_state="cancelled")],
        faults=[Fault("edge:reset_peer", 7.5, 8.5, True), Fault("upstream:latency", 0, 9, False)],
        engine_left_running=0, gateway_rss_start_mb=70, gateway_rss_end_mb=74,
        nginx_idle_cuts=0, duration_s=10)


def detached_relay(run: SoakRun) -> None:
    # Nobody cancels: a leaver's generation runs to its end, a stalled one runs on.
    run.streams[4].engine_state = "completed"
    run.streams[5].engine_state = "running"


def swallowed_engine_errors(run: SoakRun) -> None:
    # The engine is killed mid-answer and the stream ends with [DONE]: the text
    # is a prefix passed off as whole.
    run.faults.append(Fault("engine_kill", 1.5, 1.6, True))
    run.engine_kills_asked = 1
    run.streams[1].outcome = "corrupt"


def no_job_ttl(run: SoakRun) -> None:
    run.streams[6].engine_state = "completed"


def no_heartbeat(run: SoakRun) -> None:
    # nginx cuts the think pause: the stream fails, and nginx logged the cut.
    run.streams[2].outcome = "connection_error"
    run.nginx_idle_cuts = 1


def engine_hop_disabled(run: SoakRun) -> None:
    for each in run.streams:
        if each.behaviour in ("full", "think", "resume"):
            each.outcome = "error_event"


def edge_black_holed(run: SoakRun) -> None:
    run.streams[0].outcome = "hang"
    run.streams[3].outcome = "hang"


SCRIPTED: dict[str, Callable[[SoakRun], None]] = {
    "relay=detached_unbounded": detached_relay,
    "engine_errors=swallow": swallowed_engine_errors,
    "job_ttl_s=0": no_job_ttl,
    "heartbeat_s=0": no_heartbeat,
    "engine hop disabled": engine_hop_disabled,
    "edge black-holed": edge_black_holed,
}


def test_a_clean_soak_holds_every_check() -> None:
    assert failing(clean()) == set()


def test_every_broken_thing_of_the_self_test_is_scripted_here() -> None:
    assert {thing.name for thing in SELF_TEST} == set(SCRIPTED)


@pytest.mark.parametrize("thing", SELF_TEST, ids=lambda thing: thing.name)
def test_each_broken_thing_fails_the_checks_that_guard_against_it(thing: BrokenThing) -> None:
    run = clean()
    SCRIPTED[thing.name](run)

    assert set(thing.guarded_by) <= failing(run), thing.name


def judged_from_the_engine(lab: FakeLab, run: SoakRun) -> SoakRun:
    """Each leaver's engine_state from the engine's record of its request (what
    the soak does once the leave's bound has passed)."""
    for each in run.streams:
        if each.left_at is not None:
            record = wait_for_end(lab.engine_stats, each.request_id, timeout_s=0.0)
            each.engine_state = state_name(record) if record is not None else "unseen"
    return run


def scripted_engine(abandoned: pb.GenerationState) -> FakeLab:
    lab = FakeLab()
    for each in clean().streams:
        if each.left_at is not None:
            lab.engine.generations.add(request_id=each.request_id,
                                       state=pb.GENERATION_STATE_CANCELLED)
    lab.engine.generations[0].state = abandoned  # soak-4: the abandoning client's
    return lab


def test_a_generation_its_client_left_that_ran_to_its_end_is_a_leak() -> None:
    run = judged_from_the_engine(scripted_engine(pb.GENERATION_STATE_COMPLETED), clean())

    assert run.streams[4].leaked
    assert figures(run)["leaked_generations"] == 1
    assert failing(run) == {"leaked_generations"}


def test_the_same_generation_cancelled_is_no_leak() -> None:
    run = judged_from_the_engine(scripted_engine(pb.GENERATION_STATE_CANCELLED), clean())

    assert figures(run)["leaked_generations"] == 0
    assert failing(run) == set()


def test_a_generation_the_engine_no_longer_knows_is_unseen_not_leaked() -> None:
    lab = scripted_engine(pb.GENERATION_STATE_COMPLETED)
    del lab.engine.generations[0]  # an engine restarted since: its records are gone

    run = judged_from_the_engine(lab, clean())

    assert run.streams[4].engine_state == "unseen"
    assert (figures(run)["leaked_generations"], figures(run)["generations_unseen"]) == (0, 1)
