"""`POST /v1/chat/completions`: the engine's stream as OpenAI-compatible SSE,
or, with `stream: false`, one JSON completion.

Who owns what (see ARCHITECTURE.md): the request's `EngineLease` owns the
engine call. It is opened in the handler, which waits until the engine accepts
the call, so refusals become HTTP statuses before the first byte. Streaming,
the response's close hook closes the lease (services/gateway/sse_response.py:
a client that leaves cancels the body, then the call). Not streaming, the
handler collects the answer while it listens for the client leaving, as vLLM's
`with_cancellation` does: a client that leaves cancels the collection, and
the lease cancels the call.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import ServerSentEvent

from services.gateway.drain import DRAINING
from services.gateway.engine_client import EngineEvent
from services.gateway.errors import BadRequest, EngineError
from services.gateway.lease import EngineLease
from services.gateway.metrics import GatewayMetrics
from services.gateway.openai_api import (
    ChatCompletionRequest,
    ChunkWriter,
    StreamlabOptions,
    ToolCallAssembler,
    completion,
)
from services.gateway.sse_response import event_stream, last_events
from services.gateway.state import GatewayDep, GatewayState
from streamlab_protocol.engine.v1 import engine_pb2 as pb

_REQUEST_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")  # ASCII: it becomes gRPC metadata

router = APIRouter()
T = TypeVar("T")


def request_id_for(request: Request, body: ChatCompletionRequest) -> str:
    header = request.headers.get("x-request-id")
    if header is not None and not _REQUEST_ID.fullmatch(header):
        raise BadRequest("invalid_request_id",
                         "X-Request-Id must be 1-128 characters of [A-Za-z0-9_.:-]",
                         param="X-Request-Id")
    if header:
        return header
    if body.streamlab and body.streamlab.request_id:
        return body.streamlab.request_id
    return uuid.uuid4().hex


CHAT_PATH = "/v1/chat/completions"


@router.post(CHAT_PATH)
async def chat_completions(body: ChatCompletionRequest, request: Request,
                           gateway: GatewayDep) -> Response:
    # The FastAPI route: what the app's fast path (services/gateway/app.py,
    # ChatFastPath) hands back (a body it cannot take as it is), and the
    # route's place in the API's description and its 405 for other methods.
    return await chat_response(body, request, gateway)


async def chat_response(body: ChatCompletionRequest, request: Request,
                        gateway: GatewayState) -> Response:
    """The answer to a valid chat request, or a GatewayError before the first byte."""
    settings = gateway.settings
    lease = gateway.lease(body, request_id_for(request, body), gateway.identity(request),
                          surface="sse" if body.stream else "json",
                          traceparent=request.headers.get("traceparent"))
    if not body.stream:
        async with lease as stream:
            headers = {"X-Request-Id": stream.request_id, **lease.trace_headers()}
            answer = await until_disconnected(request, _collect(lease, settings.model_name),
                                              on_leave=lease.client_left)
            if answer is None:  # the client left: nobody to answer (the lease cancels)
                return Response(status_code=499)
            return JSONResponse(answer, headers=headers)

    stream = await lease.open()
    options = body.streamlab or StreamlabOptions()
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return event_stream(
        _events(lease.events(),
                ChunkWriter(stream.request_id, settings.model_name, include_usage),
                include_usage, gateway.metrics, settings.drain_retry_ms,
                ready=lambda: stream.pending),
        settings=settings, metrics=gateway.metrics,
        heartbeat_s=options.heartbeat_or(settings.heartbeat_s),
        headers={"X-Request-Id": stream.request_id, **lease.trace_headers()},
        on_close=lease.close, on_disconnect=lease.client_left,
        on_ping=lease.trace.heartbeat if lease.trace is not None else None)


async def _events(events: AsyncIterator[EngineEvent], writer: ChunkWriter, include_usage: bool,
                  metrics: GatewayMetrics, retry_ms: int, ready: Callable[[], int] = lambda: 0
                  ) -> AsyncIterator[ServerSentEvent | bytes]:
    """The stream's SSE events, one token per event. Tokens that arrived together
    (`ready()`: how many more events the engine stream holds in memory now)
    go out in one socket write, and with the finish when it came with them
    (a stream's last step): its last chunk, the body's end included. A token
    is never held back to wait for another."""
    outcome = "client_disconnect"  # what it was if we never get past a cancel
    metrics.streams_active.inc()
    batch: list[bytes] = []
    try:
        async for event in events:
            if isinstance(event, pb.TokenChunk):
                metrics.tokens.inc()
                batch.append(writer.token_event(event.text))
                if ready() == 0:
                    yield batch[0] if len(batch) == 1 else b"".join(batch)
                    batch = []
            elif isinstance(event, pb.ToolCallDelta):
                metrics.tokens.inc()
                if batch:
                    yield b"".join(batch)
                    batch = []
                yield ServerSentEvent(data=writer.tool_call(event))
            else:
                # The tokens that came with it, the finish, usage and [DONE]
                # leave with the body's end in one write.
                tail = [ServerSentEvent(data=writer.finish(event))]
                if include_usage:
                    tail.append(ServerSentEvent(data=writer.usage(event)))
                tail.append(ServerSentEvent(data="[DONE]"))
                yield last_events(*tail, before=batch)
                batch = []
                outcome = "completed"
    except EngineError as exc:
        # After the first byte the status is sent; the error becomes an event.
        # Unnamed, with an OpenAI-style body: OpenAI SDKs raise on it. No [DONE]
        # follows, so no client mistakes the cut for a complete answer.
        outcome = "engine_error"
        if batch:
            yield b"".join(batch)
        if exc.code == DRAINING:
            # `retry:` tells an EventSource when to come back (to another gateway).
            outcome = "drained"
            yield ServerSentEvent(data=json.dumps(exc.body()), retry=retry_ms)
        else:
            yield ServerSentEvent(data=json.dumps(exc.body()))
    finally:
        metrics.streams_active.dec()
        metrics.stream_outcomes[outcome].inc()


async def until_disconnected(request: Request, work: Coroutine[Any, Any, T],
                             on_leave: Callable[[], None] = lambda: None) -> T | None:
    """Run `work` until it ends or the client leaves (then `on_leave()` and
    cancel it: None). The body is already read, so the next ASGI message is
    the disconnect."""
    async def client_left() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        on_leave()

    task = asyncio.ensure_future(work)
    listener = asyncio.ensure_future(client_left())
    try:
        await asyncio.wait({task, listener}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, listener):
            pending.cancel()
        await asyncio.gather(task, listener, return_exceptions=True)
    if task.cancelled():
        return None
    return task.result()


async def _collect(lease: EngineLease, model: str) -> dict[str, object]:
    parts: list[str] = []
    calls = ToolCallAssembler()
    async for event in lease.events():
        if isinstance(event, pb.TokenChunk):
            parts.append(event.text)
        elif isinstance(event, pb.ToolCallDelta):
            calls.add(event)
        else:
            return completion(lease.request_id, model, "".join(parts), event, calls.calls())
    # Unreachable: a lease's events end with a finish or raise (for the type checker).
    raise EngineError(502, "truncated", "engine stream ended without a finish event")
