"""Short and long polling over a job (see services/gateway/jobs.py).

    POST   /v1/jobs                    body as /v1/chat/completions → 201 {"id": ...,
                                       "ttl_s": ...}; "streamlab": {"job_ttl_s": S}
                                       shortens this job's TTL (never lengthens
                                       it: the 201's ttl_s is the one in force)
    GET    /v1/jobs/{id}?since=N       tokens from index N now (short polling)
    GET    /v1/jobs/{id}?since=N&wait_s=S
                                       hold until there is a token past N, the job
                                       ends, or S seconds pass (long polling)
    DELETE /v1/jobs/{id}               cancel at the engine and forget

Every GET answers `{"tokens": [...], "next": N', "done": bool,
"finish_reason": ..., "error": ...}`; the client asks again with
`since=next`. The engine call is opened before the 201, so a refused or
unreachable engine is an HTTP status on the POST, as on the SSE route.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response

from services.gateway.admission import check_new_stream
from services.gateway.drain import Drain
from services.gateway.engine_client import EngineClient
from services.gateway.errors import EngineError
from services.gateway.jobs import JobMetrics, JobStore, job_ttl
from services.gateway.metrics import GatewayMetrics
from services.gateway.openai_api import ChatCompletionRequest
from services.gateway.openai_routes import request_id_for
from services.gateway.settings import GatewaySettings


@asynccontextmanager
async def _jobs_lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: GatewaySettings = app.state.settings
    metrics: GatewayMetrics = app.state.metrics
    store = JobStore(settings.job_ttl_s, JobMetrics(metrics.registry))
    app.state.jobs = store
    store.open()
    try:
        yield
    finally:
        await store.close()


# The router brings its own lifespan (nested inside the app's, so the engine
# client exists first): including it is the one line app.py needs.
router = APIRouter(lifespan=_jobs_lifespan)


@router.post("/v1/jobs", status_code=201)
async def start_job(body: ChatCompletionRequest, request: Request) -> JSONResponse:
    engine: EngineClient = request.app.state.engine
    metrics: GatewayMetrics = request.app.state.metrics
    settings: GatewaySettings = request.app.state.settings
    drain: Drain = request.app.state.drain
    request_id = request_id_for(request, body)
    # The SSE route's checks, but no stream slot: a job is not an open connection.
    check_new_stream(request.app.state, body.messages, body.streamlab)
    ttl_s = job_ttl(settings.job_ttl_s, body.streamlab.job_ttl_s if body.streamlab else None)
    try:
        stream = await engine.open(body.to_engine_request(request_id))
    except EngineError as exc:
        metrics.engine_errors.labels(exc.code).inc()
        raise
    # A draining gateway cancels what is still generating; pollers then read
    # the job's `error` (server_draining) instead of a job that never ends.
    drain.track(stream)
    job = request.app.state.jobs.start(stream, on_end=lambda: drain.untrack(stream),
                                       ttl_s=ttl_s)
    return JSONResponse({"id": job.id, "object": "job", "request_id": job.request_id,
                         "ttl_s": job.ttl_s},
                        status_code=201, headers={"X-Request-Id": job.request_id})


@router.get("/v1/jobs/{job_id}")
async def poll_job(
    job_id: str,
    request: Request,
    since: Annotated[int, Query(ge=0)] = 0,
    wait_s: Annotated[float, Query(ge=0)] = 0.0,
) -> dict[str, Any]:
    store: JobStore = request.app.state.jobs
    settings: GatewaySettings = request.app.state.settings
    job = store.get(job_id)
    if wait_s > 0:
        await store.wait(job, since, min(wait_s, settings.long_poll_max_s))
    return job.view(since)


@router.delete("/v1/jobs/{job_id}", status_code=204)
async def cancel_job(job_id: str, request: Request) -> Response:
    request.app.state.jobs.delete(job_id)
    return Response(status_code=204)
