"""The resume surface: `/v1/streams`, made for the browser's EventSource.

    POST   /v1/streams               create a generation → 201 {id, events_url, ...}
    GET    /v1/streams/{id}/events   the events; on reconnect, everything after
                                     Last-Event-ID (header, or ?last_event_id=),
                                     then live
    GET    /v1/streams/{id}          the stream's state (JSON)
    DELETE /v1/streams/{id}          stop it now (the "stop generating" button)
    GET    /demo                     a page that uses EventSource against the above

Each event is named (`token`, `done`, `error`, `cancelled`) and carries
`id: <stream id>:<sequence>`; every response starts with `retry:`. The
terminal events have ids too, so a client that saw the end and reconnects
anyway gets 204, which tells an EventSource to stop.

Answers to a GET of the events URL, chosen so that no client reconnects
forever (an EventSource gives up on any status but 200) and none misses
events without being told:

    200  replay then live. Response header `Last-Event-ID` (as Mercure's hub
         does) is the id this response really continues after; when it is not
         the one the client sent, events were dropped from the bounded log, and
         the first event is `event: gap` saying which.
    204  the client already has the terminal event: nothing more will come.
    400  the Last-Event-ID is malformed, of another stream, or from the future:
         resuming from a guess could duplicate or skip, so refuse.
    404  no such stream (or not this identity's); 410 this identity's stream
         existed but its TTL ran out (evicted).

Trouble that may pass (the shared store unreachable) is never an end: a 200
whose only event is `event: retry`, then the response closes, so the client
(an EventSource by itself) reconnects with the Last-Event-ID it has.

The OpenAI-compatible route is untouched: its clients never resume, and there
a disconnect still cancels at once.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import ServerSentEvent

from services.common import tracing
from services.gateway.drain import DRAINING
from services.gateway.errors import BadRequest, GatewayError
from services.gateway.openai_api import ChatCompletionRequest
from services.gateway.resume.replay_log import BadEventId, event_id, parse_event_id
from services.gateway.resume.store import STORE_UNAVAILABLE, FoundStream, retry_event
from services.gateway.resume.streams import Attach, StreamPolicy
from services.gateway.settings import GatewaySettings
from services.gateway.sse_response import event_stream
from services.gateway.state import GatewayDep, GatewayState
from services.gateway.tracing import StreamTrace

DEMO_PAGE = Path(__file__).resolve().parent / "static" / "demo.html"

router = APIRouter()


class ResumeOptions(BaseModel):
    """A creator may ask for a shorter grace, TTL or log than the gateway's,
    never a longer one (those are the operator's bounds on memory and GPU)."""

    model_config = ConfigDict(extra="forbid")
    grace_s: float | None = Field(None, ge=0)
    ttl_s: float | None = Field(None, ge=0)
    retry_ms: int | None = Field(None, ge=0, le=600_000)
    # A smaller replay log than the gateway's: how scenarios show a gap.
    max_events: int | None = Field(None, ge=1)


class CreateStreamRequest(ChatCompletionRequest):
    """The chat request's body (`stream` is ignored: this surface always streams)."""

    resume: ResumeOptions | None = None


def retry_jitter_ms(stream_id: str, window_ms: int) -> int:
    """This stream's own offset in [0, window_ms): stable for the stream (every
    response of it sends the same `retry:`), spread evenly across streams."""
    if window_ms <= 0:
        return 0
    digest = hashlib.blake2b(stream_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % window_ms


def _policy(settings: GatewaySettings, options: ResumeOptions | None,
            stream_id: str) -> StreamPolicy:
    options = options or ResumeOptions()
    grace = settings.resume_grace_s if options.grace_s is None else min(
        options.grace_s, settings.resume_grace_s)
    ttl = settings.resume_ttl_s if options.ttl_s is None else min(
        options.ttl_s, settings.resume_ttl_s)
    # The server's retry is spread per stream; a client's own is its choice.
    retry = (settings.resume_retry_ms + retry_jitter_ms(stream_id, settings.resume_retry_jitter_ms)
             if options.retry_ms is None else options.retry_ms)
    max_events = settings.resume_log_max_events if options.max_events is None else min(
        options.max_events, settings.resume_log_max_events)
    return StreamPolicy(grace_s=grace, ttl_s=ttl, retry_ms=retry, max_events=max_events)


@router.post("/v1/streams", status_code=201)
async def create_stream(body: CreateStreamRequest, request: Request,
                        gateway: GatewayDep) -> JSONResponse:
    store = gateway.streams
    gateway.connect_rate.admit()
    stream_id = store.new_id()  # also the engine's request id
    # The same admission and stream caps as the OpenAI route: a resumable
    # generation holds its slot until it ends (not until its connection does).
    # A drain waits for the generation (not for its readers), then cancels it.
    # Detachable with the shared store: if this replica dies or drains, another
    # one re-attaches to the generation (services/gateway/resume/redis_store.py).
    lease = gateway.lease(body, stream_id, gateway.identity(request), surface="resume",
                          detachable=store.detachable_generations,
                          traceparent=request.headers.get("traceparent"))
    lease.admit()
    store.ensure_capacity()
    await lease.open()
    # From here the store owns the lease, and closes it when the generation ends.
    policy = await store.create(stream_id, lease, _policy(gateway.settings, body.resume, stream_id))
    events_url = f"/v1/streams/{stream_id}/events"
    return JSONResponse(
        {"id": stream_id, "events_url": events_url, "status_url": f"/v1/streams/{stream_id}",
         "grace_s": policy.grace_s, "ttl_s": policy.ttl_s, "retry_ms": policy.retry_ms},
        status_code=201, headers={"Location": events_url, "X-Request-Id": stream_id,
                                  **lease.trace_headers()})


@router.get("/v1/streams/{stream_id}")
async def stream_status(stream_id: str, request: Request, gateway: GatewayDep) -> JSONResponse:
    found = await gateway.streams.find(stream_id, gateway.identity(request))
    return JSONResponse(await gateway.streams.status(found))


@router.delete("/v1/streams/{stream_id}")
async def cancel_stream(stream_id: str, request: Request, gateway: GatewayDep) -> JSONResponse:
    found = await gateway.streams.find(stream_id, gateway.identity(request))
    return JSONResponse(await gateway.streams.cancel(found, "client_cancelled"))


def _resume_point(found: FoundStream, raw: str | None) -> int:
    """The sequence number the client has seen up to (0: nothing yet)."""
    if not raw:
        return 0
    try:
        owner, seq = parse_event_id(raw)
    except BadEventId as exc:
        raise BadRequest("malformed_last_event_id", str(exc)) from exc
    if owner != found.id:
        raise BadRequest("foreign_last_event_id",
                         f"Last-Event-ID {raw!r} belongs to another stream")
    if seq > found.last_seq + found.ahead:
        raise BadRequest("unknown_last_event_id",
                         f"Last-Event-ID {raw!r} is past this stream's last event "
                         f"({event_id(found.id, found.last_seq)})")
    return seq


@router.get("/v1/streams/{stream_id}/events")
async def stream_events(
    stream_id: str,
    request: Request,
    gateway: GatewayDep,
    last_event_id: str | None = Query(None, max_length=200,
                                      description="for clients that cannot set headers"),
) -> Response:
    store = gateway.streams
    if gateway.drain.draining and store.local(stream_id) is None:
        # A draining gateway takes on no stream it does not run: it would take
        # a handed-off stream over (or tail one from the store) and then cancel
        # it with `gateway_shutdown` when it exits (uvicorn still serves requests
        # on open keep-alive connections while it shuts down; rolling-deploy
        # lost streams so). The 503 reaches nginx before any byte, so nginx
        # retries the GET on another gateway (`proxy_next_upstream http_503`).
        raise GatewayError(503, DRAINING, "gateway is draining for a restart; retry shortly",
                           headers={"Retry-After": str(gateway.settings.retry_after_s)})
    # The header wins: a browser's EventSource sends it on every reconnect,
    # while a query parameter baked into the URL would stay at its first value.
    raw = request.headers.get("last-event-id") or last_event_id
    tracer = tracing.tracer()
    if tracer is not None:
        # A take-over of a lost replica's stream during find() re-attaches in
        # this reader's trace (services/gateway/lease.py reads it).
        tracing.incoming_traceparent.set(request.headers.get("traceparent"))
    # A reconnect storm: resumes first (they continue admitted generations),
    # unless the broken "same" admission refuses them like new streams.
    gateway.connect_rate.admit(force=bool(raw) and gateway.settings.resume_admission == "first")
    try:
        found = await store.find(stream_id, gateway.identity(request))
    except GatewayError as exc:
        if exc.code != STORE_UNAVAILABLE or gateway.settings.resume_transient != "retry":
            raise  # the broken case: a 503, which an EventSource takes as final
        return _come_back(stream_id, raw, gateway, exc)
    after = _resume_point(found, raw)
    if found.ended and after == found.last_seq:
        return Response(status_code=204)  # it has the end; tell it to stop

    missed = found.missed(after)
    resumes_after = missed[1] if missed else after
    replay = "fresh" if not raw else "partial" if missed else "complete"
    store.metrics.connections.labels(replay).inc()
    record = Attach(at=round(found.age_s, 3), last_event_id=raw,
                    resumed_after=after, missed=missed)
    # In the stream's record before the response opens: a client may ask for
    # the status (on any replica) the moment it does.
    await store.attached(found, record)
    headers = {"Last-Event-ID": event_id(found.id, resumes_after), "X-Request-Id": found.id}
    reader = None
    if tracer is not None:
        # The reader's own span: which replica served it, from where it resumed.
        reader = StreamTrace(tracer, "resume.reader", request.headers.get("traceparent"),
                             found.id, "reader", gateway.settings.engine_wire)
        reader.span.set_attributes({"streamlab.resume.replay": replay,
                                    "streamlab.resume.after_seq": after,
                                    "streamlab.gateway_port": gateway.settings.port})
        headers.update(reader.headers())
    # A reader that accepts no bytes for the send timeout is cut: its follower
    # detaches, so the grace clock starts, instead of holding on forever.
    return event_stream(
        store.follow(found, after, record), settings=gateway.settings, metrics=gateway.metrics,
        heartbeat_s=gateway.settings.heartbeat_s, headers=headers,
        on_close=(lambda: reader.end("closed")) if reader is not None else lambda: None,
        on_ping=reader.heartbeat if reader is not None else None)


async def _retry_only(event: ServerSentEvent) -> AsyncIterator[ServerSentEvent]:
    yield event


def _come_back(stream_id: str, raw: str | None, gateway: GatewayState,
               exc: GatewayError) -> Response:
    """The shared store cannot say where the stream is now, and that may pass
    within seconds: a 200 whose only event is `retry` (not a 503, on which an
    EventSource closes for good), so the client reconnects after `retry:` with
    the Last-Event-ID it has, and resumes exactly where it was once the store
    answers. The stream's own `retry:` (it may have asked for a shorter one)
    is in the store; this one is the gateway's, with the stream's jitter."""
    settings = gateway.settings
    # The reader came: noted for the owner, who would otherwise cancel a
    # stream nobody attached to (`never_attached`) while its reader retries.
    gateway.streams.attempted(stream_id, Attach(at=-1.0, last_event_id=raw,
                                                resumed_after=-1, missed=None))
    retry = settings.resume_retry_ms + retry_jitter_ms(stream_id, settings.resume_retry_jitter_ms)
    headers = {"X-Request-Id": stream_id[:80]}
    if raw:
        headers["Last-Event-ID"] = raw[:200]
    return event_stream(_retry_only(retry_event(exc.code, exc.message, retry)),
                        settings=settings, metrics=gateway.metrics,
                        heartbeat_s=settings.heartbeat_s, headers=headers)


@router.get("/demo", include_in_schema=False)
async def demo_page() -> HTMLResponse:
    return HTMLResponse(DEMO_PAGE.read_text(encoding="utf-8"),
                        headers={"Cache-Control": "no-cache"})
