"""Polling jobs: an engine stream collected into a list that clients read by index.

Short and long polling need state between requests, so a job outlives the
request that started it. Who owns what:

- `JobStore` owns every job and the task that pumps its engine stream
  (`_pump`); the task's done-callback closes the job's `EngineLease`
  (services/gateway/lease.py), so cancelling the task is what stops the engine.
- A job belongs to the identity that started it (services/gateway/identity.py):
  another identity's GET or DELETE gets the same 404 as an unknown id. While
  it generates, the job holds one of its owner's slots (the per-client cap):
  a job is engine work like a stream, even though it holds no connection; the
  slot goes back when the generation ends (done, failed, deleted or expired),
  not when the job is forgotten, so finished jobs waiting to be read cost a
  client nothing but the TTL.
- A polling request only reads a job (and, for long polling, waits on its
  `news` event); it never owns the stream, so a poller that leaves mid-wait
  cancels nothing.
- The reaper (one task per store, started by the router's lifespan) enforces
  the TTL: a job nobody has polled for its TTL is cancelled at the engine and
  deleted, finished or not. With no connection to close, "not polled lately"
  is the only sign a polling client has gone. A TTL of 0 never expires, which
  is the classic polling leak: the engine writes for nobody and the tokens stay in
  memory forever. Each job carries its own TTL (the store's by default; a
  request may shorten it, or set 0 in the lab's broken mode), so the leak and
  its fix run side by side on one gateway.
- On shutdown the store cancels every pump.
- With several gateways a job stays in the gateway that started it (jobs are
  not in the shared resume log): its id carries that gateway's tag
  (`STREAMLAB_GATEWAY_JOB_ROUTE`), and nginx routes `/v1/jobs/<tag>.…` to that
  gateway only. If it is gone, so are its jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from services.gateway.errors import EngineError, GatewayError
from services.gateway.openai_api import FINISH_REASONS
from streamlab_protocol.engine.v1 import engine_pb2 as pb

if TYPE_CHECKING:
    from services.gateway.lease import EngineLease


def job_ttl(default_s: float, requested_s: float | None) -> float:
    """A job's TTL: the gateway's, or a shorter one the request asked for; a
    longer one is cut to the gateway's (the operator's bound), as the resume
    surface does, and the 201 says which applies. 0 means never (the leak;
    admission refuses it unless broken modes are on)."""
    if requested_s is None:
        return default_s
    if requested_s > 0 and default_s > 0:
        return min(requested_s, default_s)
    return requested_s


class JobNotFound(GatewayError):
    def __init__(self, job_id: str) -> None:
        super().__init__(404, "job_not_found",
                         f"job {job_id[:80]!r} does not exist (finished and expired, or never "
                         "started)")


@dataclass
class Job:
    id: str
    request_id: str
    ttl_s: float  # seconds after its last poll; 0: never expires (the leak)
    owner: str | None = None  # the identity that started it; None: anyone
    tokens: list[str] = field(default_factory=list)
    done: bool = False
    finish_reason: str | None = None
    error: dict[str, Any] | None = None
    last_seen: float = field(default_factory=time.monotonic)
    waiters: int = 0
    # Replaced after every change; long pollers wait on the one they saw.
    news: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    def notify(self) -> None:
        news, self.news = self.news, asyncio.Event()
        news.set()

    def view(self, since: int) -> dict[str, Any]:
        since = max(0, since)
        return {"id": self.id, "object": "job", "tokens": self.tokens[since:],
                "next": max(since, len(self.tokens)), "done": self.done,
                "finish_reason": self.finish_reason, "error": self.error}


class JobMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.held = Gauge("streamlab_gateway_jobs", "Polling jobs held in memory",
                          registry=registry)
        self.started = Counter("streamlab_gateway_jobs_started", "Polling jobs started",
                               registry=registry)
        self.expired = Counter(
            "streamlab_gateway_jobs_expired",
            "Polling jobs deleted by the TTL, by whether the engine was still generating",
            ["state"], registry=registry)


class JobStore:
    def __init__(self, ttl_s: float, metrics: JobMetrics, route: str = "") -> None:
        self.ttl_s = ttl_s
        # Several gateways: ids start with this gateway's tag, so nginx sends
        # every poll and DELETE of a job to the one gateway that holds it.
        self._id_prefix = f"{route}." if route else ""
        self._jobs: dict[str, Job] = {}
        self._metrics = metrics
        self._reaper: asyncio.Task[None] | None = None
        # Set when a job arrives whose TTL is shorter than any the reaper is
        # sleeping for, so that job is not reaped at the old, slower pace.
        self._wake = asyncio.Event()
        self._sleeping_for = float("inf")

    def __len__(self) -> int:
        return len(self._jobs)

    def start(self, lease: EngineLease, ttl_s: float | None = None) -> Job:
        """Own the open `lease` from now on (closed once the job's call is over).
        The job expires `ttl_s` after its last poll (the store's TTL when None)."""
        job = Job(id=self._id_prefix + uuid.uuid4().hex, request_id=lease.request_id,
                  owner=lease.client_key, ttl_s=self.ttl_s if ttl_s is None else ttl_s)
        job.task = asyncio.create_task(self._pump(job, lease), name=f"job-{job.id}")

        def ended(_: asyncio.Task[None]) -> None:
            # A done-callback, not the pump's `finally`: a task cancelled before
            # its first step never enters the coroutine, and the call must still
            # be cancelled (a DELETE right after the POST).
            lease.close()
            job.notify()

        job.task.add_done_callback(ended)
        self._jobs[job.id] = job
        if job.ttl_s > 0 and job.ttl_s / 4 < self._sleeping_for:
            self._wake.set()
        self._metrics.started.inc()
        self._metrics.held.set(len(self._jobs))
        return job

    def get(self, job_id: str, owner: str | None = None) -> Job:
        """The job, if it exists and `owner` (when given) started it."""
        job = self._jobs.get(job_id)
        if job is None or (owner is not None and job.owner not in (None, owner)):
            raise JobNotFound(job_id)
        job.last_seen = time.monotonic()
        return job

    async def wait(self, job: Job, since: int, timeout_s: float) -> None:
        """Return when the job has tokens past `since`, has ended, or at the timeout."""
        job.waiters += 1
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    while len(job.tokens) <= since and not job.done:
                        await job.news.wait()
        finally:
            job.waiters -= 1
            job.last_seen = time.monotonic()

    def delete(self, job_id: str, owner: str | None = None) -> None:
        job = self.get(job_id, owner)
        del self._jobs[job.id]
        self._stop(job)

    def _stop(self, job: Job) -> None:
        if job.task is not None and not job.task.done():
            job.task.cancel()  # its done-callback cancels the gRPC call
        job.notify()  # release long pollers: they see a job that will not grow
        self._metrics.held.set(len(self._jobs))

    async def _pump(self, job: Job, lease: EngineLease) -> None:
        try:
            async for event in lease.events():
                if isinstance(event, pb.TokenChunk):
                    job.tokens.append(event.text)
                    job.notify()
                elif isinstance(event, pb.Finish):  # tool calls: refused on this surface
                    job.finish_reason = FINISH_REASONS.get(event.reason, "stop")
                    job.done = True
        except EngineError as exc:
            job.error = exc.body()["error"]
            job.done = True

    # ---- TTL ------------------------------------------------------------------
    def expire(self, now: float | None = None) -> list[Job]:
        """Delete (and cancel) every job idle for longer than its TTL."""
        now = time.monotonic() if now is None else now
        idle = [job for job in self._jobs.values()
                if job.ttl_s > 0 and job.waiters == 0 and now - job.last_seen > job.ttl_s]
        for job in idle:
            del self._jobs[job.id]
            self._metrics.expired.labels("finished" if job.done else "generating").inc()
            self._stop(job)
        return idle

    def reap_interval(self) -> float:
        """A quarter of the shortest TTL in force, between 50 ms and 1 s: a job
        lives at most its TTL plus one interval past its last poll."""
        ttls = [job.ttl_s for job in self._jobs.values() if job.ttl_s > 0]
        if self.ttl_s > 0:
            ttls.append(self.ttl_s)
        return min(1.0, max(0.05, min(ttls, default=4.0) / 4))

    async def _reap_forever(self) -> None:
        while True:
            self._sleeping_for = self.reap_interval()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._sleeping_for):
                    await self._wake.wait()
            self.expire()

    def open(self) -> None:
        # Always on, even when the store's TTL is 0: a request may set its own.
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap_forever(), name="job-reaper")

    async def close(self) -> None:
        tasks = [job.task for job in self._jobs.values() if job.task is not None]
        if self._reaper is not None:
            tasks.append(self._reaper)
        for task in tasks:
            task.cancel()
        self._jobs.clear()
        await asyncio.gather(*tasks, return_exceptions=True)
