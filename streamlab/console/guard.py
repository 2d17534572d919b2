"""Who may drive the console: its own page, and nothing another site serves.

The console changes the lab (toxics, hops, presets) on a POST or a DELETE,
and browsers let any page send those to 127.0.0.1: a form or a `text/plain`
fetch needs no preflight, so CORS never asks. And a page on a domain that
re-resolves to 127.0.0.1 (DNS rebinding) is even same-origin with it, able to
read every answer. So, before any route runs:

    Host     every request (but /healthz, for probes) must name the console
             as its own address: 127.0.0.1:PORT, localhost:PORT, [::1]:PORT,
             the host it listens on, or one of `allowed_hosts`. A rebound
             page sends its own name (`Host: evil.example`): 403.
    Origin   a state-changing request (any method but GET, HEAD, OPTIONS)
             that carries one must carry the console's own (http:// and an
             allowed host); `null` and every other site: 403.
    token    and it must carry `X-Streamlab-Console-Token`: a secret drawn
             when the console starts and written into the page it serves
             (static/index.html's meta tag). Another site cannot read that
             page, and a custom header cannot be sent cross-site without a
             preflight the console never grants: 403 without it.

Refusals are `{"error": "..."}` (the control API's shape) with 403.
"""

from __future__ import annotations

import hmac
import json

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

TOKEN_HEADER = "x-streamlab-console-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
OPEN_PATHS = frozenset({"/healthz"})
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


def console_hosts(host: str, port: int, extra: list[str]) -> frozenset[str]:
    """`host:port` values a request to this console may carry in Host."""
    names = {"127.0.0.1", "localhost", "[::1]"}
    if host not in WILDCARD_HOSTS:
        names.add(f"[{host}]" if ":" in host else host)
    return frozenset({f"{name}:{port}".lower() for name in names}
                     | {entry.strip().lower() for entry in extra if entry.strip()})


class ConsoleGuard:
    def __init__(self, app: ASGIApp, hosts: frozenset[str], token: str) -> None:
        self.app = app
        self._hosts = hosts
        self._origins = frozenset(f"http://{host}" for host in hosts)
        self._token = token.encode()

    def problem(self, scope: Scope) -> str | None:
        """Why this request is refused, or None."""
        headers = Headers(scope=scope)
        if scope["path"] in OPEN_PATHS:
            return None
        if headers.get("host", "").lower() not in self._hosts:
            return "the Host header does not name this console"
        if scope.get("method", "GET") in SAFE_METHODS:
            return None
        origin = headers.get("origin")
        if origin is not None and origin.lower() not in self._origins:
            return "a change to the lab from another origin"
        token = headers.get(TOKEN_HEADER, "").encode("latin-1")
        if not hmac.compare_digest(token, self._token):
            return f"a change to the lab without the page's token ({TOKEN_HEADER})"
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        why = self.problem(scope) if scope["type"] in ("http", "websocket") else None
        if why is None:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":  # the console has none; refused all the same
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"error": why}).encode()
        await send({"type": "http.response.start", "status": 403, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
