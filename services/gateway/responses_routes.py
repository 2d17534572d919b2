"""OpenAI's Responses API, streamed and resumable:

    POST /v1/responses                       create; `stream: true` streams its events
    GET  /v1/responses/{id}                  the response object (background only)
    GET  /v1/responses/{id}?stream=true&starting_after=N
                                             its events numbered above N, then live
    POST /v1/responses/{id}/cancel           stop it; the response object after

Who owns the engine call (ARCHITECTURE.md): a response that is *not*
background belongs to its request, exactly as a chat completion does (the
same `EngineLease`): a client that leaves cancels it at the engine. A
background response belongs to the resume store (services/gateway/resume/),
as a `/v1/streams` generation does: its producer writes the generation's
events into the store's log whether or not anyone reads it, and any replica
that shares the store renders the log into Responses events
(services/gateway/responses_api.py) for whoever asks.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import ServerSentEvent

from services.gateway.drain import DRAINING
from services.gateway.engine_client import EngineEvent
from services.gateway.errors import EngineError, GatewayError
from services.gateway.metrics import GatewayMetrics
from services.gateway.openai_api import FINISH_REASONS, StreamlabOptions, usage_dict
from services.gateway.openai_routes import request_id_for, until_disconnected
from services.gateway.responses_api import (
    OPENING_EVENTS,
    CreateResponseRequest,
    Echo,
    Event,
    ResponseWriter,
    stream_id_of,
)
from services.gateway.resume.replay_log import BadEventId, parse_event_id
from services.gateway.resume.store import FoundStream
from services.gateway.resume.streams import Attach, StreamPolicy
from services.gateway.sse_response import event_stream
from services.gateway.state import GatewayDep, GatewayState
from streamlab_protocol.engine.v1 import engine_pb2 as pb

router = APIRouter()

MAX_ECHOES = 10_000  # request echoes remembered per gateway (bounded memory)


def _sse(event: Event) -> ServerSentEvent:
    # Named as OpenAI names them; no `id:` (clients resume with starting_after).
    return ServerSentEvent(event=event.type, data=event.json(), sep="\n")


def _echoes(request: Request) -> OrderedDict[str, Echo]:
    """What each background response's object repeats of its request
    (instructions, max_output_tokens, ...). Kept by the replica that created
    it; another replica renders the same events with these fields unset."""
    echoes: OrderedDict[str, Echo] | None = getattr(request.app.state, "response_echoes", None)
    if echoes is None:
        echoes = OrderedDict()
        request.app.state.response_echoes = echoes
    return echoes


def _remember(request: Request, stream_id: str, echo: Echo) -> None:
    echoes = _echoes(request)
    echoes[stream_id] = echo
    while len(echoes) > MAX_ECHOES:
        echoes.popitem(last=False)


@router.post("/v1/responses")
async def create_response(body: CreateResponseRequest, request: Request,
                          gateway: GatewayDep) -> Response:
    chat = body.to_chat()
    if body.background:
        return await _create_background(body, request, gateway)
    request_id = request_id_for(request, chat)
    lease = gateway.lease(chat, request_id, gateway.identity(request),
                          surface="sse" if body.stream else "json")
    writer_for = _writer_factory(gateway, body.echo())
    if not body.stream:
        async with lease as stream:
            writer = writer_for(stream.request_id)
            writer.opening()
            answer = await until_disconnected(request, _collect(lease.events(), writer),
                                              on_leave=lease.client_left)
            if answer is None:  # the client left: nobody to answer (the lease cancels)
                return Response(status_code=499)
            return JSONResponse(writer.response(), headers={"X-Request-Id": stream.request_id})

    stream = await lease.open()
    options = body.streamlab or StreamlabOptions()
    heartbeat = options.heartbeat_or(gateway.settings.heartbeat_s)
    return event_stream(
        _live(lease.events(), writer_for(stream.request_id), gateway.metrics),
        settings=gateway.settings, metrics=gateway.metrics, heartbeat_s=heartbeat,
        headers={"X-Request-Id": stream.request_id}, on_close=lease.close,
        on_disconnect=lease.client_left)


def _writer_factory(gateway: GatewayState, echo: Echo) -> Callable[[str], ResponseWriter]:
    created = int(time.time())

    def make(stream_id: str) -> ResponseWriter:
        return ResponseWriter(stream_id, gateway.settings.model_name, created, echo)
    return make


async def _collect(events: AsyncIterator[EngineEvent], writer: ResponseWriter) -> bool:
    """Run the generation into `writer`; True once it ended (None from
    `until_disconnected` means the client left first)."""
    try:
        async for event in events:
            _apply_engine_event(writer, event)
    except EngineError as exc:
        writer.failed(exc.body()["error"])
    return True


def _apply_engine_event(writer: ResponseWriter, event: object) -> list[Event]:
    if isinstance(event, pb.TokenChunk):
        return [writer.delta(event.text)]
    if isinstance(event, pb.Finish):
        return writer.completed(FINISH_REASONS.get(event.reason, "stop"),
                                usage_dict(event.usage))
    return []  # tool-call deltas: `tools` is refused on this surface


async def _live(events: AsyncIterator[EngineEvent], writer: ResponseWriter,
                metrics: GatewayMetrics) -> AsyncIterator[ServerSentEvent]:
    """A plain stream's events, counted as the chat route counts its streams."""
    outcome = "client_disconnect"  # what it was if we never get past a cancel
    metrics.streams_active.inc()
    try:
        for event in writer.opening():
            yield _sse(event)
        async for engine_event in events:
            if isinstance(engine_event, pb.TokenChunk):
                metrics.tokens.inc()
            for event in _apply_engine_event(writer, engine_event):
                yield _sse(event)
        outcome = "completed"
    except EngineError as exc:
        # After the first byte the status is sent: the failure is the last event.
        outcome = "engine_error"
        for event in writer.failed(exc.body()["error"]):
            yield _sse(event)
    finally:
        metrics.streams_active.dec()
        metrics.stream_outcomes[outcome].inc()


