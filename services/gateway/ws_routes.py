"""`/ws`: the engine's stream over a WebSocket.

The contract:

    client → server   one text message: JSON {"prompt": "...", "max_tokens": n,
                      "streamlab": {...timing, as on the SSE route}} or a plain prompt
    server → client   one text message per token: {"index": i, "text": "..."}
                      then the text "[DONE]", then a close frame 1000.
    on failure        one text message {"error": {...}} and a close frame
                      1007 (bad first message), 1011 (engine failed), 1012 (the
                      gateway is draining) or 1013 (stream limits); no [DONE].

Who owns what: the handler's `EngineLease` owns the gRPC call (the same
admission as an SSE stream: drain, stream caps, prompt size, broken modes).
It runs two tasks: `_send_tokens` and `_until_disconnect`, which reads the
socket so a client that leaves is seen at once, even during a silent prefill
when there is nothing to write that could fail. Whichever ends first cancels
the other, and leaving the lease's block cancels the call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, WebSocket
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.websockets import WebSocketDisconnect, WebSocketState

from services.gateway.drain import DRAINING
from services.gateway.engine_client import EngineEvent
from services.gateway.errors import BadRequest, EngineError, GatewayError
from services.gateway.limits import client_key
from services.gateway.metrics import GatewayMetrics
from services.gateway.openai_api import ChatCompletionRequest, Message, StreamlabOptions
from services.gateway.state import GatewayDep
from streamlab_protocol.engine.v1 import engine_pb2 as pb

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
async def ws_stream(websocket: WebSocket, gateway: GatewayDep) -> None:
    await websocket.accept()
    try:
        async with asyncio.timeout(PROMPT_TIMEOUT_S):
            text = await websocket.receive_text()
        prompt = WsPrompt.parse(text)
        chat = prompt.to_chat()
        request_id = (prompt.streamlab.request_id if prompt.streamlab else None) \
            or uuid.uuid4().hex
        lease = gateway.lease(chat, request_id, client_key(websocket))
        await lease.open()
    except WebSocketDisconnect:
        return
    except TimeoutError:
        await _fail(websocket, BadRequest("no_prompt", "no prompt within "
                                          f"{PROMPT_TIMEOUT_S:g} s"))
        return
    except GatewayError as exc:
        await _fail(websocket, exc)
        return

    with contextlib.closing(lease):  # every exit path stops the engine
        sender = asyncio.create_task(_send_tokens(websocket, lease.events(), gateway.metrics))
        listener = asyncio.create_task(_until_disconnect(websocket))
        try:
            await asyncio.wait({sender, listener}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sender, listener):
                task.cancel()
            results = await asyncio.gather(sender, listener, return_exceptions=True)
        error = results[0]
        if isinstance(error, EngineError):
            await _fail(websocket, error)
        elif sender.done() and not sender.cancelled() and error is None:
            await _close(websocket, CLOSE_NORMAL)


async def _send_tokens(websocket: WebSocket, events: AsyncIterator[EngineEvent],
                       metrics: GatewayMetrics) -> None:
    async for event in events:
        if isinstance(event, pb.TokenChunk):
            metrics.tokens.inc()
            await websocket.send_text(json.dumps(
                {"index": event.index, "text": event.text},
                ensure_ascii=False, separators=(",", ":")))
        else:
            await websocket.send_text("[DONE]")


async def _until_disconnect(websocket: WebSocket) -> None:
    # The client has nothing more to say; anything it sends is ignored.
    while (await websocket.receive())["type"] != "websocket.disconnect":
        pass


def close_code(exc: GatewayError) -> int:
    """The close code that tells a client what to do about `exc`."""
    if exc.code == DRAINING:
        return CLOSE_RESTART  # come back later, elsewhere
    if exc.status_code == 429:
        return CLOSE_TRY_LATER  # stream caps, or the engine's queue
    if exc.status_code == 400:
        return CLOSE_INVALID_PAYLOAD  # the prompt itself (the gateway's or the engine's check)
    return CLOSE_INTERNAL


async def _fail(websocket: WebSocket, exc: GatewayError) -> None:
    body: dict[str, Any] = exc.body()
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        if websocket.application_state == WebSocketState.CONNECTED:
            await websocket.send_text(json.dumps(body))
    await _close(websocket, close_code(exc))


async def _close(websocket: WebSocket, code: int) -> None:
    # The client may already be gone; a close to nobody is not an error.
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        if websocket.application_state == WebSocketState.CONNECTED:
            await websocket.close(code)
