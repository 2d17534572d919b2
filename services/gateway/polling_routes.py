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

A job belongs to the identity that started it (services/gateway/identity.py):
another identity's GET or DELETE is a 404. While it generates it holds one of
its owner's slots, as a stream does (services/gateway/jobs.py says why).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from services.gateway.jobs import job_ttl
from services.gateway.openai_api import ChatCompletionRequest
from services.gateway.openai_routes import request_id_for
from services.gateway.state import GatewayDep

router = APIRouter()


@router.post("/v1/jobs", status_code=201)
async def start_job(body: ChatCompletionRequest, request: Request,
                    gateway: GatewayDep) -> JSONResponse:
    # The SSE route's admission and caps: the job holds a slot while it generates.
    lease = gateway.lease(body, request_id_for(request, body), gateway.identity(request),
                          surface="polling")
    ttl_s = job_ttl(gateway.settings.job_ttl_s,
                    body.streamlab.job_ttl_s if body.streamlab else None)
    await lease.open()
    # From here the job store owns the lease; a draining gateway cancels what is
    # still generating, and pollers then read the job's `error` (server_draining).
    job = gateway.jobs.start(lease, ttl_s=ttl_s)
    return JSONResponse({"id": job.id, "object": "job", "request_id": job.request_id,
                         "ttl_s": job.ttl_s},
                        status_code=201, headers={"X-Request-Id": job.request_id})


@router.get("/v1/jobs/{job_id}")
async def poll_job(
    job_id: str,
    request: Request,
    gateway: GatewayDep,
    since: Annotated[int, Query(ge=0)] = 0,
    wait_s: Annotated[float, Query(ge=0)] = 0.0,
) -> dict[str, Any]:
    job = gateway.jobs.get(job_id, gateway.identity(request))
    if wait_s > 0:
        await gateway.jobs.wait(job, since, min(wait_s, gateway.settings.long_poll_max_s))
    return job.view(since)


@router.delete("/v1/jobs/{job_id}", status_code=204)
async def cancel_job(job_id: str, request: Request, gateway: GatewayDep) -> Response:
    gateway.jobs.delete(job_id, gateway.identity(request))
    return Response(status_code=204)
