"""`/ws`: the engine's stream over a WebSocket.

The contract (the seed's, made explicit):

    client → server   one text message: JSON {"prompt": "...", "max_tokens": n,
                      "streamlab": {...timing, as on the SSE route}} or a plain prompt
    server → client   one text message per token: {"index": i, "text": "..."}
                      then the text "[DONE]", then a close frame 1000.
    on failure        one text message {"error": {...}} and a close frame
                      1007 (bad first message), 1011 (engine failed), 1012 (the
                      gateway is draining) or 1013 (stream limits); no [DONE].

Who owns what: the handler owns the gRPC call (`finally: stream.cancel()`).
It runs two tasks: `_send_tokens` and `_until_disconnect`, which reads the
socket so a client that leaves is seen at once, even during a silent prefill
when there is nothing to write that could fail. Whichever ends first cancels
the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from typing import Any

from fastapi import APIRouter, WebSocket
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.websockets import WebSocketDisconnect, WebSocketState

from services.gateway.admission import check_new_stream
from services.gateway.drain import DRAINING, Drain
from services.gateway.engine_client import EngineClient, EngineStream
from services.gateway.errors import BadRequest, EngineError, GatewayError
from services.gateway.limits import StreamLimiter, client_key
from services.gateway.metrics import GatewayMetrics
from services.gateway.openai_api import ChatCompletionRequest, Message, StreamlabOptions

# How long a client may take to send its prompt after the upgrade.
PROMPT_TIMEOUT_S = 30.0
CLOSE_NORMAL, CLOSE_INVALID_PAYLOAD, CLOSE_INTERNAL = 1000, 1007, 1011
# RFC 6455 7.4.1: 1012 "service restart" (draining), 1013 "try again later" (limits).
CLOSE_RESTART, CLOSE_TRY_LATER = 1012, 1013

router = APIRouter()


class WsPrompt(BaseModel):
    model_config = ConfigDict(extra="ignore")
    prompt: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    streamlab: StreamlabOptions | None = None

    @classmethod
    def parse(cls, text: str) -> WsPrompt:
        """A JSON object with a prompt, or any other text as the prompt itself."""
        try:
            raw = json.loads(text)
        except ValueError:
            raw = None
        if not isinstance(raw, dict):
            return cls(prompt=text)
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise BadRequest("invalid_prompt", f"{where}: {first['msg']}") from exc

    def to_chat(self) -> ChatCompletionRequest:
        return ChatCompletionRequest(messages=[Message(role="user", content=self.prompt)],
                                     stream=True, max_tokens=self.max_tokens,
                                     streamlab=self.streamlab)


@router.websocket("/ws")
async def ws_stream(websocket: WebSocket) -> None:
    engine: EngineClient = websocket.app.state.engine
    metrics: GatewayMetrics = websocket.app.state.metrics
    drain: Drain = websocket.app.state.drain
    limiter: StreamLimiter = websocket.app.state.limiter
    await websocket.accept()
    # The same admission as an SSE stream: no new streams while draining, and
    # the per-client and overall stream caps (services/gateway/limits.py).
    if drain.draining:
        await _fail(websocket, GatewayError(503, DRAINING, "gateway is draining; retry shortly"),
                    CLOSE_RESTART)
        return
    try:
        slot = limiter.acquire(client_key(websocket))
    except GatewayError as exc:
        await _fail(websocket, exc, CLOSE_TRY_LATER)
        return
    try:
        await _serve(websocket, engine, metrics, drain)
    finally:
        slot.release()


async def _serve(websocket: WebSocket, engine: EngineClient, metrics: GatewayMetrics,
                 drain: Drain) -> None:
    try:
        async with asyncio.timeout(PROMPT_TIMEOUT_S):
            text = await websocket.receive_text()
        prompt = WsPrompt.parse(text)
        chat = prompt.to_chat()
        # The SSE route's checks on the request itself: prompt size, broken
        # modes, drain (a drain that began after the handshake).
        check_new_stream(websocket.app.state, chat.messages, chat.streamlab)
        request_id = (prompt.streamlab.request_id if prompt.streamlab else None) \
            or uuid.uuid4().hex
        stream = await engine.open(chat.to_engine_request(request_id))
    except WebSocketDisconnect:
        return
    except TimeoutError:
        await _fail(websocket, BadRequest("no_prompt", "no prompt within "
                                          f"{PROMPT_TIMEOUT_S:g} s"), CLOSE_INVALID_PAYLOAD)
        return
    except BadRequest as exc:
        await _fail(websocket, exc, CLOSE_INVALID_PAYLOAD)
        return
    except EngineError as exc:
        metrics.engine_errors.labels(exc.code).inc()
        await _fail(websocket, exc, CLOSE_INTERNAL)
        return
    except GatewayError as exc:  # draining: come back later, elsewhere
        await _fail(websocket, exc, CLOSE_RESTART)
        return

    drain.track(stream)
    with contextlib.ExitStack() as owned:
        owned.callback(drain.untrack, stream)
        owned.callback(stream.cancel)  # every exit path stops the engine
        sender = asyncio.create_task(_send_tokens(websocket, stream, metrics))
        listener = asyncio.create_task(_until_disconnect(websocket))
        try:
            await asyncio.wait({sender, listener}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sender, listener):
                task.cancel()
            results = await asyncio.gather(sender, listener, return_exceptions=True)
        error = results[0]
        if isinstance(error, EngineError):
            metrics.engine_errors.labels(error.code).inc()
            await _fail(websocket, error,
                        CLOSE_RESTART if error.code == DRAINING else CLOSE_INTERNAL)
        elif sender.done() and not sender.cancelled() and error is None:
            await _close(websocket, CLOSE_NORMAL)


async def _send_tokens(websocket: WebSocket, stream: EngineStream,
                       metrics: GatewayMetrics) -> None:
    async for response in stream:
        kind = response.WhichOneof("event")
        if kind == "token":
            metrics.tokens.inc()
            await websocket.send_text(json.dumps(
                {"index": response.token.index, "text": response.token.text},
                ensure_ascii=False, separators=(",", ":")))
        elif kind == "finish":
            await websocket.send_text("[DONE]")


async def _until_disconnect(websocket: WebSocket) -> None:
    # The client has nothing more to say; anything it sends is ignored.
    while (await websocket.receive())["type"] != "websocket.disconnect":
        pass


async def _fail(websocket: WebSocket, exc: GatewayError, code: int) -> None:
    body: dict[str, Any] = exc.body()
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        if websocket.application_state == WebSocketState.CONNECTED:
            await websocket.send_text(json.dumps(body))
    await _close(websocket, code)


async def _close(websocket: WebSocket, code: int) -> None:
    # The client may already be gone; a close to nobody is not an error.
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        if websocket.application_state == WebSocketState.CONNECTED:
            await websocket.close(code)
