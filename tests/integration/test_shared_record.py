"""A stream's record (GET /v1/streams/{id}: attaches, readers, followers) is
one record across replicas: real redis-server, gateways "a" and "b", one
real engine (tests/integration/redis_fixtures.py).

The broken thing: each replica knew only its own readers (the owner listed
none of b's, b's `followers` counted only readers elsewhere), and the attach
records went to Redis in the background, so a status asked the moment a
reader's response opened (a browser's EventSource `onopen`) could miss it.
Here every status is asked right after a response opens, with no wait: a
record written after the response starts fails these assertions.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from services.gateway.resume.redis_client import CancelSafeRedis
from streamlab.lab import processes
from tests.integration.redis_fixtures import RedisServer, StartReplicas, create_stream
from tests.wait import wait_until

pytestmark = pytest.mark.integration

FOLLOWER_TTL_S = 1.5
REPLICA_ENV = {"STREAMLAB_GATEWAY_REDIS_TIMEOUT_S": "1",
               "STREAMLAB_GATEWAY_REDIS_FOLLOWER_TTL_S": str(FOLLOWER_TTL_S)}
TRIALS = 200  # cancels per client in the cancel test: a second or so
# Long enough that both readers are still reading while the test looks.
BODY = {"messages": [{"role": "user", "content": "one record"}],
        "streamlab": {"prefill_ms": 10, "token_gap_ms": 50, "answer_tokens": 400},
        "resume": {"retry_ms": 50}}


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=httpx.Timeout(10.0, connect=5.0)) as client:
        yield client


def token_ids(lines: Iterator[str], count: int) -> list[str]:
    """The ids of the next `count` token events of an open response's lines
    (one iterator per response, held while the response should stay open:
    dropping one closes the connection at once, and the gateway then drops
    the reader from the record)."""
    ids: list[str] = []
    event_id = ""
    deadline = time.monotonic() + 10.0
    for line in lines:
        assert time.monotonic() < deadline, f"{count} tokens not within 10 s"
        if line.startswith("id: "):
            event_id = line[4:]
        elif line == "event: token":
            ids.append(event_id)
            if len(ids) == count:
                return ids
    raise AssertionError(f"the stream ended before {count} tokens: {ids}")


def status(http: httpx.Client, base_url: str, stream_id: str) -> dict[str, Any]:
    response = http.get(f"{base_url}/v1/streams/{stream_id}")
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def record(answer: dict[str, Any]) -> tuple[Any, ...]:
    """The record's parts every replica must agree on."""
    return ([(a["replica"], a["last_event_id"]) for a in answer["attaches"]],
            # (None sorts first: a fresh reader's Last-Event-ID)
            sorted(((r["replica"], r["last_event_id"]) for r in answer["readers"]),
                   key=lambda reader: (reader[0], reader[1] or "")),
            answer["followers"])


def test_both_replicas_report_the_readers_attached_to_each(
        redis_server: RedisServer, start_replicas: StartReplicas, http: httpx.Client) -> None:
    replicas = start_replicas(redis_server.url, **REPLICA_ENV)
    a, b = replicas.gateways["a"], replicas.gateways["b"]
    stream_id = create_stream(http, a, BODY)
    events = f"/v1/streams/{stream_id}/events"
    headers = {"Accept": "text/event-stream"}
    with http.stream("GET", a + events, headers=headers) as first:
        assert first.status_code == 200
        first_lines = first.iter_lines()
        seen = token_ids(first_lines, 3)[-1]
        with http.stream("GET", b + events, headers={**headers, "Last-Event-ID": seen}
                         ) as second:
            assert second.status_code == 200
            # Asked the moment b's response opened, on each replica: both readers.
            expected = ([("a", None), ("b", seen)], [("a", None), ("b", seen)], 2)
            answers = {name: status(http, url, stream_id) for name, url in (("a", a), ("b", b))}
            for name, answer in answers.items():
                assert record(answer) == expected, (name, answer)
                assert [r["resumed_after"] for r in answer["readers"]
                        if r["replica"] == "b"] == [3], name
            token_ids(second.iter_lines(), 1)  # b's reader really reads
        # b's reader left: both replicas drop it from `readers` (its removal is
        # written in the background: poll), and keep its attach.
        for url in (a, b):
            wait_until(lambda url=url: status(http, url, stream_id)["followers"] == 1,  # type: ignore[misc]
                       timeout_s=5.0, interval_s=0.02, what=f"one reader left on {url}")
            answer = status(http, url, stream_id)
            assert record(answer) == ([("a", None), ("b", seen)], [("a", None)], 1), answer


