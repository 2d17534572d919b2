"""Who is asking: one normalised client identity per request, for the
per-client caps (services/gateway/limits.py, taken by the lease) and for who
owns a resumable stream or a polling job (another identity gets 404).

    auth on     "key:<sha256 of the bearer key, 16 hex>": the key itself,
                parsed as BearerAuth parses it (auth.parse_bearer: scheme in
                any case, spaces around the key ignored), so `Bearer  sk-a`
                is still sk-a's; Authorization twice is a 400 before either
                reads it, auth on or off
    auth off    "addr:<client address>": the peer, or the address the proxy in
                front forwards (uvicorn rewrites the peer from X-Forwarded-For
                when the peer is in `forwarded_allow_ips`; nginx sets it)
                "id:<X-Client-Id>" instead, only with `trust_client_id_header`

Without auth a client's own headers prove nothing, so by default none of them
names it. Keys are hashed: identities end up in logs and metrics.
"""

from __future__ import annotations

import hashlib
import re

from starlette.requests import HTTPConnection

from services.gateway.auth import parse_bearer
from services.gateway.settings import GatewaySettings

# What X-Client-Id may hold when trusted: printable ASCII, bounded.
_CLIENT_ID = re.compile(r"^[\x21-\x7e]{1,128}$")


def bearer_token(connection: HTTPConnection) -> str | None:
    """The key, read by the same rule as BearerAuth (which refuses a request
    with more than one Authorization header, so there is one to read)."""
    # latin-1 round-trips the header's bytes, whatever they are.
    token = parse_bearer(connection.headers.get("authorization", "").encode("latin-1"))
    return None if token is None else token.decode("latin-1")


def client_identity(connection: HTTPConnection, settings: GatewaySettings) -> str:
    """`connection`: a Request or a WebSocket."""
    if settings.api_keys:
        token = bearer_token(connection)
        if token is not None:  # BearerAuth let it through, so it is a key
            # latin-1 round-trips the header's bytes, whatever they are.
            return "key:" + hashlib.sha256(token.encode("latin-1")).hexdigest()[:16]
    if settings.trust_client_id_header:
        claimed = connection.headers.get("x-client-id", "")
        if _CLIENT_ID.match(claimed):
            return "id:" + claimed
    client = connection.client
    return "addr:" + (client.host if client is not None else "unknown")
