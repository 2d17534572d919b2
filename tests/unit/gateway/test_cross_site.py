"""The gateway's own surfaces against other sites: /ws opens only for the
console's origin, configured ones and non-browser clients; one Authorization
header or a 400; the API's own description off unless asked for."""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any

import pytest
from prometheus_client import generate_latest
from starlette.testclient import TestClient
from starlette.types import ASGIApp
from starlette.websockets import WebSocketDisconnect

from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings
from tests.unit.gateway.scripted_engine import Script, ScriptedEngine

CONSOLE_PORT = 8475


def client(**settings: Any) -> TestClient:
    settings.setdefault("console_port", CONSOLE_PORT)
    app = create_app(GatewaySettings(**settings), engine=ScriptedEngine(Script(tokens=2)))
    return TestClient(app)


async def ws_handshake(app: ASGIApp, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    """What the app answers a /ws handshake with exactly these header lines
    (TestClient's headers are a dict: no header twice)."""
    scope = {"type": "websocket", "path": "/ws", "raw_path": b"/ws", "query_string": b"",
             "headers": [(b"host", b"gateway"), *headers], "scheme": "ws",
             "client": ("127.0.0.1", 4321), "server": ("gateway", 80), "subprotocols": [],
             "asgi": {"version": "3.0"}}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    await app(scope, receive, send)
    return sent[0]


def streamed(http: TestClient, headers: dict[str, str]) -> list[str]:
    with http.websocket_connect("/ws", headers=headers) as ws:
        ws.send_text("hi")
        messages = []
        while (message := ws.receive_text()) != "[DONE]":
            messages.append(message)
    return messages


def refused_origins(http: TestClient) -> float:
    for line in generate_latest(http.app.state.gateway.metrics.registry).decode().splitlines():  # type: ignore[attr-defined]
        if line.startswith("streamlab_gateway_ws_origin_refused_total "):
            return float(line.split()[1])
    raise AssertionError("no streamlab_gateway_ws_origin_refused_total in /metrics")


@pytest.mark.parametrize("origin", [
    None,  # a non-browser client: it sends no Origin
    f"http://127.0.0.1:{CONSOLE_PORT}", f"http://localhost:{CONSOLE_PORT}",
    f"HTTP://LOCALHOST:{CONSOLE_PORT}",  # scheme and host are case-insensitive
])
def test_the_console_and_non_browser_clients_stream(origin: str | None) -> None:
    with client() as http:
        assert len(streamed(http, {"Origin": origin} if origin else {})) == 2
        assert refused_origins(http) == 0


@pytest.mark.parametrize("origin", [
    "https://evil.example", "null", f"http://127.0.0.1:{CONSOLE_PORT + 1}",
    f"https://127.0.0.1:{CONSOLE_PORT}", f"http://127.0.0.1:{CONSOLE_PORT}.evil.example",
    "http://localhost", "",
])
def test_another_origin_is_refused_before_the_upgrade(origin: str) -> None:
    """A page on any site could open /ws (a browser sends its cookies and
    lets it read the answer): a cross-site WebSocket hijack."""
    with client() as http:
        with pytest.raises(WebSocketDisconnect) as refused, \
                http.websocket_connect("/ws", headers={"Origin": origin}):
            pass
        assert refused.value.code == 1008
        assert json.loads(refused.value.reason)["code"] == "origin_not_allowed"
        assert http.app.state.gateway.engine.calls == []  # type: ignore[attr-defined]
        assert refused_origins(http) == 1


def test_configured_origins_stream_and_the_console_port_can_be_unset() -> None:
    with client(ws_allowed_origins=["https://app.example:8443"]) as http:
        assert len(streamed(http, {"Origin": "https://app.example:8443"})) == 2
    with client(console_port=None) as http, pytest.raises(WebSocketDisconnect), \
            http.websocket_connect("/ws", headers={"Origin": f"http://127.0.0.1:{CONSOLE_PORT}"}):
        pass


DUPLICATE = [("authorization", "Bearer sk-a"), ("authorization", "Bearer sk-b")]
CHAT = {"messages": [{"role": "user", "content": "hi"}], "stream": False}


@pytest.mark.parametrize("keys", [[], ["sk-a", "sk-b"]])
def test_duplicate_authorization_is_a_400_naming_the_header(keys: list[str]) -> None:
    """Auth read the last header and identity the first: a request could pass
    auth with one key and be counted (and own streams) as another."""
    with client(api_keys=keys) as http:
        for path in ("/v1/chat/completions", "/v1/jobs"):
            answer = http.post(path, json=CHAT, headers=DUPLICATE)
            assert answer.status_code == 400
            error = answer.json()["error"]
            assert (error["code"], error["param"]) == ("duplicate_header", "Authorization")
            assert "Authorization" in error["message"]
            assert "sk-" not in answer.text  # the values are not echoed
        assert http.portal is not None
        answer = http.portal.call(ws_handshake, http.app,
                                  [(k.encode(), v.encode()) for k, v in DUPLICATE])
        assert (answer["type"], answer["code"]) == ("websocket.close", 1008)
        assert json.loads(answer["reason"])["code"] == "duplicate_header"
        assert http.app.state.gateway.engine.calls == []  # type: ignore[attr-defined]
        # One header, as ever.
        ok = http.post("/v1/chat/completions", json=CHAT, headers=DUPLICATE[:1])
        assert ok.status_code == 200


def test_the_api_description_is_off_unless_asked_for() -> None:
    with client() as http:
        for path in ("/openapi.json", "/docs", "/redoc"):
            assert http.get(path).status_code == 404
    with client(api_docs=True) as http:
        assert http.get("/openapi.json").json()["info"]["title"] == "streamlab gateway"
        assert http.get("/docs").status_code == 200
