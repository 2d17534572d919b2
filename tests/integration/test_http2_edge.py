"""The HTTP/2 edge: nginx's TLS listener behind Toxiproxy "edge-h2" (docs/http2.md).

It must negotiate h2 by ALPN with a certificate from the lab's own CA, serve
the same locations as the plain edge, and stream SSE unbuffered: each token
as its own DATA frame when the gateway writes it, not at the end.
"""

from __future__ import annotations

import socket
import ssl
import time

import httpx
import pytest

from services.client.openai_stream import chat_body
from streamlab.lab.target import LabTarget

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TOKENS, GAP_MS = 12, 100


@pytest.fixture
def h2_lab(lab: LabTarget) -> LabTarget:
    if not lab.h2_ready():
        pytest.skip(f"no HTTP/2 edge at {lab.edge_h2_url} with the lab CA in {lab.tls.dir} "
                    "(compose: `streamlab compose tls` before `up`)")
    return lab


def alpn(lab: LabTarget, port: int, offered: list[str]) -> str | None:
    context = lab.tls.ssl_context()
    context.set_alpn_protocols(offered)
    with socket.create_connection((lab.ports.host, port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname=lab.ports.host) as tls:
        return tls.selected_alpn_protocol()


def test_edge_h2_negotiates_h2_by_alpn_with_the_lab_ca(h2_lab: LabTarget) -> None:
    port = h2_lab.ports.edge_h2_port
    assert alpn(h2_lab, port, ["h2", "http/1.1"]) == "h2"
    # A client that only speaks HTTP/1.1 still gets it on the same listener.
    assert alpn(h2_lab, port, ["http/1.1"]) == "http/1.1"


def test_edge_h2_certificate_is_refused_without_the_lab_ca(h2_lab: LabTarget) -> None:
    """The trust is the lab CA's, not a disabled check: the system's CAs refuse it."""
    context = ssl.create_default_context()
    with socket.create_connection((h2_lab.ports.host, h2_lab.ports.edge_h2_port),
                                  timeout=5) as raw, \
            pytest.raises(ssl.SSLCertVerificationError):
        context.wrap_socket(raw, server_hostname=h2_lab.ports.host)


async def test_sse_over_h2_streams_unbuffered(h2_lab: LabTarget) -> None:
    body = chat_body("h2", prefill_ms=100, token_gap_ms=GAP_MS, answer_tokens=TOKENS)
    arrivals: list[float] = []
    async with httpx.AsyncClient(http2=True, verify=h2_lab.tls.ssl_context(),
                                 timeout=httpx.Timeout(10.0, connect=5.0)) as client:
        started = time.monotonic()
        async with client.stream("POST", f"{h2_lab.edge_h2_url}/v1/chat/completions",
                                 json=body, headers={"Accept-Encoding": "identity"}) as response:
            assert response.status_code == 200
            assert response.http_version == "HTTP/2"
            assert response.headers["content-type"].startswith("text/event-stream")
            # HTTP/2 has no chunked encoding: DATA frames carry the body.
            assert "transfer-encoding" not in response.headers
            async for line in response.aiter_lines():
                if line.startswith("data: {") and '"content"' in line:
                    arrivals.append(time.monotonic() - started)
                if line == "data: [DONE]":
                    break
    assert len(arrivals) == TOKENS
    # Unbuffered: the tokens arrive spread over the model's pace (12 x 100 ms),
    # the first long before the last; a buffered proxy delivers them together.
    spread = arrivals[-1] - arrivals[0]
    assert spread >= 0.7 * (TOKENS - 1) * GAP_MS / 1000, arrivals
    assert arrivals[0] < arrivals[-1] / 2, arrivals


async def test_edge_h2_serves_the_same_locations(h2_lab: LabTarget) -> None:
    """/short-timeout/ and the plain locations answer on the h2 listener too."""
    async with httpx.AsyncClient(http2=True, verify=h2_lab.tls.ssl_context(),
                                 timeout=10.0) as client:
        ready = await client.get(f"{h2_lab.edge_h2_url}/readyz")
        short = await client.post(f"{h2_lab.edge_h2_url}/short-timeout/v1/chat/completions",
                                  json=chat_body("hi", stream=False, answer_tokens=2,
                                                 prefill_ms=1, token_gap_ms=1))
    assert ready.status_code == 200
    assert ready.http_version == "HTTP/2"
    assert short.status_code == 200, short.text
    assert short.json()["choices"][0]["message"]["content"]
