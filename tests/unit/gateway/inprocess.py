"""Drive the gateway's ASGI app in-process (no sockets): its lifespan, plain
requests through httpx's ASGITransport, and a raw ASGI exchange for what
ASGITransport cannot do, a client that leaves in the middle."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import FastAPI

from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings
from services.gateway.state import GatewayState
from tests.unit.gateway.scripted_engine import ScriptedEngine


@dataclass
class Running:
    app: FastAPI
    engine: ScriptedEngine
    http: httpx.AsyncClient

    @property
    def gateway(self) -> GatewayState:
        state: GatewayState = self.app.state.gateway
        return state


@asynccontextmanager
async def running(engine: ScriptedEngine | None = None, **settings: Any
                  ) -> AsyncIterator[Running]:
    engine = engine or ScriptedEngine()
    app = create_app(GatewaySettings(**settings), engine=engine)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            yield Running(app, engine, http)


def chat(stream: bool = True, **streamlab: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "stream": stream}
    if streamlab:
        body["streamlab"] = streamlab
    return body


@dataclass
class Exchange:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


async def leave_midway(app: FastAPI, path: str, body: dict[str, Any],
                       leave_when: Callable[[Exchange], bool], timeout_s: float = 5.0
                       ) -> Exchange:
    """POST `body`, then disconnect as soon as `leave_when(what was received)`
    holds (polled while the app runs)."""
    payload = json.dumps(body).encode()
    gone = asyncio.Event()
    sent = False
    exchange = Exchange()

    async def receive() -> MutableMapping[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            exchange.status = message["status"]
            exchange.headers = {k.decode(): v.decode() for k, v in message["headers"]}
        elif message["type"] == "http.response.body":
            exchange.body += message.get("body", b"")

    async def watch() -> None:
        await until(lambda: leave_when(exchange), timeout_s)
        gone.set()

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "server": ("gateway", 80),
             "client": ("127.0.0.1", 1234),
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(payload)).encode())]}
    watcher = asyncio.ensure_future(watch())
    try:
        async with asyncio.timeout(timeout_s):
            await app(scope, receive, send)
    finally:
        watcher.cancel()
    return exchange


def sse_data(body: bytes) -> list[str]:
    return [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]


async def until(predicate: Callable[[], bool], timeout_s: float = 2.0) -> None:
    """Wait for `predicate` with a deadline. A poll: the states waited on (a
    call cancelled, a slot freed) belong to the code under test, which has no
    event to offer for them."""
    async with asyncio.timeout(timeout_s):
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.005)
