"""`POST /v1/chat/completions`: the engine's stream as OpenAI-compatible SSE.

Who owns what (see ARCHITECTURE.md):
- The request handler opens the gRPC call and waits until the engine accepts
  it, so refusals become HTTP statuses before the first byte.
- sse-starlette's EventSourceResponse then runs three tasks for the stream:
  the body (our `_events` generator), a heartbeat that sends `: ping`, and a
  listener for the client's `http.disconnect`. When the client leaves, the
  listener cancels the task group, `_events` gets CancelledError at its
  `await` on the gRPC stream, and its `finally` cancels the call: the engine
  stops at its next decode step. No per-token `is_disconnected()` polling, and
  a silent prefill notices the disconnect just as fast.

Why sse-starlette rather than FastAPI's native EventSourceResponse: FastAPI's
keep-alive interval is a private module constant (15 s), and the lab needs it
per deployment (heartbeat scenarios use sub-second intervals).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.types import Receive, Scope, Send

from services.gateway.admission import check_new_stream, open_engine_stream
from services.gateway.drain import DRAINING, Drain
from services.gateway.engine_client import EngineStream
from services.gateway.errors import BadRequest, EngineError
from services.gateway.limits import client_key
from services.gateway.metrics import GatewayMetrics
from services.gateway.openai_api import (
    ChatCompletionRequest,
    ChunkWriter,
    StreamlabOptions,
    completion,
)
from services.gateway.relay import Relay, open_relay
from services.gateway.settings import GatewaySettings

_REQUEST_ID = re.compile(r"^[\w.:-]{1,128}$")

router = APIRouter()


def request_id_for(request: Request, body: ChatCompletionRequest) -> str:
    header = request.headers.get("x-request-id")
    if header is not None and not _REQUEST_ID.match(header):
        raise BadRequest("invalid_request_id",
                         "X-Request-Id must be 1-128 characters of [A-Za-z0-9_.:-]")
    if header:
        return header
    if body.streamlab and body.streamlab.request_id:
        return body.streamlab.request_id
    return uuid.uuid4().hex


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    state = request.app.state
    settings: GatewaySettings = state.settings
    metrics: GatewayMetrics = state.metrics

    request_id = request_id_for(request, body)
    check_new_stream(state, body.messages, body.streamlab)
    stream, slot = await open_engine_stream(state, client_key(request),
                                            body.to_engine_request(request_id))
    drain: Drain = state.drain
    headers = {"X-Request-Id": stream.request_id}
    if not body.stream:
        try:
            return JSONResponse(await _collect(stream, settings.model_name), headers=headers)
        finally:
            drain.untrack(stream)
            slot.release()

    def ping() -> ServerSentEvent:
        metrics.heartbeats.inc()
        return ServerSentEvent(comment="ping")

    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    options = body.streamlab or StreamlabOptions()
    relay = open_relay(options.relay, stream, state.background_tasks)

    def release() -> None:
        relay.close()
        drain.untrack(stream)
        slot.release()

    return GuardedEventSourceResponse(
        release,
        _events(relay, ChunkWriter(stream.request_id, settings.model_name), include_usage,
                metrics, settings.drain_retry_ms,
                swallow_errors=options.engine_errors == "swallow"),
        headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        ping=options.heartbeat_or(settings.heartbeat_s),
        ping_message_factory=ping,
        sep="\n",
        # A client that accepts no bytes for this long is cut, and its
        # generation cancelled, instead of pinning an engine slot forever.
        send_timeout=settings.send_timeout_s,
    )


class GuardedEventSourceResponse(EventSourceResponse):
    """Runs `on_close` however the response ends. The body generator's own
    `finally` does not run if the client left before the body started (a
    never-started async generator has nothing to unwind), which would leak the
    engine call and the stream slot."""

    def __init__(self, on_close: Callable[[], None], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


async def _events(
    relay: Relay, writer: ChunkWriter, include_usage: bool, metrics: GatewayMetrics,
    retry_ms: int, swallow_errors: bool = False,
) -> AsyncIterator[ServerSentEvent | bytes]:
    outcome = "client_disconnect"  # what it was if we never get past a cancel
    metrics.streams_active.inc()
    try:
        async for response in relay.responses:
            kind = response.WhichOneof("event")
            if kind == "token":
                metrics.tokens.inc()
                yield writer.token_event(response.token.text)
            elif kind == "finish":
                yield ServerSentEvent(data=writer.finish(response.finish))
                if include_usage:
                    yield ServerSentEvent(data=writer.usage(response.finish))
                yield ServerSentEvent(data="[DONE]")
                outcome = "completed"
                return
    except EngineError as exc:
        # After the first byte the status is sent; the error becomes an event.
        # Unnamed, with an OpenAI-style body: OpenAI SDKs raise on it. No [DONE]
        # follows, so no client mistakes the cut for a complete answer.
        outcome = "engine_error"
        metrics.engine_errors.labels(exc.code).inc()
        if swallow_errors:
            # The broken mode (engine_errors=swallow): what a relay with a bare
            # `except: pass` around its loop sends, for every error after the
            # first byte (engine faults, deadlines, a drain's retry: alike). The
            # client cannot tell the cut from a whole answer; only the gateway's
            # metrics know.
            outcome = "engine_error_swallowed"
            yield ServerSentEvent(data="[DONE]")
        elif exc.code == DRAINING:
            # `retry:` tells an EventSource when to come back (to another gateway).
            outcome = "drained"
            yield ServerSentEvent(data=json.dumps(exc.body()), retry=retry_ms)
        else:
            yield ServerSentEvent(data=json.dumps(exc.body()))
    finally:
        relay.close()
        metrics.streams_active.dec()
        metrics.streams.labels(outcome).inc()


async def _collect(stream: EngineStream, model: str) -> dict[str, object]:
    parts: list[str] = []
    async with stream:
        async for response in stream:
            kind = response.WhichOneof("event")
            if kind == "token":
                parts.append(response.token.text)
            elif kind == "finish":
                return completion(stream.request_id, model, "".join(parts), response.finish)
    # Unreachable: EngineStream ends with a finish or raises (for the type checker).
    raise EngineError(502, "truncated", "engine stream ended without a finish event")
