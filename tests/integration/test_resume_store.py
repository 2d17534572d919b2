"""The resume log shared by gateway replicas in Redis: real redis-server, two
real gateway processes ("a" and "b") and one real engine (the fake model).

Each verdict is shown against the broken thing it guards against: with the
memory store (each replica its own registry) a resume on the other replica is
404, and the store fault tests bound what a hang would exceed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import statistics
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from services.engine.backends.fake import token_text
from services.gateway.resume.redis_keys import replica_key
from services.gateway.resume.redis_store import KEY_PREFIX
from streamlab.experiments.generation_end import wait_for_end
from streamlab.lab import processes
from streamlab.lab.toxiproxy import Toxic
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.sse import Event, SSEDecoder
from tests.integration.redis_fixtures import (
    RedisServer,
    Replicas,
    StartReplicas,
    StoreHop,
    create_stream,
)
from tests.wait import wait_until

pytestmark = pytest.mark.integration

TOKENS, GAP_MS = 30, 15
EXPECTED = "".join(token_text(i) for i in range(TOKENS))
TERMINAL = {"done", "error", "cancelled"}
# A resume while Redis cannot answer must be answered within this (the
# gateway's redis_timeout_s is 1 s here; the rest is slack for a busy machine).
STORE_FAULT_BOUND_S = 4.0
# No read may outlast this, pings or not: a stream that never ends fails the test.
READ_DEADLINE_S = 20.0
REPLICA_ENV = {"STREAMLAB_GATEWAY_REDIS_TIMEOUT_S": "1",
               "STREAMLAB_GATEWAY_REDIS_FOLLOWER_TTL_S": "1.5"}


def body(tokens: int = TOKENS, gap_ms: int = GAP_MS, **resume: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "share me"}],
            "streamlab": {"prefill_ms": 10, "token_gap_ms": gap_ms, "answer_tokens": tokens},
            "resume": {"retry_ms": 50, **resume}}


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    # The read timeout is every test's watchdog: no test can hang on a stream.
    with httpx.Client(timeout=httpx.Timeout(10.0, connect=5.0)) as client:
        yield client


def create(http: httpx.Client, base_url: str, **kwargs: Any) -> str:
    return create_stream(http, base_url, body(**kwargs))


def read_events(http: httpx.Client, base_url: str, stream_id: str,
                last_event_id: str | None = None, stop_after: int | None = None
                ) -> tuple[httpx.Response, list[Event]]:
    """The events of one GET (up to the terminal one, or `stop_after` tokens)."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    events: list[Event] = []
    decoder = SSEDecoder()
    deadline = time.monotonic() + READ_DEADLINE_S
    with http.stream("GET", f"{base_url}/v1/streams/{stream_id}/events",
                     headers=headers) as response:
        if response.status_code != 200:
            response.read()
            return response, events
        for chunk in response.iter_bytes():
            assert time.monotonic() < deadline, f"no end after {READ_DEADLINE_S} s: {events[-3:]}"
            for item in decoder.feed(chunk):
                if not isinstance(item, Event):
                    continue
                events.append(item)
                tokens = sum(1 for e in events if e.event == "token")
                if item.event in TERMINAL or (stop_after is not None and tokens >= stop_after):
                    return response, events
    return response, events


def text_of(events: list[Event]) -> str:
    return "".join(json.loads(e.data)["text"] for e in events if e.event == "token")


def seqs(events: list[Event]) -> list[int]:
    return [int(e.id.rsplit(":", 1)[1]) for e in events if e.event != "gap"]


def resume_on_b(http: httpx.Client, replicas: Replicas) -> tuple[httpx.Response, list[Event],
                                                                   list[Event]]:
    """Read 10 tokens on a, then resume on b after the last id seen."""
    a, b = replicas.gateways["a"], replicas.gateways["b"]
    stream_id = create(http, a)
    _, first = read_events(http, a, stream_id, stop_after=10)
    response, rest = read_events(http, b, stream_id, last_event_id=first[-1].id)
    return response, first, rest


