"""`/ws`: the engine's stream over a WebSocket.

The contract:

    client → server   one text message: JSON {"prompt": "...", "max_tokens": n,
                      "streamlab": {...timing, as on the SSE route}} or a plain prompt
                      (text that starts with `{` must be that JSON object)
    server → client   one text message per token: {"index": i, "text": "..."}
                      then the text "[DONE]", then a close frame 1000.
    on failure        one text message {"error": {...}} (OpenAI's shape) and a
                      close frame whose reason is JSON {"code", "type"}; no [DONE]:
                        1003  a binary first message (the prompt is text)
                        1007  a bad prompt: empty, not JSON where it must be,
                              a field of the wrong type or range, a lone
                              surrogate, a limit the engine names
                        1008  refused by policy: a broken mode this gateway
                              refuses (auth refuses the handshake itself,
                              services/gateway/auth.py, and so does an
                              Origin not allowed: before the upgrade, so
                              the client sees an HTTP 403)
                        1009  a prompt over the gateway's size limits
                        1011  the engine failed
                        1012  the gateway is draining
                        1013  the caps (the client's, the gateway's or the engine's)

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
from services.gateway.errors import (
    BadRequest,
    EngineError,
    GatewayError,
    error_json,
    validation_problem,
)
from services.gateway.metrics import GatewayMetrics
from services.gateway.openai_api import (
    UINT32_MAX,
    ChatCompletionRequest,
    Message,
    StreamlabOptions,
    WireText,
)
from services.gateway.settings import GatewaySettings
from services.gateway.state import GatewayDep
from streamlab_protocol.engine.v1 import engine_pb2 as pb

# How long a client may take to send its prompt after the upgrade.
PROMPT_TIMEOUT_S = 30.0
CLOSE_NORMAL, CLOSE_INVALID_PAYLOAD, CLOSE_INTERNAL = 1000, 1007, 1011
# RFC 6455 7.4.1: 1003 "cannot accept this data type", 1008 "policy violation",
# 1009 "message too big".
CLOSE_UNSUPPORTED_DATA, CLOSE_POLICY, CLOSE_TOO_BIG = 1003, 1008, 1009
# A close frame's reason is at most 123 bytes (RFC 6455 5.5: 125 less the code).
MAX_CLOSE_REASON = 123
# RFC 6455 7.4.1: 1012 "service restart" (draining), 1013 "try again later" (limits).
CLOSE_RESTART, CLOSE_TRY_LATER = 1012, 1013

router = APIRouter()


class WsPrompt(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    prompt: WireText = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=UINT32_MAX)
    streamlab: StreamlabOptions | None = None

    @classmethod
    def parse(cls, text: str) -> WsPrompt:
        """A JSON object with a prompt, or any other text as the prompt itself;
        text that starts with `{` must be the object."""
        try:
            if not text.lstrip().startswith("{"):
                return cls(prompt=text)
            try:
                raw = json.loads(text)
            except (ValueError, RecursionError) as exc:  # RecursionError: "{" * 100_000
                raise BadRequest("invalid_json", "the message starts with '{' but is not a "
                                 "JSON object") from exc
            if not isinstance(raw, dict):
                raise BadRequest("invalid_json", "the message starts with '{' but is not a "
                                 "JSON object")
            return cls.model_validate(raw)
        except ValidationError as exc:
            param, message = validation_problem(exc.errors())
            raise BadRequest("invalid_prompt", message, param=param) from exc

    def to_chat(self) -> ChatCompletionRequest:
        return ChatCompletionRequest(messages=[Message(role="user", content=self.prompt)],
                                     stream=True, max_tokens=self.max_tokens,
                                     streamlab=self.streamlab)


async def _receive_prompt(websocket: WebSocket, max_bytes: int) -> WsPrompt | None:
    """The first message as a prompt; None when the client left first."""
    message = await websocket.receive()
    if message["type"] == "websocket.disconnect":
        return None
    text = message.get("text")
    if text is None:
        raise GatewayError(400, "unsupported_data", "the prompt must be a text message, "
                           "not binary")
    if len(text) > max_bytes or len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise GatewayError(413, "message_too_big",
                           f"the prompt message exceeds {max_bytes} bytes")
    return WsPrompt.parse(text)


def allowed_origins(settings: GatewaySettings) -> frozenset[str]:
    """The origins whose pages may open /ws: the lab console's and the configured ones."""
    origins = {origin.strip().rstrip("/").lower() for origin in settings.ws_allowed_origins}
    if settings.console_port is not None:
        origins |= {f"http://{host}:{settings.console_port}"
                    for host in ("127.0.0.1", "localhost", "[::1]")}
    return frozenset(origins)


