"""A replica dies and nothing is lost: real redis-server,
two real gateway processes ("a" and "b") sharing the resume log, one real
engine (the fake model) whose resumable generations are detachable.

The owner "a" is SIGKILLed (or drained) under a live stream; the client
resumes on "b" with Last-Event-ID, "b" takes the stream over and re-attaches
to the engine's generation, and the client ends with the full text exactly
once. Each verdict runs against the broken mode too
(`STREAMLAB_GATEWAY_REATTACH=false`, the lab's "broken" replica-loss mode),
where the same run must end `cancelled` with a shorter text.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.engine.backends.fake import token_text
from streamlab.experiments.generation_end import wait_for_end
from streamlab.lab import processes
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.sse import Event, SSEDecoder
from tests.integration.redis_fixtures import RedisServer, Replicas, StartReplicas, create_stream
from tests.wait import wait_until

pytestmark = pytest.mark.integration

TOKENS, GAP_MS = 200, 25  # 5 s of tokens: still running when the takeover comes
EXPECTED = "".join(token_text(i) for i in range(TOKENS))
TERMINAL = {"done", "error", "cancelled"}
READ_DEADLINE_S = 25.0  # no read may outlast this: a hang fails the test
REPLICA_ENV = {"STREAMLAB_GATEWAY_REDIS_TIMEOUT_S": "1",
               "STREAMLAB_GATEWAY_REDIS_FOLLOWER_TTL_S": "1.5"}
MODES = {"fixed": {}, "broken": {"STREAMLAB_GATEWAY_REATTACH": "false"}}


def body(tokens: int = TOKENS, gap_ms: int = GAP_MS) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "survive me"}],
            "streamlab": {"prefill_ms": 10, "token_gap_ms": gap_ms, "answer_tokens": tokens},
            "resume": {"retry_ms": 50}}


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=httpx.Timeout(10.0, connect=5.0)) as client:
        yield client


@dataclass
class Read:
    """One GET of the events URL, as the client saw it."""

    status: int
    events: list[Event] = field(default_factory=list)
    token_at: list[float] = field(default_factory=list)  # monotonic arrival of each token
    how: str = "terminal"  # terminal | closed (no terminal event) | cut | stopped

    @property
    def last(self) -> Event:
        return self.events[-1]


def read(http: httpx.Client, base_url: str, stream_id: str, last_event_id: str | None = None,
         stop_after: int | None = None) -> Read:
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    decoder = SSEDecoder()
    deadline = time.monotonic() + READ_DEADLINE_S
    try:
        with http.stream("GET", f"{base_url}/v1/streams/{stream_id}/events",
                         headers=headers) as response:
            result = Read(response.status_code)
            if response.status_code != 200:
                return result
            for chunk in response.iter_bytes():
                assert time.monotonic() < deadline, f"no end after {READ_DEADLINE_S} s"
                for item in decoder.feed(chunk):
                    if not isinstance(item, Event):
                        continue
                    result.events.append(item)
                    if item.event == "token":
                        result.token_at.append(time.monotonic())
                    if item.event in TERMINAL:
                        return result
                    if stop_after is not None and len(result.token_at) >= stop_after:
                        result.how = "stopped"
                        return result
            result.how = "closed"
    except httpx.TransportError:
        result.how = "cut"
    return result


def create(http: httpx.Client, base_url: str, **kwargs: Any) -> str:
    return create_stream(http, base_url, body(**kwargs))


def seqs(events: list[Event]) -> list[int]:
    return [int(e.id.rsplit(":", 1)[1]) for e in events if e.event != "gap"]


def text_of(events: list[Event]) -> str:
    return "".join(json.loads(e.data)["text"] for e in events if e.event == "token")


def exactly_once(before: Read, after: Read) -> bool:
    """What a user checks: every event once, in order, the text whole, `done`."""
    events = before.events + after.events
    return (seqs(events) == list(range(1, TOKENS + 2)) and text_of(events) == EXPECTED
            and events[-1].event == "done")


def generation_of(replicas: Replicas, stream_id: str) -> list[pb.GenerationRecord]:
    return list(replicas.stats(stream_id).generations)


@dataclass
class Loss:
    before: Read
    after: Read
    stall_s: float  # last token before the kill to the first token after
    reattached: int  # the engine's generations_reattached, during the run
    started: int  # the engine's generations_started, during the run


def kill_owner_and_resume(http: httpx.Client, replicas: Replicas, owner: str = "a",
                          other: str = "b", kill_after: int = 20) -> Loss:
    """Read on the owner, SIGKILL it right after token `kill_after`, resume on
    the other replica with the last id seen."""
    stream_id = create(http, replicas.gateways[owner])
    stats = replicas.stats()
    before = read(http, replicas.gateways[owner], stream_id, stop_after=kill_after)
    processes.stop(replicas.processes[owner], grace_s=0)  # SIGKILL
    after = read(http, replicas.gateways[other], stream_id, last_event_id=before.last.id)
    end = replicas.stats()
    stall = (after.token_at[0] - before.token_at[-1]) if after.token_at else float("nan")
    return Loss(before, after, stall,
                end.generations_reattached - stats.generations_reattached,
                end.generations_started - stats.generations_started)


@pytest.mark.parametrize("mode", MODES)
def test_the_owner_is_sigkilled_and_a_resume_elsewhere_ends_with_the_full_text_once(
        mode: str, redis_server: RedisServer, start_replicas: StartReplicas,
        http: httpx.Client) -> None:
    """Fixed: b takes the stream over and re-attaches to the engine's running
    generation (no second one): every token once, in order, then `done`.
    Broken (re-attach off): the stream ends `cancelled` owner_lost, short."""
    replicas = start_replicas(redis_server.url, **REPLICA_ENV, **MODES[mode])
    run = kill_owner_and_resume(http, replicas)
    assert (run.before.how, seqs(run.before.events)) == ("stopped", list(range(1, 21)))
    assert run.after.status == 200
    print(f"\n{mode}: stall across the SIGKILL {run.stall_s * 1000:.0f} ms, "
          f"last event {run.after.last.event} {run.after.last.data}")
    if mode == "fixed":
        assert exactly_once(run.before, run.after), (seqs(run.after.events), run.after.last)
        assert (run.reattached, run.started) == (1, 0)
        stream_id = run.before.events[0].id.split(":")[0]
        records = generation_of(replicas, stream_id)
        assert [(r.state, r.tokens_generated) for r in records] == [
            (pb.GENERATION_STATE_COMPLETED, TOKENS)]
        # b owns it now: its status says so, and the log reads whole from it.
        status = http.get(f"{replicas.gateways['b']}/v1/streams/{stream_id}").json()
        assert (status["state"], status["replica"]) == ("completed", "b")
        whole = read(http, replicas.gateways["b"], stream_id)
        assert text_of(whole.events) == EXPECTED
    else:
        assert not exactly_once(run.before, run.after)
        assert run.after.last.event == "cancelled"
        assert json.loads(run.after.last.data) == {"reason": "owner_lost"}
        assert len(text_of(run.before.events + run.after.events)) < len(EXPECTED)
        assert run.reattached == 0


@pytest.mark.parametrize("mode", MODES)
def test_a_drained_owner_hands_its_stream_off_and_the_client_continues_elsewhere(
        mode: str, redis_server: RedisServer, start_replicas: StartReplicas,
        http: httpx.Client) -> None:
    """SIGTERM the owner under a live stream (a rolling deploy): after its
    drain grace (2 s here) it ends its reader with `retry:` and no terminal
    event, and marks the stream released; the client reconnects to b, which
    takes it over at once. Broken: the drain cancels it (`server_draining`)."""
    replicas = start_replicas(redis_server.url, **REPLICA_ENV, **MODES[mode])
    a, b = replicas.gateways["a"], replicas.gateways["b"]
    stream_id = create(http, a)
    stats = replicas.stats()
    before = read(http, a, stream_id, stop_after=5)
    os.kill(replicas.processes["a"].pid, signal.SIGTERM)
    rest = read(http, a, stream_id, last_event_id=before.last.id)
    if mode == "broken":
        assert rest.last.event == "cancelled"
        assert json.loads(rest.last.data) == {"reason": "server_draining"}
        return
    assert rest.how == "closed", rest.how  # `retry:` and the end of the body, no terminal
    assert rest.events
    assert rest.last.event == "token"
    after = read(http, b, stream_id, last_event_id=rest.last.id)
    before.events += rest.events
    before.token_at += rest.token_at
    stall = after.token_at[0] - before.token_at[-1]
    print(f"\ndrain hand-off: stall {stall * 1000:.0f} ms")
    assert exactly_once(before, after), (seqs(after.events), after.last)
    end = replicas.stats()
    assert (end.generations_reattached - stats.generations_reattached,
            end.generations_started - stats.generations_started) == (1, 0)


def test_an_owner_that_exits_without_a_drain_loses_no_more_than_a_crash_would(
        redis_server: RedisServer, start_replicas: StartReplicas, http: httpx.Client) -> None:
    """SIGTERM with the drain off (grace 0: the exit a second SIGTERM, or a
    drain too short for a loaded loop, also comes to): the owner exits with
    the stream still running here. It hands the stream off as a drain does
    (released, its reader told `retry:`), so the client continues on b whole,
    exactly once. It once cancelled every such stream (`gateway_shutdown`),
    where a SIGKILL would have lost none: rolling-deploy lost streams so on a
    loaded machine."""
    replicas = start_replicas(redis_server.url, **REPLICA_ENV,
                              STREAMLAB_GATEWAY_DRAIN_GRACE_S="0")
    a, b = replicas.gateways["a"], replicas.gateways["b"]
    stream_id = create(http, a)
    stats = replicas.stats()
    before = read(http, a, stream_id, stop_after=5)
    os.kill(replicas.processes["a"].pid, signal.SIGTERM)
    wait_until(lambda: not processes.alive(replicas.processes["a"]), timeout_s=15.0,
               what="gateway a to exit")
    after = read(http, b, stream_id, last_event_id=before.last.id)
    assert exactly_once(before, after), (seqs(after.events), after.last)
    end = replicas.stats()
    assert (end.generations_reattached - stats.generations_reattached,
            end.generations_started - stats.generations_started) == (1, 0)


def test_delete_stops_a_generation_whose_owner_died_at_once_taken_over_or_not(
        redis_server: RedisServer, start_replicas: StartReplicas, http: httpx.Client) -> None:
    """A taken-over stream is b's to stop: DELETE sends the engine's explicit
    Cancel. And a DELETE on b while nobody has taken the stream over yet
    stops the orphan too, instead of leaving it to run out its grace (10 s)."""
    replicas = start_replicas(redis_server.url, **REPLICA_ENV)
    a, b = replicas.gateways["a"], replicas.gateways["b"]
    taken, orphan = create(http, a, tokens=5000, gap_ms=20), create(http, a, tokens=5000,
                                                                     gap_ms=20)
    first = read(http, a, taken, stop_after=5)
    processes.stop(replicas.processes["a"], grace_s=0)  # SIGKILL
    assert http.delete(f"{b}/v1/streams/{orphan}").json()["state"] == "cancelled"
    after = read(http, b, taken, last_event_id=first.last.id, stop_after=5)
    assert after.how == "stopped"  # b took it over: tokens flow again
    assert http.delete(f"{b}/v1/streams/{taken}").json()["state"] == "cancelled"
    for stream_id in (orphan, taken):
        record = wait_for_end(replicas.stats, stream_id, timeout_s=3.0)  # < the 10 s grace
        assert record is not None, stream_id
        assert record.state == pb.GENERATION_STATE_CANCELLED


def test_an_orphan_whose_engine_grace_ran_out_ends_the_resume_at_once(
        redis_server: RedisServer, start_replicas: StartReplicas, http: httpx.Client) -> None:
    """Nobody resumes until the engine's orphan grace (1 s here) is over: the
    engine has cancelled the generation, Attach answers NOT_FOUND, and the
    resume ends `cancelled` owner_lost within a bound (not pings forever)."""
    replicas = start_replicas(redis_server.url, {"STREAMLAB_ENGINE_ORPHAN_GRACE_S": "1"},
                              **REPLICA_ENV)
    stream_id = create(http, replicas.gateways["a"], tokens=5000, gap_ms=20)
    before = read(http, replicas.gateways["a"], stream_id, stop_after=5)
    expired = replicas.stats().generations_orphan_expired
    processes.stop(replicas.processes["a"], grace_s=0)  # SIGKILL
    wait_until(lambda: replicas.stats().generations_orphan_expired != expired, timeout_s=10.0,
               what="the engine to expire the orphan")
    started = time.monotonic()
    after = read(http, replicas.gateways["b"], stream_id, last_event_id=before.last.id)
    took = time.monotonic() - started
    print(f"\nresume after the orphan expired: terminal after {took * 1000:.0f} ms")
    assert after.last.event == "cancelled"
    assert json.loads(after.last.data) == {"reason": "owner_lost"}
    # The alive key (3 s) is gone by now or soon; then one quiet read, one Attach.
    assert took < 6.0
    assert replicas.stats().generations_reattached == 0


def restart(running: processes.Running, log_dir: Path) -> processes.Running:
    again = processes.start(running.spec, log_dir)
    processes.wait_ready(again)
    return again


def test_an_owner_restarted_under_the_same_name_does_not_hold_on_to_its_lost_streams(
        redis_server: RedisServer, start_replicas: StartReplicas, http: httpx.Client,
        tmp_path: Path) -> None:
    """The killed gateway comes back at once under the same replica name (a
    supervisor restarting it on its port) and sets its alive key again: that
    is a new process, which never had the stream's engine call. b must still
    take the stream over (the alive key holds the process's incarnation, which
    the meta records), not tail pings for as long as the stream's keys live."""
    replicas = start_replicas(redis_server.url, **REPLICA_ENV)
    stream_id = create(http, replicas.gateways["a"])
    before = read(http, replicas.gateways["a"], stream_id, stop_after=20)
    processes.stop(replicas.processes["a"], grace_s=0)  # SIGKILL
    again = restart(replicas.processes["a"], tmp_path / "restart")
    try:
        after = read(http, replicas.gateways["b"], stream_id, last_event_id=before.last.id)
    finally:
        processes.stop(again, grace_s=5.0)
    assert exactly_once(before, after), (seqs(after.events), after.last)