def test_a_resume_on_another_replica_gets_exactly_the_events_after_last_event_id(
        redis_server: RedisServer, start_replicas: StartReplicas, http: httpx.Client) -> None:
    replicas = start_replicas(redis_server.url, **REPLICA_ENV)
    response, first, rest = resume_on_b(http, replicas)
    assert response.status_code == 200, response.text
    assert seqs(first) == list(range(1, 11))
    assert seqs(rest) == list(range(11, TOKENS + 2))  # the tokens after 10, then `done`
    assert rest[-1].event == "done"
    assert text_of(first) + text_of(rest) == EXPECTED  # the full text exactly once

    # A completed stream's text, read from the start on either replica.
    stream_id = first[0].id.split(":")[0]
    for name in ("a", "b"):
        _, whole = read_events(http, replicas.gateways[name], stream_id)
        assert text_of(whole) == EXPECTED, name
        assert whole[-1].event == "done", name
    # The client has the end: 204 from the other replica too, as from the owner.
    last = rest[-1].id
    assert http.get(f"{replicas.gateways['b']}/v1/streams/{stream_id}/events",
                    headers={"Last-Event-ID": last}).status_code == 204
    status = http.get(f"{replicas.gateways['b']}/v1/streams/{stream_id}").json()
    assert (status["state"], status["last_seq"], status["replica"]) == ("completed",
                                                                        TOKENS + 1, "a")
    # Either replica's status lists every reader, wherever it attached: the
    # first read on a, the resume on b with the id it sent (each replica used to
    # list only its own: the owner none of b's, b an empty list).
    for name in ("a", "b"):
        attaches = attaches_within(http, replicas.gateways[name], stream_id, count=4)
        assert attaches[0]["last_event_id"] is None, name
        assert attaches[1]["last_event_id"] == first[-1].id, name
        assert attaches[1]["resumed_after"] == 10, name