def origin_allowed(origin: str | None, allowed: frozenset[str]) -> bool:
    """No Origin: not a browser (a browser always sends one on a WebSocket
    handshake), so nothing cross-site about it. `null` (a sandboxed frame, a
    file: page) and every origin not listed are refused; compared exactly,
    so `http://127.0.0.1:8475.evil.example` is not the console."""
    return origin is None or origin.lower() in allowed


@router.websocket("/ws")
async def ws_stream(websocket: WebSocket, gateway: GatewayDep) -> None:
    # A page on any site can open a WebSocket here: the browser checks
    # nothing (no CORS for WebSockets) and reports the page's Origin, so the
    # check is the server's, before the handshake completes.
    if not origin_allowed(websocket.headers.get("origin"),
                          allowed_origins(gateway.settings)):
        gateway.metrics.ws_origin_refused.inc()
        await websocket.close(CLOSE_POLICY, json.dumps(
            {"code": "origin_not_allowed", "type": "invalid_request_error"},
            separators=(",", ":")))
        return
    await websocket.accept()
    try:
        async with asyncio.timeout(PROMPT_TIMEOUT_S):
            prompt = await _receive_prompt(websocket, gateway.settings.max_body_bytes)
        if prompt is None:
            return
        chat = prompt.to_chat()
        request_id = (prompt.streamlab.request_id if prompt.streamlab else None) \
            or uuid.uuid4().hex
        lease = gateway.lease(chat, request_id, gateway.identity(websocket),
                              surface="websocket")
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
        return CLOSE_TRY_LATER  # caps, or the engine's queue
    if exc.code == "unsupported_data":
        return CLOSE_UNSUPPORTED_DATA
    if exc.status_code == 413 or exc.code == "prompt_too_long":
        return CLOSE_TOO_BIG
    if exc.status_code in (401, 403, 404) or exc.code == "broken_mode_disabled":
        return CLOSE_POLICY
    if 400 <= exc.status_code < 500:
        return CLOSE_INVALID_PAYLOAD  # the prompt itself (the gateway's or the engine's check)
    return CLOSE_INTERNAL


def close_reason(exc: GatewayError) -> str:
    """JSON that fits a close frame: the code and OpenAI's type (the message
    itself went in the text message before the close)."""
    body = exc.body()["error"]
    reason = json.dumps({"code": body["code"], "type": body["type"]}, separators=(",", ":"))
    if len(reason.encode()) > MAX_CLOSE_REASON:
        reason = json.dumps({"code": str(body["code"])[:80]}, separators=(",", ":"))
    return reason


async def _fail(websocket: WebSocket, exc: GatewayError) -> None:
    body: dict[str, Any] = exc.body()
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        if websocket.application_state == WebSocketState.CONNECTED:
            await websocket.send_text(error_json(body).decode("ascii"))
    await _close(websocket, close_code(exc), close_reason(exc))


async def _close(websocket: WebSocket, code: int, reason: str | None = None) -> None:
    # The client may already be gone; a close to nobody is not an error.
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        if websocket.application_state == WebSocketState.CONNECTED:
            await websocket.close(code, reason)
