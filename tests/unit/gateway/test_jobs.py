"""The job store's bookkeeping without an engine: views by index and the TTL sweep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from services.gateway.jobs import Job, JobMetrics, JobStore, job_ttl


def store_with(ttl_s: float, *jobs: Job) -> JobStore:
    store = JobStore(ttl_s, JobMetrics(CollectorRegistry()))
    for job in jobs:
        store._jobs[job.id] = job
    return store


def test_view_returns_tokens_from_an_index_and_the_next_one() -> None:
    job = Job(id="j", request_id="r", ttl_s=30.0, tokens=["a ", "b ", "c "])
    assert job.view(1) == {"id": "j", "object": "job", "tokens": ["b ", "c "], "next": 3,
                           "done": False, "finish_reason": None, "error": None}
    assert job.view(10)["next"] == 10
    assert job.view(10)["tokens"] == []


def test_expire_deletes_only_jobs_idle_past_the_ttl() -> None:
    idle = Job(id="idle", request_id="1", ttl_s=5.0, last_seen=100.0)
    fresh = Job(id="fresh", request_id="2", ttl_s=5.0, last_seen=109.5)
    waiting = Job(id="waiting", request_id="3", ttl_s=5.0, last_seen=100.0, waiters=1)
    store = store_with(5.0, idle, fresh, waiting)

    assert [j.id for j in store.expire(now=110.0)] == ["idle"]
    assert len(store) == 2  # a long poller holding the job keeps it alive


def test_ttl_zero_keeps_everything() -> None:
    store = store_with(0.0, Job(id="old", request_id="1", ttl_s=0.0, last_seen=0.0))
    assert store.expire(now=1e9) == []
    assert len(store) == 1


def test_each_job_expires_by_its_own_ttl() -> None:
    short = Job(id="short", request_id="1", ttl_s=1.0, last_seen=100.0)
    default = Job(id="default", request_id="2", ttl_s=30.0, last_seen=100.0)
    never = Job(id="never", request_id="3", ttl_s=0.0, last_seen=0.0)
    store = store_with(30.0, short, default, never)

    assert [j.id for j in store.expire(now=102.0)] == ["short"]
    assert [j.id for j in store.expire(now=131.0)] == ["default"]
    assert [j.id for j in store.expire(now=1e9)] == []  # the leak: kept forever
    assert len(store) == 1


def test_the_reaper_wakes_often_enough_for_the_shortest_ttl() -> None:
    assert store_with(0.0).reap_interval() == 1.0  # nothing to reap soon
    assert store_with(30.0).reap_interval() == 1.0
    assert store_with(30.0, Job(id="j", request_id="1", ttl_s=0.4)).reap_interval() == 0.1
    assert store_with(0.0, Job(id="j", request_id="1", ttl_s=0.01)).reap_interval() == 0.05


def test_a_request_may_shorten_the_ttl_but_never_lengthen_it() -> None:
    assert job_ttl(30.0, None) == 30.0
    assert job_ttl(30.0, 1.0) == 1.0
    assert job_ttl(30.0, 0.0) == 0.0  # never: a broken mode, gated at admission
    assert job_ttl(0.0, 5.0) == 5.0  # a gateway without a TTL: any TTL shortens "never"
    assert job_ttl(30.0, 60.0) == 30.0  # cut to the operator's bound, like /v1/streams


class EndlessLease:
    """Stands in for the lease of an engine call that never ends: the pump waits on it."""

    request_id = "endless"
    client_key = "addr:127.0.0.1"

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    async def events(self) -> AsyncIterator[object]:
        await asyncio.Event().wait()
        yield None  # never reached

    def close(self) -> None:
        self.cancelled.set()


@pytest.mark.anyio
async def test_a_job_with_a_shorter_ttl_wakes_a_sleeping_reaper() -> None:
    """The reaper sleeps a quarter of the store's TTL (1 s, at most, here); a job
    started with a 0.2 s TTL must be reaped about 0.25 s later, not after 1 s."""
    store = store_with(30.0)
    store.open()
    try:
        await asyncio.sleep(0)  # one loop turn: the reaper runs up to its first wait
        assert store._sleeping_for == 1.0  # asleep for the store's pace (30 s / 4, capped)
        default = store.start(EndlessLease())  # type: ignore[arg-type]
        assert default.ttl_s == 30.0
        stream = EndlessLease()
        started = time.monotonic()
        store.start(stream, ttl_s=0.2)  # type: ignore[arg-type]
        async with asyncio.timeout(2.0):
            await stream.cancelled.wait()
        # 0.2 s + one 50 ms interval; the old pace would have taken the full 1 s.
        assert time.monotonic() - started < 0.8
        assert len(store) == 1  # the default-TTL job is still there
    finally:
        await store.close()
