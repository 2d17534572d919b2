"""Optional bearer-token auth for the API surfaces (off when no key is set).

A pure ASGI middleware, so it guards HTTP routes and WebSocket handshakes
alike, before any route runs or any engine work starts. Health, readiness and
metrics stay open for probes (they listen on loopback or the compose network
only). Keys are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send

PROTECTED_PREFIXES = ("/v1/", "/ws")


class BearerAuth:
    def __init__(self, app: ASGIApp, keys: list[str]) -> None:
        self.app = app
        self._keys = [key.encode() for key in keys]

    def _allowed(self, scope: Scope) -> bool:
        headers = dict(scope.get("headers") or ())
        auth = headers.get(b"authorization", b"")
        scheme, _, token = auth.partition(b" ")
        if scheme.lower() != b"bearer" or not token:
            return False
        # Check every key (no early exit), each in constant time.
        return any([hmac.compare_digest(token.strip(), key) for key in self._keys])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (not self._keys or scope["type"] not in ("http", "websocket")
                or not scope["path"].startswith(PROTECTED_PREFIXES) or self._allowed(scope)):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            # 1008, policy violation; before the handshake completes uvicorn
            # answers it as an HTTP 403.
            await send({"type": "websocket.close", "code": 1008, "reason": json.dumps(
                {"code": "invalid_api_key", "type": "invalid_request_error"})})
            return
        body = json.dumps({"error": {
            "message": "missing or invalid bearer token (Authorization: Bearer <key>)",
            "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
            (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