def test_a_killed_replicas_readers_leave_the_record_within_the_follower_ttl(
        redis_server: RedisServer, start_replicas: StartReplicas, http: httpx.Client) -> None:
    """b dies (SIGKILL) with a reader: nobody removes it, so its presence must
    expire (refreshed every third of the TTL while it reads, never after)."""
    replicas = start_replicas(redis_server.url, **REPLICA_ENV)
    a, b = replicas.gateways["a"], replicas.gateways["b"]
    stream_id = create_stream(http, a, BODY)
    events = f"/v1/streams/{stream_id}/events"
    with http.stream("GET", b + events, headers={"Accept": "text/event-stream"}) as reader:
        lines = reader.iter_lines()
        token_ids(lines, 2)
        # Still listed after more than one TTL: its replica refreshes it.
        time.sleep(FOLLOWER_TTL_S * 1.5)  # the time it must outlive, not a sync point
        token_ids(lines, 1)
        assert status(http, a, stream_id)["followers"] == 1
        processes.stop(replicas.processes["b"], grace_s=0)  # SIGKILL
        killed_at = time.monotonic()
        wait_until(lambda: status(http, a, stream_id)["followers"] == 0, timeout_s=10.0,
                   interval_s=0.05, what="the dead replica's reader gone from the record")
        gone_after = time.monotonic() - killed_at
    print(f"\na killed replica's reader left the record after {gone_after:.2f} s "
          f"(follower TTL {FOLLOWER_TTL_S} s)")
    assert gone_after <= FOLLOWER_TTL_S + 1.0
    assert [r["replica"] for r in status(http, a, stream_id)["attaches"]] == ["b"]


def test_one_gateway_with_the_memory_store_keeps_the_same_record(
        start_replicas: StartReplicas, http: httpx.Client) -> None:
    """The single-gateway default answers in the same shape: its readers from
    its own memory, listed while they read, gone when they leave."""
    replicas = start_replicas(None)
    a = replicas.gateways["a"]
    stream_id = create_stream(http, a, BODY)
    events = f"{a}/v1/streams/{stream_id}/events"
    with http.stream("GET", events, headers={"Accept": "text/event-stream"}) as first:
        seen = token_ids(first.iter_lines(), 2)[-1]
    with http.stream("GET", events, headers={"Last-Event-ID": seen}) as second:
        # Held, not dropped: a dropped line iterator closes the connection at
        # once (httpcore closes it when its byte stream is unwound), so the
        # gateway rightly drops the reader, and the status below raced that.
        second_lines = second.iter_lines()
        token_ids(second_lines, 1)
        answer = status(http, a, stream_id)
        assert record(answer) == ([("a", None), ("a", seen)], [("a", seen)], 1), answer
    wait_until(lambda: status(http, a, stream_id)["followers"] == 0, timeout_s=5.0,
               interval_s=0.02, what="the reader gone once it left")
    assert status(http, a, stream_id)["readers"] == []


# ---- a reader's cancel under a Redis read ------------------------------------------
# A follower's body reads Redis in a loop (XREAD, its presence's pipeline); when
# its client leaves, the gateway cancels the body once. redis-py's sends go
# through asyncio.wait_for, which on Python 3.11 loses a cancel that lands in
# the tick its send completes: the body then streamed to nobody and its reader
# stayed in the record (services/gateway/resume/redis_client.py).

async def _reads_after_cancel(client: Redis, ticks: int) -> int:
    """Cancel a loop of XREADs (a tail's) once, `ticks` loop ticks after it
    starts; how many XREADs it finished after the cancel (0: the cancel ended
    it; 2: the cancel was lost and it went on reading)."""
    reads = [0]
    cancelled_at: list[int] = []
    went_on = asyncio.Event()
    stop = asyncio.Event()

    async def tail_like() -> None:
        while not stop.is_set():
            await client.xread({"s": "0-0"}, count=1, block=1)
            reads[0] += 1
            if cancelled_at and reads[0] >= cancelled_at[0] + 2:
                went_on.set()

    task = asyncio.create_task(tail_like())
    for _ in range(ticks):
        await asyncio.sleep(0)
    cancelled_at.append(reads[0])
    task.cancel()
    # Whichever comes first: the end (the cancel taken) or two more reads (lost).
    watcher = asyncio.create_task(went_on.wait())
    await asyncio.wait({task, watcher}, timeout=10.0, return_when=asyncio.FIRST_COMPLETED)
    watcher.cancel()
    if task.done():
        assert task.cancelled()
        return 0
    assert went_on.is_set(), "neither ended nor read on within 10 s"
    lost = reads[0] - cancelled_at[0]
    stop.set()  # not a second cancel: it may be lost as well
    await task
    return lost


@pytest.mark.anyio
async def test_a_reader_cancelled_mid_redis_call_ends_at_once(redis_server: RedisServer) -> None:
    """The gateway's client ends on the one cancel, at every point of a read
    loop; the plain redis-py client, at the same points, loses some (on
    Python 3.11: which shows the test reaches the moment that matters)."""
    lost: dict[str, list[int]] = {}
    for name, cls in (("gateway", CancelSafeRedis), ("plain", Redis)):
        client = cls.from_url(redis_server.url, socket_timeout=2.0, decode_responses=True)
        try:
            await client.xadd("s", {"k": "v"})
            lost[name] = [ticks for ticks in range(TRIALS)
                          if await _reads_after_cancel(client, ticks % 40) > 0]
        finally:
            await client.aclose()
    print(f"\ncancels lost in {TRIALS} tries: gateway client {len(lost['gateway'])}, "
          f"plain redis-py {len(lost['plain'])} (Python {sys.version.split()[0]})")
    assert lost["gateway"] == [], lost["gateway"]
    if sys.version_info < (3, 12):  # wait_for no longer loses a cancel from 3.12 on
        assert lost["plain"], "no try landed in the send's tick: the test proves nothing"
