"""`GET /ws`: the smallest WebSocket chat, for the websocket-upgrade scenario.

One text message in (a prompt, or the JSON body of a chat completion request
with its `streamlab` timing), then one text message per token, then "[DONE]",
then a normal close. Errors are one JSON message `{"error": {...}}` and a close
with code 1011 (engine) or 1008 (bad request). Deliberately minimal: the
transports work (polling, long polling, a full WebSocket protocol) lives apart
from this module.

Who cancels whom: the engine call is owned by this handler (`async with`); a
client that leaves makes the next send raise, which leaves the block and
cancels the call. Unlike SSE there is no disconnect listener, so a client that
leaves during a silent prefill is noticed at the first token.
"""

from __future__ import annotations

import json
import uuid

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from services.gateway.engine_client import EngineClient
from services.gateway.errors import EngineError
from services.gateway.openai_api import ChatCompletionRequest, Message

router = APIRouter()

CLOSE_POLICY_VIOLATION = 1008
CLOSE_INTERNAL_ERROR = 1011


def parse_prompt(text: str) -> ChatCompletionRequest:
    """A JSON object is a chat completion request; anything else is the prompt itself."""
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return ChatCompletionRequest.model_validate(parsed)
    return ChatCompletionRequest(messages=[Message(role="user", content=text)])


@router.websocket("/ws")
async def ws_chat(websocket: WebSocket) -> None:
    engine: EngineClient = websocket.app.state.engine
    await websocket.accept()
    try:
        try:
            body = parse_prompt(await websocket.receive_text())
        except ValidationError as exc:
            error = {"message": str(exc.errors()[0]["msg"]), "code": "invalid_request"}
            await websocket.send_text(json.dumps({"error": error}))
            await websocket.close(CLOSE_POLICY_VIOLATION)
            return
        request_id = (body.streamlab.request_id if body.streamlab else None) or uuid.uuid4().hex
        try:
            async with await engine.open(body.to_engine_request(request_id)) as stream:
                async for response in stream:
                    kind = response.WhichOneof("event")
                    if kind == "token":
                        await websocket.send_text(response.token.text)
                    elif kind == "error":
                        raise EngineError(502, response.error.code,
                                          f"engine: {response.error.message}")
                    elif kind == "finish":
                        await websocket.send_text("[DONE]")
                        break
        except EngineError as exc:
            await websocket.send_text(json.dumps(exc.body()))
            await websocket.close(CLOSE_INTERNAL_ERROR)
            return
        await websocket.close()
    except WebSocketDisconnect:
        return  # the client left; leaving the `async with` cancelled the engine call
