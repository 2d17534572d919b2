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
    404  no such stream; 410 it existed but its TTL ran out (evicted).

The OpenAI-compatible route is untouched: its clients never resume, and there
a disconnect still cancels at once.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import ServerSentEvent

from services.gateway.errors import BadRequest, GatewayError
from services.gateway.openai_api import ChatCompletionRequest
from services.gateway.replay_log import BadEventId, event_id, is_stream_id, parse_event_id
from services.gateway.settings import GatewaySettings
from services.gateway.sse_response import event_stream
from services.gateway.state import GatewayDep
from services.gateway.streams import Attach, ResumableStream, StreamPolicy, StreamRegistry

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


def _policy(settings: GatewaySettings, options: ResumeOptions | None) -> StreamPolicy:
    options = options or ResumeOptions()
    grace = settings.resume_grace_s if options.grace_s is None else min(
        options.grace_s, settings.resume_grace_s)
    ttl = settings.resume_ttl_s if options.ttl_s is None else min(
        options.ttl_s, settings.resume_ttl_s)
    retry = settings.resume_retry_ms if options.retry_ms is None else options.retry_ms
    max_events = settings.resume_log_max_events if options.max_events is None else min(
        options.max_events, settings.resume_log_max_events)
    return StreamPolicy(grace_s=grace, ttl_s=ttl, retry_ms=retry, max_events=max_events)


@router.post("/v1/streams", status_code=201)
async def create_stream(body: CreateStreamRequest, request: Request,
                        gateway: GatewayDep) -> JSONResponse:
    registry = gateway.streams
    stream_id = registry.new_id()  # also the engine's request id
    # The same admission and stream caps as the OpenAI route: a resumable
    # generation holds its slot until it ends (not until its connection does).
    # A drain waits for the generation (not for its readers), then cancels it.
    lease = gateway.lease(body, stream_id, gateway.identity(request))
    lease.admit()
    registry.ensure_capacity()
    await lease.open()
    # From here the stream owns the lease, and closes it when the generation ends.
    stream = registry.create(stream_id, lease, _policy(gateway.settings, body.resume))
    events_url = f"/v1/streams/{stream_id}/events"
    return JSONResponse(
        {"id": stream_id, "events_url": events_url, "status_url": f"/v1/streams/{stream_id}",
         "grace_s": stream.policy.grace_s, "ttl_s": stream.policy.ttl_s,
         "retry_ms": stream.policy.retry_ms},
        status_code=201, headers={"Location": events_url, "X-Request-Id": stream_id})


def _find(registry: StreamRegistry, stream_id: str, owner: str) -> ResumableStream:
    """The stream, if `owner` created it: another identity learns nothing, not
    even that the id exists (404, never 403 or 410)."""
    stream = registry.get(stream_id) if is_stream_id(stream_id) else None
    if stream is not None and stream.owner in (None, owner):
        return stream
    if stream is None and registry.was_evicted(stream_id):
        raise GatewayError(410, "stream_expired",
                           f"stream {stream_id} ended and its replay TTL ran out")
    raise GatewayError(404, "unknown_stream", f"no stream {stream_id[:80]!r}")


@router.get("/v1/streams/{stream_id}")
async def stream_status(stream_id: str, request: Request, gateway: GatewayDep) -> JSONResponse:
    return JSONResponse(_find(gateway.streams, stream_id, gateway.identity(request)).snapshot())


@router.delete("/v1/streams/{stream_id}")
async def cancel_stream(stream_id: str, request: Request, gateway: GatewayDep) -> JSONResponse:
    stream = _find(gateway.streams, stream_id, gateway.identity(request))
    stream.cancel("client_cancelled")
    return JSONResponse(stream.snapshot())


def _resume_point(stream: ResumableStream, raw: str | None) -> int:
    """The sequence number the client has seen up to (0: nothing yet)."""
    if not raw:
        return 0
    try:
        owner, seq = parse_event_id(raw)
    except BadEventId as exc:
        raise BadRequest("malformed_last_event_id", str(exc)) from exc
    if owner != stream.id:
        raise BadRequest("foreign_last_event_id",
                         f"Last-Event-ID {raw!r} belongs to another stream")
    if seq > stream.log.last_seq:
        raise BadRequest("unknown_last_event_id",
                         f"Last-Event-ID {raw!r} is past this stream's last event "
                         f"({event_id(stream.id, stream.log.last_seq)})")
    return seq


@router.get("/v1/streams/{stream_id}/events")
async def stream_events(
    stream_id: str,
    request: Request,
    gateway: GatewayDep,
    last_event_id: str | None = Query(None, max_length=200,
                                      description="for clients that cannot set headers"),
) -> Response:
    registry = gateway.streams
    stream = _find(registry, stream_id, gateway.identity(request))
    # The header wins: a browser's EventSource sends it on every reconnect,
    # while a query parameter baked into the URL would stay at its first value.
    raw = request.headers.get("last-event-id") or last_event_id
    after = _resume_point(stream, raw)
    if stream.ended and after == stream.log.last_seq:
        return Response(status_code=204)  # it has the end; tell it to stop

    missed = stream.log.after(after).missed
    resumes_after = missed[1] if missed else after
    replay = "fresh" if not raw else "partial" if missed else "complete"
    registry.metrics.connections.labels(replay).inc()
    record = Attach(at=round(time.monotonic() - stream.created, 3), last_event_id=raw,
                    resumed_after=after, missed=missed)
    # A reader that accepts no bytes for the send timeout is cut: its follower
    # detaches, so the grace clock starts, instead of holding on forever.
    return event_stream(
        _follow(stream, after, record), settings=gateway.settings, metrics=gateway.metrics,
        heartbeat_s=gateway.settings.heartbeat_s,
        headers={"Last-Event-ID": event_id(stream.id, resumes_after), "X-Request-Id": stream.id})


async def _follow(stream: ResumableStream, after: int, record: Attach
                  ) -> AsyncIterator[ServerSentEvent]:
    # Attach inside the generator, so attach and detach pair up even when the
    # client is gone before the body starts (then neither runs).
    stream.attach(record)
    try:
        # Alone in its block: sets the reconnect delay before any event arrives.
        yield ServerSentEvent(retry=stream.policy.retry_ms, sep="\n")
        cursor = after
        while True:
            changed = stream.changed
            replay = stream.log.after(cursor)
            if replay.missed is not None:
                first, last = replay.missed
                yield ServerSentEvent(event="gap", sep="\n", data=json.dumps({
                    "missed_from": event_id(stream.id, first),
                    "missed_to": event_id(stream.id, last),
                    "missed_events": last - first + 1}))
                cursor = last
            for entry in replay.entries:
                yield ServerSentEvent(id=event_id(stream.id, entry.seq), event=entry.kind,
                                      data=entry.data, sep="\n")
                cursor = entry.seq
            if stream.ended and cursor >= stream.log.last_seq:
                return  # the terminal event is sent; the response ends
            if not replay.entries and replay.missed is None:
                await changed.wait()
    finally:
        stream.detach()


@router.get("/demo", include_in_schema=False)
async def demo_page() -> HTMLResponse:
    return HTMLResponse(DEMO_PAGE.read_text(encoding="utf-8"),
                        headers={"Cache-Control": "no-cache"})