def attaches_within(http: httpx.Client, base_url: str, stream_id: str, count: int,
                    timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """The status's attach records once there are `count` (each replica writes
    its readers' records to Redis in the background, a few ms after they attach)."""
    def enough() -> list[dict[str, Any]]:
        attaches: list[dict[str, Any]] = http.get(
            f"{base_url}/v1/streams/{stream_id}").json()["attaches"]
        return attaches if len(attaches) >= count else []
    attaches = wait_until(enough, timeout_s=timeout_s, interval_s=0.02,
                          what=f"{count} attach records in {stream_id}'s status")
    assert len(attaches) == count, attaches
    return attaches


def metric(http: httpx.Client, base_url: str, name: str) -> float:
    for line in http.get(f"{base_url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} is not among {base_url}'s metrics")


def test_the_owner_writes_the_log_in_batches_not_a_round_trip_per_token(
        redis_server: RedisServer, start_replicas: StartReplicas, http: httpx.Client) -> None:
    """Tokens that arrive faster than a Redis round trip share a pipeline; the
    text is still whole on the other replica."""
    replicas = start_replicas(redis_server.url, **REPLICA_ENV)
    a, b = replicas.gateways["a"], replicas.gateways["b"]
    stream_id = create(http, a, tokens=2000, gap_ms=0)
    read_events(http, a, stream_id)
    _, events = read_events(http, b, stream_id)
    assert seqs(events) == list(range(1, 2002))
    written = metric(http, a, "streamlab_gateway_resume_store_events_total")
    batches = metric(http, a, "streamlab_gateway_resume_store_batches_total")
    print(f"\n{written:.0f} events in {batches:.0f} pipelines")
    assert written == 2001
    assert batches < written / 2


def test_with_the_memory_store_a_resume_on_another_replica_is_404(
        start_replicas: StartReplicas, http: httpx.Client) -> None:
    """The broken case the shared store fixes: the verdict above fails here."""
    replicas = start_replicas(None)
    response, first, rest = resume_on_b(http, replicas)
    assert (response.status_code, len(first), rest) == (404, 10, [])


def test_the_answers_on_another_replica_match_the_owners(
        redis_server: RedisServer, start_replicas: StartReplicas, http: httpx.Client) -> None:
    replicas = start_replicas(redis_server.url, **REPLICA_ENV)
    a, b = replicas.gateways["a"], replicas.gateways["b"]
    stream_id = create(http, a, tokens=3, gap_ms=1)
    read_events(http, a, stream_id)
    for base in (a, b):
        events_url = f"{base}/v1/streams/{stream_id}/events"
        assert http.get(events_url, headers={"Last-Event-ID": f"{stream_id}:99"}
                        ).status_code == 400
        assert http.get(events_url, headers={"Last-Event-ID": "nope"}).status_code == 400
        assert http.get(f"{base}/v1/streams/{'0' * 32}/events").status_code == 404
        # Another identity learns nothing: 404, as for an id that never existed.
        # (the peer is a trusted proxy, so X-Forwarded-For is the client's address)
        assert http.get(events_url, headers={"X-Forwarded-For": "10.9.9.9"}
                        ).status_code == 404
        assert http.delete(f"{base}/v1/streams/{stream_id}",
                           headers={"X-Forwarded-For": "10.9.9.9"}).status_code == 404
    expired = create(http, a, tokens=1, gap_ms=1, ttl_s=0)
    wait_until(lambda: http.get(f"{b}/v1/streams/{expired}").status_code == 410, timeout_s=5,
               what="a stream with a 0 s TTL to be gone (410) on the other replica")


def test_delete_on_one_replica_cancels_the_engine_call_owned_by_another(
        redis_server: RedisServer, start_replicas: StartReplicas, http: httpx.Client) -> None:
    replicas = start_replicas(redis_server.url, **REPLICA_ENV)
    stream_id = create(http, replicas.gateways["a"], tokens=5000, gap_ms=10)
    response = http.delete(f"{replicas.gateways['b']}/v1/streams/{stream_id}")
    assert response.status_code == 200, response.text
    assert (response.json()["state"], response.json()["cancel_reason"]) == (
        "cancelled", "client_cancelled")
    record = wait_for_end(replicas.stats, stream_id, timeout_s=5.0)
    assert record is not None
    assert record.state == pb.GENERATION_STATE_CANCELLED
    assert record.tokens_generated < 5000
    # Its readers anywhere get the terminal event.
    _, events = read_events(http, replicas.gateways["b"], stream_id)
    assert events[-1].event == "cancelled"


def test_a_reader_on_another_replica_keeps_the_owners_grace_timer_off(
        redis_server: RedisServer, start_replicas: StartReplicas, http: httpx.Client) -> None:
    """Nobody reads on a (the owner): without b's reader counting, a would
    cancel after its attach timeout (1 s) while b is still reading."""
    replicas = start_replicas(redis_server.url, STREAMLAB_GATEWAY_RESUME_ATTACH_TIMEOUT_S="1",
                              **REPLICA_ENV)
    stream_id = create(http, replicas.gateways["a"], tokens=150, gap_ms=20, grace_s=0.5)
    response, events = read_events(http, replicas.gateways["b"], stream_id)
    assert response.status_code == 200
    assert events[-1].event == "done", events[-1]  # 3 s of tokens, never cancelled
    assert seqs(events) == list(range(1, 152))

    # And when b's reader leaves for good, a cancels after the grace.
    left = create(http, replicas.gateways["a"], tokens=5000, gap_ms=10, grace_s=0.5)
    read_events(http, replicas.gateways["b"], left, stop_after=5)
    record = wait_for_end(replicas.stats, left, timeout_s=8.0)
    assert record is not None
    assert record.state == pb.GENERATION_STATE_CANCELLED
    status = http.get(f"{replicas.gateways['b']}/v1/streams/{left}").json()
    assert status["cancel_reason"] == "resume_grace_expired"


def test_a_reader_elsewhere_gets_an_end_when_the_owner_dies(
        redis_server: RedisServer, start_replicas: StartReplicas, http: httpx.Client) -> None:
    """SIGKILL the owner mid-stream with re-attach off (the broken mode;
    tests/integration/test_replica_loss.py has the re-attach): nobody takes
    the generation over, and a reader on b gets `cancelled` {"reason":
    "owner_lost"} instead of pings forever."""
    replicas = start_replicas(redis_server.url, STREAMLAB_GATEWAY_REATTACH="false",
                              **REPLICA_ENV)
    stream_id = create(http, replicas.gateways["a"], tokens=5000, gap_ms=20)
    _, first = read_events(http, replicas.gateways["b"], stream_id, stop_after=3)
    processes.stop(replicas.processes["a"], grace_s=0)  # SIGKILL
    _, rest = read_events(http, replicas.gateways["b"], stream_id,
                          last_event_id=first[-1].id)
    assert rest[-1].event == "cancelled"
    assert json.loads(rest[-1].data) == {"reason": "owner_lost"}
    assert seqs(rest) == list(range(seqs(first)[-1] + 1, seqs(rest)[-1] + 1))  # no hole
    assert http.delete(f"{replicas.gateways['b']}/v1/streams/{stream_id}").json()[
        "state"] == "cancelled"


def test_bench_cancel_across_replicas(
        redis_server: RedisServer, start_replicas: StartReplicas, http: httpx.Client) -> None:
    """DELETE on b → the engine call owned by a cancelled (the engine's own
    CLOCK_MONOTONIC cancel time minus the client's before the DELETE). Prints
    figures; a busy shared machine makes a timed assertion noise."""
    replicas = start_replicas(redis_server.url, **REPLICA_ENV)
    latencies = []
    for run in range(51):
        stream_id = create(http, replicas.gateways["a"], tokens=5000, gap_ms=10)
        sent = time.monotonic()
        assert http.delete(f"{replicas.gateways['b']}/v1/streams/{stream_id}").status_code == 200
        record = wait_for_end(replicas.stats, stream_id, timeout_s=5.0)
        assert record is not None
        assert record.state == pb.GENERATION_STATE_CANCELLED
        if run == 0:  # the first opens b's Redis connections: a cost of its own
            print(f"\nfirst cancel across replicas: {(record.cancelled_at - sent) * 1000:.1f} ms")
            continue
        latencies.append((record.cancelled_at - sent) * 1000)
    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    print(f"\ncancel across replicas (DELETE on b → engine cancel of a's call), "
          f"{len(latencies)} runs: p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {latencies[-1]:.1f} ms")


@pytest.mark.parametrize("fault", ["stopped", "frozen"])
def test_a_resume_while_redis_is_down_is_a_clear_error_and_the_owner_keeps_streaming(
        fault: str, redis_server: RedisServer, start_replicas: StartReplicas,
        http: httpx.Client) -> None:
    """`stopped`: connections refused. `frozen` (SIGSTOP): connections accepted
    and never answered, the case an unbounded client would hang on."""
    replicas = start_replicas(redis_server.url, **REPLICA_ENV)
    a, b = replicas.gateways["a"], replicas.gateways["b"]
    stream_id = create(http, a, tokens=60, gap_ms=20)
    with http.stream("GET", f"{a}/v1/streams/{stream_id}/events") as live:
        decoder, events = SSEDecoder(), list[Event]()
        chunks = live.iter_bytes()
        while sum(1 for e in events if e.event == "token") < 5:
            events += [i for i in decoder.feed(next(chunks)) if isinstance(i, Event)]
        assert redis_server.running is not None
        pid = redis_server.running.pid
        if fault == "stopped":
            redis_server.stop()
        else:
            os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            response = http.get(f"{b}/v1/streams/{stream_id}/events",
                                headers={"Last-Event-ID": events[-1].id})
            took = time.monotonic() - started
            # Not a 503 (an EventSource closes on it for good): a 200 whose one
            # event says "come back" (no id: the client keeps its own), then the end
            # of the response, which an EventSource answers by reconnecting.
            assert response.status_code == 200, response.text
            again = SSEDecoder()
            again.last_event_id = events[-1].id  # what an event without `id:` keeps
            told = [i for i in again.feed(response.content) if isinstance(i, Event)]
            assert [(e.event, e.id) for e in told] == [("retry", events[-1].id)], told
            assert json.loads(told[0].data)["code"] == "resume_store_unavailable"
            assert json.loads(told[0].data)["retryable"] is True
            assert response.headers["last-event-id"] == events[-1].id
            assert took < STORE_FAULT_BOUND_S, took
            # The owner's attached client keeps getting the live stream.
            for chunk in chunks:
                events += [i for i in decoder.feed(chunk) if isinstance(i, Event)]
                if events[-1].event in TERMINAL:
                    break
            assert events[-1].event == "done"
            assert text_of(events) == "".join(token_text(i) for i in range(60))
            # ...and the failed writes are counted.
            assert metric(http, a, "streamlab_gateway_resume_store_write_failures_total") > 0
            # A stream nobody else could find is not started.
            refused = http.post(f"{a}/v1/streams", json=body())
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "resume_store_unavailable"
        finally:
            if fault == "frozen":
                os.kill(pid, signal.SIGCONT)
    if fault == "frozen":
        # Redis is back with its data: the owner's retried writes land, and a
        # resume on b gets exactly the rest of the text.
        resumed_after = 5
        def resumed() -> list[Event]:
            response, rest = read_events(http, b, stream_id,
                                         last_event_id=f"{stream_id}:{resumed_after}")
            if response.status_code == 200 and rest and rest[-1].event == "done":
                return rest
            return []  # not yet: the owner's retried writes have not landed
        rest = wait_until(resumed, timeout_s=10, interval_s=0.1,
                          what="a resume on b that reads on to `done`")
        assert seqs(rest) == list(range(resumed_after + 1, 62))
        assert text_of(rest) == "".join(token_text(i) for i in range(resumed_after, 60))


def test_a_store_outage_longer_than_the_alive_key_does_not_hand_a_live_stream_over(
        redis_server: RedisServer, store_hop: StoreHop, start_replicas: StartReplicas,
        http: httpx.Client) -> None:
    """The store hop black-holed for longer than the owner's alive key lives
    (3 s): the key expires in the outage although the owner runs on,
    and comes back only when the owner's control loop is past its reconnect
    backoff. A reader on the other replica, reading through it all as an
    EventSource would, must not take that for a dead owner once the store is
    back: a take-over then is split-brain (its Attach replaced the owner's
    call, which ended the stream `error` for every reader: 2 of 10 live
    streams in store-faults). It reads on, and gets the whole text once, from
    the log the owner keeps writing.

    When the owner's key is back depends on where its reconnect backoff was
    when the store came back (0-2 s later), so the test holds that moment
    open: for 2 s after the outage it deletes the owner's key as fast as the
    owner writes it, as a slow owner would leave it missing."""
    replicas = start_replicas(store_hop.url, **REPLICA_ENV)
    a, b = replicas.gateways["a"], replicas.gateways["b"]
    # 15 s, live through the outage; a token every 1.5 s, far longer than b's
    # blocking read of the log (1/3 s), so b asks after the owner between tokens.
    tokens = 10
    stream_id = create(http, a, tokens=tokens, gap_ms=1500)
    events: list[Event] = []

    def read_on_b() -> None:
        """From the last event seen until the end: `event: retry` (the store
        is down) is not the end; reconnect, as an EventSource."""
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            headers = {"Last-Event-ID": events[-1].id} if events else {}
            with contextlib.suppress(httpx.HTTPError), http.stream(
                    "GET", f"{b}/v1/streams/{stream_id}/events", headers=headers) as response:
                decoder = SSEDecoder()
                for chunk in response.iter_bytes() if response.status_code == 200 else ():
                    for item in decoder.feed(chunk):
                        # `retry` says "come back", it is no part of the stream.
                        if (isinstance(item, Event) and item.event != "retry"
                                and (not events or item.id != events[-1].id)):
                            events.append(item)
                            if item.event in TERMINAL:
                                return
            time.sleep(0.1)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        reader = pool.submit(read_on_b)
        wait_until(lambda: len(events) >= 2, timeout_s=10.0, interval_s=0.02,
                   what="b's reader under way")
        store_hop.toxiproxy.add_toxic("store", Toxic("timeout", {"timeout": 0}, "upstream"))
        try:
            # The outage: long enough for the owner's control loop to be deep in
            # its reconnect backoff (0.8-1.6 s) when the store is back, so its
            # key comes back after a reader elsewhere first looks for it.
            time.sleep(6.0)
        finally:
            store_hop.toxiproxy.reset()
        with redis.Redis.from_url(redis_server.url, socket_timeout=1.0) as direct:
            held_until = time.monotonic() + 2.0
            while time.monotonic() < held_until:
                direct.delete(replica_key(KEY_PREFIX, "a"))
                time.sleep(0.01)
        reader.result(timeout=60)
    assert events, "b read nothing"
    assert events[-1].event == "done", events[-3:]
    assert seqs(events) == list(range(1, tokens + 2))
    assert text_of(events) == "".join(token_text(i) for i in range(tokens))
    # A labelled counter appears once counted: absent is none.
    reattached = 'streamlab_gateway_resume_takeovers_total{outcome="reattached"}'
    takeovers = [line for line in http.get(f"{b}/metrics").text.splitlines()
                 if line.startswith(reattached) and float(line.split()[-1]) > 0]
    assert not takeovers, f"b took over a stream whose owner was alive: {takeovers}"



def test_a_store_that_does_not_answer_the_first_reader_check_cancels_nothing(
        redis_server: RedisServer, store_hop: StoreHop, start_replicas: StartReplicas,
        http: httpx.Client) -> None:
    """The owner's "did anyone attach?" check (the attach timeout, 1.5 s here)
    meets a black-holed store: a store that does not answer is no proof that
    nobody reads on another replica, so the owner decides after a grace, not
    now; the reader that comes to b once the store is back reads the whole
    answer. Broken (as it was): the stream ended `cancelled never_attached`
    at the check, as in rolling-deploy at load 6, where the store's answers
    were late."""
    replicas = start_replicas(store_hop.url, **REPLICA_ENV,
                              STREAMLAB_GATEWAY_RESUME_ATTACH_TIMEOUT_S="1.5")
    tokens = 60  # 6 s: running through the outage and after it
    stream_id = create(http, replicas.gateways["a"], tokens=tokens, gap_ms=100)
    store_hop.toxiproxy.add_toxic("store", Toxic("timeout", {"timeout": 0}, "upstream"))
    try:
        # The outage covers the check (1.5 s after the create) and its 1 s
        # store timeout: the fault's own length, not a wait for anything.
        time.sleep(3.0)
    finally:
        store_hop.toxiproxy.reset()
    response, events = read_events(http, replicas.gateways["b"], stream_id)
    assert response.status_code == 200
    assert events, "b read nothing"
    assert events[-1].event == "done", events[-2:]
    assert text_of(events) == "".join(token_text(i) for i in range(tokens))


def test_a_grace_of_zero_holds_for_a_reader_on_another_replica(
        redis_server: RedisServer, start_replicas: StartReplicas, http: httpx.Client) -> None:
    """Grace 0 (cancel when the client leaves), the client reading on b: b
    tells a that its reader left, and a cancels at once. Broken (as it was):
    a learnt it at its next look at the store, a third of the follower TTL
    (6 s here: 2 s) later, and the engine generated on for nobody."""
    replicas = start_replicas(redis_server.url, STREAMLAB_GATEWAY_REDIS_TIMEOUT_S="1",
                              STREAMLAB_GATEWAY_REDIS_FOLLOWER_TTL_S="6")
    stream_id = create(http, replicas.gateways["a"], tokens=5000, gap_ms=10, grace_s=0)
    read_events(http, replicas.gateways["b"], stream_id, stop_after=5)
    left_at = time.monotonic()
    record = wait_for_end(replicas.stats, stream_id, timeout_s=8.0)
    took = time.monotonic() - left_at
    assert record is not None
    assert record.state == pb.GENERATION_STATE_CANCELLED
    assert took < 1.0, f"cancelled {took:.2f} s after the reader elsewhere left"