async def _create_background(body: CreateResponseRequest, request: Request,
                             gateway: GatewayState) -> Response:
    store, settings = gateway.streams, gateway.settings
    gateway.connect_rate.admit()
    stream_id = store.new_id()  # also the engine's request id
    # The same admission and caps as /v1/streams: the generation holds its
    # slot until it ends, and is detachable where the store is shared, so
    # another replica re-attaches to it if this one dies.
    lease = gateway.lease(body.to_chat(), stream_id, gateway.identity(request),
                          surface="resume", detachable=store.detachable_generations)
    lease.admit()
    store.ensure_capacity()
    await lease.open()
    # A background response runs to its end whether or not anyone reads it:
    # no grace or attach timer shorter than the longest a stream may run.
    hold_s = settings.max_stream_duration_s
    policy = StreamPolicy(grace_s=hold_s, ttl_s=settings.resume_ttl_s,
                          retry_ms=settings.resume_retry_ms,
                          max_events=settings.resume_log_max_events, attach_timeout_s=hold_s)
    await store.create(stream_id, lease, policy)
    echo = body.echo()
    _remember(request, stream_id, echo)
    writer = ResponseWriter(stream_id, settings.model_name, int(time.time()), echo)
    headers = {"X-Request-Id": stream_id}
    if not body.stream:  # queued behind nothing: running, no output yet
        return JSONResponse(writer.response(), headers=headers)
    found = await store.find(stream_id, gateway.identity(request))
    return _replay_response(gateway, found, writer, None, headers)


async def _found(request: Request, gateway: GatewayState, response_id: str
                 ) -> tuple[FoundStream, ResponseWriter]:
    stream_id = stream_id_of(response_id)
    if not stream_id:
        raise GatewayError(404, "response_not_found", f"no response {response_id[:80]!r}")
    found = await gateway.streams.find(stream_id, gateway.identity(request))
    echo = _echoes(request).get(stream_id, Echo())
    created = int(time.time() - found.age_s)
    return found, ResponseWriter(stream_id, gateway.settings.model_name, created, echo)


def _replay_response(gateway: GatewayState, found: FoundStream, writer: ResponseWriter,
                     after: int | None, headers: dict[str, str]) -> Response:
    return event_stream(_replay(gateway, found, writer, after),
                        settings=gateway.settings, metrics=gateway.metrics,
                        heartbeat_s=gateway.settings.heartbeat_s, headers=headers)


