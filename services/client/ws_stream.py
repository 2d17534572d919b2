"""A measuring client for `/ws` (services/gateway/ws_routes.py): one prompt out,
one message per token in, until "[DONE]" and the server's close."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import websockets
from websockets.exceptions import WebSocketException

from services.client.transport_run import TransportRun


async def ws_chat(url: str, prompt: str, *, timing: Mapping[str, object] | None = None,
                  max_tokens: int | None = None, idle_timeout_s: float = 30.0) -> TransportRun:
    """`url` is ws://host:port/ws. No message for idle_timeout_s is an error."""
    run = TransportRun("websocket")
    message: dict[str, Any] = {"prompt": prompt}
    if timing:
        message["streamlab"] = dict(timing)
    if max_tokens is not None:
        message["max_tokens"] = max_tokens
    try:
        # compression=None: per-message deflate would hide
        # the framing cost the table is about.
        async with websockets.connect(url, compression=None, open_timeout=10,
                                      close_timeout=5) as ws:
            run.requests += 1  # the upgrade request
            await ws.send(json.dumps(message))
            while True:
                async with asyncio.timeout(idle_timeout_s):
                    frame = await ws.recv()
                text = frame if isinstance(frame, str) else frame.decode()
                run.payload_bytes_down += len(text.encode())
                if text == "[DONE]":
                    run.done = True
                    break
                payload = json.loads(text)
                if "error" in payload:
                    run.error = f"server: {payload['error']}"
                    break
                run.tokens([payload["text"]])
    except (OSError, TimeoutError, WebSocketException) as exc:
        run.error = f"{type(exc).__name__}: {exc}"
    return run.finish()
