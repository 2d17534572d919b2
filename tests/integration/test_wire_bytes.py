"""The bench's byte counts come from the wire (Toxiproxy's edge proxy metrics),
and they agree with what the clients saw, give or take the headers.

First the meter itself, exactly: a raw HTTP exchange of known bytes moves the
counters by exactly those bytes. Then each transport: the wire carries at
least the payload the client read, and at most that plus a header allowance
per request and framing per token.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest

from services.client.openai_stream import chat_body, sse_chat
from services.client.polling import long_poll, short_poll
from services.client.ws_stream import ws_chat
from streamlab.experiments.bench.probes import WireBytes, WireMeter
from streamlab.lab.local import Lab

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TIMING: dict[str, Any] = {"prefill_ms": 20, "token_gap_ms": 20, "answer_tokens": 10}
# Response headers through nginx are ~250 bytes, request headers from httpx
# ~150 plus the URL; chunked SSE adds ~8 bytes per event, a WebSocket frame 2-4.
HEADER_ALLOWANCE = 600
FRAMING_PER_TOKEN = 16


@pytest.fixture
def edge_meter(lab: Lab) -> Iterator[WireMeter]:
    client = lab.toxiproxy()
    try:
        yield WireMeter(client, "edge")
    finally:
        client.close()


async def test_the_meter_counts_exactly_the_bytes_of_an_exchange(
    lab: Lab, edge_meter: WireMeter
) -> None:
    request = (f"GET /healthz HTTP/1.1\r\nHost: {lab.ports.host}\r\n"
               "Connection: close\r\n\r\n").encode()

    def exchange() -> bytes:
        with socket.create_connection((lab.ports.host, lab.ports.edge_port), timeout=5) as sock:
            sock.sendall(request)
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
            return received

    before = await anyio.to_thread.run_sync(edge_meter.settled)
    response = await anyio.to_thread.run_sync(exchange)
    moved = await anyio.to_thread.run_sync(edge_meter.settled) - before

    assert response.startswith(b"HTTP/1.1 200")
    assert moved == WireBytes(up=len(request), down=len(response))


@pytest.mark.parametrize("name", ["sse", "websocket", "long poll", "poll"])
async def test_wire_bytes_match_what_the_client_saw(
    name: str, lab: Lab, edge_meter: WireMeter
) -> None:
    body = chat_body("count me", **TIMING)
    before = await anyio.to_thread.run_sync(edge_meter.settled)
    # identity: nginx would gzip for clients that accept it, and then the wire
    # would carry fewer bytes than the client's decoded payload.
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=5.0),
                                 headers={"Accept-Encoding": "identity"}) as http:
        if name == "sse":
            run = await sse_chat(http, f"{lab.edge_url}/v1/chat/completions", body)
        elif name == "websocket":
            run = await ws_chat(lab.edge_url.replace("http://", "ws://", 1) + "/ws", "count me",
                                timing=TIMING)
        elif name == "long poll":
            run = await long_poll(http, lab.edge_url, body, wait_s=5.0)
        else:
            run = await short_poll(http, lab.edge_url, body, interval_s=0.05)
    moved = await anyio.to_thread.run_sync(edge_meter.settled) - before

    assert run.done, run.error
    tokens = len(run.texts)
    assert tokens == TIMING["answer_tokens"]
    assert run.payload_bytes_down <= moved.down
    assert moved.down <= (run.payload_bytes_down + run.requests * HEADER_ALLOWANCE
                          + tokens * FRAMING_PER_TOKEN)
    # Up: at least one request line per request, at most a header allowance each
    # (plus the prompt: the job/chat body once, a masked WebSocket message once).
    assert moved.up >= run.requests * len("GET / HTTP/1.1\r\n\r\n")
    assert moved.up <= run.requests * HEADER_ALLOWANCE + len(str(body)) + 64