async def _replay(gateway: GatewayState, found: FoundStream, writer: ResponseWriter,
                  after: int | None) -> AsyncIterator[ServerSentEvent]:
    """Every event numbered above `after` (None: all), then live ones to the
    end. The log is always rendered from its start, so each event has the
    number it had the first time; only the ones above `after` are sent."""
    def wanted(events: list[Event]) -> list[ServerSentEvent]:
        return [_sse(e) for e in events if after is None or e.sequence_number > after]

    for sse in wanted(writer.opening()):
        yield sse
    record = Attach(at=round(found.age_s, 3), last_event_id=None,
                    resumed_after=max(0, (after or 0) - OPENING_EVENTS + 1), missed=None)
    async with _following(gateway, found, record) as entries:
        async for entry in entries:
            if entry.event == "gap":
                # The log no longer holds the start: the text cannot be rebuilt,
                # so say so instead of sending numbers that would not match.
                yield _sse(_gap_error(writer))
                return
            if entry.event is None or entry.data is None:
                continue  # the store's `retry:` block
            for sse in wanted(writer.apply(entry.event, json.loads(entry.data))):
                yield sse


@asynccontextmanager
async def _following(gateway: GatewayState, found: FoundStream, record: Attach
                     ) -> AsyncIterator[AsyncIterator[ServerSentEvent]]:
    """The store's log from its start, closed when left early: closing it is
    what detaches the reader (and restarts the stream's grace clock)."""
    entries = gateway.streams.follow(found, 0, record)
    try:
        yield entries
    finally:
        aclose = getattr(entries, "aclose", None)
        if aclose is not None:
            await aclose()


def _gap_error(writer: ResponseWriter) -> Event:
    return Event(-1, "error", {"type": "error", "sequence_number": -1, "code": "log_truncated",
                               "message": f"response {writer.id}: its oldest events were "
                                          "dropped from the replay log; it cannot be resumed",
                               "param": None})


async def _snapshot(gateway: GatewayState, found: FoundStream, writer: ResponseWriter
                    ) -> dict[str, object]:
    """The response object as of now: the log rendered up to its newest entry."""
    writer.opening()
    if found.last_seq == 0:
        return writer.response()
    record = Attach(at=round(found.age_s, 3), last_event_id=None, resumed_after=0, missed=None)
    async with _following(gateway, found, record) as entries:
        async for entry in entries:
            if entry.event is None or entry.data is None or entry.id is None:
                continue
            if entry.event == "gap":
                break
            writer.apply(entry.event, json.loads(entry.data))
            try:
                _, seq = parse_event_id(entry.id)
            except BadEventId:
                break
            if seq >= found.last_seq:
                break
    return writer.response()


@router.get("/v1/responses/{response_id}")
async def retrieve_response(
    response_id: str, request: Request, gateway: GatewayDep,
    stream: bool = False,
    starting_after: int | None = Query(None, ge=0),
    include_obfuscation: bool | None = None,  # never obfuscated here: nothing to turn off
) -> Response:
    store = gateway.streams
    stream_id = stream_id_of(response_id)
    if stream and gateway.drain.draining and store.local(stream_id) is None:
        # As on /v1/streams: a draining gateway takes on no stream it does not
        # run (it would take it over, then cancel it on exit). The 503 comes
        # before any byte, so nginx retries the GET on another gateway.
        raise GatewayError(503, DRAINING, "gateway is draining for a restart; retry shortly",
                           headers={"Retry-After": str(gateway.settings.retry_after_s)})
    if stream:
        # A reconnect storm: resumes first, as on /v1/streams.
        gateway.connect_rate.admit(force=starting_after is not None
                                   and gateway.settings.resume_admission == "first")
    found, writer = await _found(request, gateway, response_id)
    headers = {"X-Request-Id": found.id}
    if not stream:
        return JSONResponse(await _snapshot(gateway, found, writer), headers=headers)
    store.metrics.connections.labels("fresh" if starting_after is None else "complete").inc()
    return _replay_response(gateway, found, writer, starting_after, headers)


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(response_id: str, request: Request,
                          gateway: GatewayDep) -> JSONResponse:
    found, _ = await _found(request, gateway, response_id)
    await gateway.streams.cancel(found, "client_cancelled")
    found, writer = await _found(request, gateway, response_id)
    return JSONResponse(await _snapshot(gateway, found, writer),
                        headers={"X-Request-Id": found.id})
