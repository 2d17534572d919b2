"""Optional bearer-token auth for the API surfaces (off when no key is set),
and the one rule for reading the Authorization header (on or off).

A pure ASGI middleware, so it guards HTTP routes and WebSocket handshakes
alike, before any route runs or any engine work starts. Health, readiness and
metrics stay open for probes (they listen on loopback or the compose network
only). Keys are compared in constant time and never logged.

Authorization sent twice is a 400 everywhere, auth on or off: a reader that
takes the first and one that takes the last would disagree on who is asking
(auth let a request in with one key, identity counted it as the other's).
After this check there is one header, and `parse_bearer` reads it for both.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from services.gateway.errors import error_body, error_json

PROTECTED_PREFIXES = ("/v1/", "/ws")


def parse_bearer(value: bytes) -> bytes | None:
    """The key of `Bearer <key>` (scheme in any case, spaces around the key
    ignored), or None for anything else."""
    scheme, _, token = value.strip().partition(b" ")
    token = token.strip()
    if scheme.lower() != b"bearer" or not token:
        return None
    return token


def authorization_headers(scope: Scope) -> list[bytes]:
    return [value for name, value in scope.get("headers") or () if name == b"authorization"]


async def refuse(scope: Scope, send: Send, status: int, body: dict[str, Any],
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """Answer `body` with `status`; a WebSocket handshake is closed 1008 (policy
    violation) before it completes, which uvicorn answers as an HTTP 403, with
    the error's code and type as the reason."""
    if scope["type"] == "websocket":
        error = body["error"]
        await send({"type": "websocket.close", "code": 1008, "reason": json.dumps(
            {"code": error["code"], "type": error["type"]}, separators=(",", ":"))})
        return
    raw = error_json(body)
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), *(headers or []),
        (b"content-length", str(len(raw)).encode())]})
    await send({"type": "http.response.body", "body": raw})


class BearerAuth:
    def __init__(self, app: ASGIApp, keys: list[str]) -> None:
        self.app = app
        self._keys = [key.encode() for key in keys]

    def _allowed(self, authorization: list[bytes]) -> bool:
        token = parse_bearer(authorization[0]) if authorization else None
        if token is None:
            return False
        # Check every key (no early exit), each in constant time.
        return any([hmac.compare_digest(token, key) for key in self._keys])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        authorization = authorization_headers(scope)
        if len(authorization) > 1:
            # The values are not echoed: they are keys.
            await refuse(scope, send, 400, error_body(
                400, "duplicate_header", "the Authorization header was sent "
                f"{len(authorization)} times: send it once", param="Authorization"))
            return
        if (not self._keys or not scope["path"].startswith(PROTECTED_PREFIXES)
                or self._allowed(authorization)):
            await self.app(scope, receive, send)
            return
        await refuse(scope, send, 401, error_body(
            401, "invalid_api_key",
            "missing or invalid bearer token (Authorization: Bearer <key>)"),
            headers=[(b"www-authenticate", b"Bearer")])