# A bench (figures over 4 runs, ~25 s): `make test-slow` runs it; the SIGKILL's
# correctness is the first test of this module, in CI.
@pytest.mark.slow
def test_bench_stall_across_a_sigkill(
        redis_server: RedisServer, start_replicas: StartReplicas, http: httpx.Client,
        tmp_path: Path) -> None:
    """The stall a client sees across a SIGKILL of the owner (its last token
    before to its first token after), over STREAMLAB_BENCH_RUNS runs (4 in
    the suite, each ~6 s, both roles twice; 10 or more for the figures in
    docs/resume.md): the owner's alive key must expire (3 s) before anyone
    takes over. The killed gateway is restarted after each run, and the roles
    alternate."""
    runs = int(os.environ.get("STREAMLAB_BENCH_RUNS", "4"))
    replicas = start_replicas(redis_server.url, **REPLICA_ENV)
    stalls: list[float] = []
    restarted: list[processes.Running] = []
    try:
        for run in range(runs):
            owner, other = ("a", "b") if run % 2 == 0 else ("b", "a")
            loss = kill_owner_and_resume(http, replicas, owner, other, kill_after=10)
            assert exactly_once(loss.before, loss.after), run
            stalls.append(loss.stall_s * 1000)
            replicas.processes[owner] = restart(replicas.processes[owner], tmp_path / "restart")
            restarted.append(replicas.processes[owner])
    finally:
        for running in restarted:
            processes.stop(running, grace_s=5.0)
    stalls.sort()
    print(f"\nstall across a SIGKILL, {runs} runs: median {statistics.median(stalls):.0f} ms, "
          f"min {stalls[0]:.0f} ms, max {stalls[-1]:.0f} ms; all: "
          + " ".join(f"{s:.0f}" for s in stalls))
