"""The job store's bookkeeping without an engine: views by index and the TTL sweep."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from services.gateway.jobs import Job, JobMetrics, JobStore


def store_with(ttl_s: float, *jobs: Job) -> JobStore:
    store = JobStore(ttl_s, JobMetrics(CollectorRegistry()))
    for job in jobs:
        store._jobs[job.id] = job
    return store


def test_view_returns_tokens_from_an_index_and_the_next_one() -> None:
    job = Job(id="j", request_id="r", tokens=["a ", "b ", "c "])
    assert job.view(1) == {"id": "j", "object": "job", "tokens": ["b ", "c "], "next": 3,
                           "done": False, "finish_reason": None, "error": None}
    assert job.view(10)["next"] == 10
    assert job.view(10)["tokens"] == []


def test_expire_deletes_only_jobs_idle_past_the_ttl() -> None:
    idle = Job(id="idle", request_id="1", last_seen=100.0)
    fresh = Job(id="fresh", request_id="2", last_seen=109.5)
    waiting = Job(id="waiting", request_id="3", last_seen=100.0, waiters=1)
    store = store_with(5.0, idle, fresh, waiting)

    assert [j.id for j in store.expire(now=110.0)] == ["idle"]
    assert len(store) == 2  # a long poller holding the job keeps it alive


def test_ttl_zero_keeps_everything() -> None:
    store = store_with(0.0, Job(id="old", request_id="1", last_seen=0.0))
    assert store.expire(now=1e9) == []
    assert len(store) == 1
