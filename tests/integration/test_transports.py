"""Every transport through the real chain: all tokens, in order, and a clean end.

Client → edge → nginx → upstream → gateway → engine hop → engine, for short
polling, long polling, SSE and the WebSocket; gRPC straight to the engine.
The reference text is the engine's own whole (non-streamed) completion.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import anyio
import grpc
import httpx
import pytest
import websockets

from services.client.grpc_stream import generate_request, grpc_once
from services.client.openai_stream import chat_body, sse_chat
from services.client.polling import long_poll, short_poll
from services.client.transport_run import TransportRun
from services.client.ws_stream import ws_chat
from services.engine.backends.fake import token_text
from services.gateway.settings import GatewaySettings
from streamlab.lab.local import Lab
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from tests.integration.engine_probe import wait_for_generation_end, wait_for_generation_start

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TIMING: dict[str, Any] = {"prefill_ms": 100, "token_gap_ms": 30, "answer_tokens": 12}


async def reference_text(lab: Lab, http: httpx.AsyncClient) -> str:
    whole = await http.post(f"{lab.gateway_url}/v1/chat/completions",
                            json=chat_body("hello", stream=False, **TIMING))
    assert whole.status_code == 200
    text: str = whole.json()["choices"][0]["message"]["content"]
    return text


def ws_url(lab: Lab) -> str:
    return lab.edge_url.replace("http://", "ws://", 1) + "/ws"


async def run_transport(name: str, lab: Lab, http: httpx.AsyncClient) -> TransportRun:
    body = chat_body("hello", **TIMING)
    if name == "poll":
        return await short_poll(http, lab.edge_url, body, interval_s=0.05)
    if name == "long poll":
        return await long_poll(http, lab.edge_url, body, wait_s=5.0)
    if name == "sse":
        return await sse_chat(http, f"{lab.edge_url}/v1/chat/completions", body)
    if name == "websocket":
        return await ws_chat(ws_url(lab), "hello", timing=TIMING)
    if name == "grpc":
        return await grpc_once(lab.engine_target, generate_request("hello", **TIMING))
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["poll", "long poll", "sse", "websocket", "grpc"])
async def test_every_token_in_order_then_a_clean_end(
    name: str, lab: Lab, http: httpx.AsyncClient
) -> None:
    run = await run_transport(name, lab, http)

    assert run.error is None, run.error
    assert run.done, "the transport's end marker must arrive"
    assert len(run.texts) == TIMING["answer_tokens"]
    assert run.text == await reference_text(lab, http)
    assert run.ttft_s is not None
    # Streamed, not delivered at the end: the first token well before the last.
    assert run.token_times[-1] - run.ttft_s > 0.5 * TIMING["token_gap_ms"] / 1000 * (
        TIMING["answer_tokens"] - 1)


async def test_polling_pays_one_request_per_poll(lab: Lab, http: httpx.AsyncClient) -> None:
    body = chat_body("hello", **TIMING)
    fast = await short_poll(http, lab.edge_url, body, interval_s=0.05)
    held = await long_poll(http, lab.edge_url, body, wait_s=5.0)
    slow = await short_poll(http, lab.edge_url, body, interval_s=0.25)
    generation_s = (TIMING["prefill_ms"] + TIMING["answer_tokens"] * TIMING["token_gap_ms"]
                    ) / 1000
    # A short poller asks about every interval whether or not anything is new...
    assert fast.requests >= generation_s / 0.05 * 0.5
    assert slow.requests < fast.requests
    # ...and its first token waits for the next tick.
    assert slow.ttft_s is not None
    assert slow.ttft_s >= 0.25
    # A long poller asks at most once per token, plus the start and the end.
    assert held.requests <= TIMING["answer_tokens"] + 2


async def test_websocket_ends_with_done_and_a_normal_close(lab: Lab) -> None:
    texts: list[str] = []
    with anyio.fail_after(15):
        async with websockets.connect(ws_url(lab), compression=None, open_timeout=5) as ws:
            await ws.send(json.dumps({"prompt": "hi", "streamlab": TIMING}))
            async for message in ws:
                texts.append(str(message))
            assert ws.close_code == 1000
    assert texts[-1] == "[DONE]"
    assert [json.loads(t)["index"] for t in texts[:-1]] == list(range(TIMING["answer_tokens"]))


def ws_origin_refusals(lab: Lab) -> float:
    """Summed over every gateway: with replicas, nginx may send the refused
    handshake to any of them."""
    total = 0.0
    for gateway in lab.gateway_names:
        metrics = httpx.get(f"{lab.url_of(gateway)}/metrics", timeout=5).text
        total += next(float(line.split()[1]) for line in metrics.splitlines()
                      if line.startswith("streamlab_gateway_ws_origin_refused_total "))
    return total


@pytest.mark.parametrize("origin", ["https://evil.example", "null"])
async def test_a_page_of_another_site_cannot_open_the_websocket(lab: Lab, origin: str) -> None:
    """Any page could open /ws through the edge and read the stream (browsers
    apply no CORS to WebSockets): refused before the upgrade, and counted."""
    before = ws_origin_refusals(lab)
    with anyio.fail_after(15), pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(ws_url(lab), origin=origin,  # type: ignore[arg-type]
                                      compression=None, open_timeout=5):
            pass
    assert refused.value.response.status_code == 403
    assert ws_origin_refusals(lab) == before + 1
    # The console's page (its origin, from lab.env's port) still streams.
    console = f"http://127.0.0.1:{lab.ports.console_port}"
    async with websockets.connect(ws_url(lab), origin=console,  # type: ignore[arg-type]
                                  compression=None, open_timeout=5) as ws:
        await ws.send(json.dumps({"prompt": "hi", "streamlab": TIMING}))
        assert json.loads(str(await ws.recv()))["index"] == 0


async def test_websocket_plain_text_prompt_uses_the_engine_defaults(lab: Lab) -> None:
    with anyio.fail_after(15):
        async with websockets.connect(ws_url(lab), compression=None, open_timeout=5) as ws:
            await ws.send("just a prompt, not JSON")
            first = json.loads(str(await ws.recv()))
    assert first == {"index": 0, "text": "the "}


async def test_websocket_bad_prompt_is_an_error_and_a_1007_close(lab: Lab) -> None:
    with anyio.fail_after(15):
        async with websockets.connect(ws_url(lab), compression=None, open_timeout=5) as ws:
            await ws.send(json.dumps({"prompt": "x", "streamlab": {"token_gap_ms": -1}}))
            error = json.loads(str(await ws.recv()))
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
            assert ws.close_code == 1007
    assert error["error"]["code"] == "invalid_prompt"
    assert "token_gap_ms" in error["error"]["message"]


async def test_websocket_prompt_over_the_size_limit_is_refused_like_on_sse(lab: Lab) -> None:
    request_id = f"ws-big-{uuid.uuid4().hex[:8]}"
    big = {"prompt": "x" * (GatewaySettings().max_prompt_chars + 1),
           "streamlab": {"request_id": request_id}}
    with anyio.fail_after(15):
        async with websockets.connect(ws_url(lab), compression=None, open_timeout=5) as ws:
            await ws.send(json.dumps(big))
            error = json.loads(str(await ws.recv()))
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
            assert ws.close_code == 1009  # "message too big" (RFC 6455), with a JSON reason
            assert json.loads(ws.close_reason or "{}")["code"] == "prompt_too_long"
    assert error["error"]["code"] == "prompt_too_long"
    assert not lab.engine_stats(request_id).generations, "refused, yet it started"


async def test_websocket_client_leaving_cancels_the_generation(lab: Lab) -> None:
    request_id = f"ws-close-{uuid.uuid4().hex[:8]}"
    timing = {"prefill_ms": 10, "token_gap_ms": 30, "answer_tokens": 300,
              "request_id": request_id}
    with anyio.fail_after(15):
        async with websockets.connect(ws_url(lab), compression=None, open_timeout=5) as ws:
            await ws.send(json.dumps({"prompt": "an essay", "streamlab": timing}))
            for _ in range(3):
                await ws.recv()
    closed_at = time.monotonic()
    record = await anyio.to_thread.run_sync(wait_for_generation_end, lab, request_id)
    assert record.state == pb.GENERATION_STATE_CANCELLED
    assert record.tokens_generated < 3 + 20
    assert record.tokens_after_cancel <= 1
    # The engine's clock is this host's CLOCK_MONOTONIC, like time.monotonic().
    assert record.cancelled_at - closed_at < 1.0


async def test_websocket_closed_during_a_silent_prefill_cancels_at_once(lab: Lab) -> None:
    """Nothing is sent during the prefill, so a send can't be what notices the
    close: the route's disconnect listener must (ws_routes._until_disconnect)."""
    request_id = f"ws-prefill-{uuid.uuid4().hex[:8]}"
    timing = {"prefill_ms": 3000, "token_gap_ms": 30, "answer_tokens": 20,
              "request_id": request_id}
    with anyio.fail_after(15):
        async with websockets.connect(ws_url(lab), compression=None, open_timeout=5) as ws:
            await ws.send(json.dumps({"prompt": "think first", "streamlab": timing}))
            # Leave once the engine has the call: mid-prefill, nothing sent yet.
            await anyio.to_thread.run_sync(wait_for_generation_start, lab, request_id)
    closed_at = time.monotonic()
    record = await anyio.to_thread.run_sync(wait_for_generation_end, lab, request_id)
    assert record.state == pb.GENERATION_STATE_CANCELLED
    assert record.tokens_generated == 0, "the prefill ran on to its first token"
    assert record.cancelled_at - closed_at < 1.0


async def test_deleting_a_polling_job_cancels_it_at_the_engine(
    lab: Lab, http: httpx.AsyncClient
) -> None:
    request_id = f"job-del-{uuid.uuid4().hex[:8]}"
    body = chat_body("long", prefill_ms=10, token_gap_ms=30, answer_tokens=300)
    started = await http.post(f"{lab.edge_url}/v1/jobs", json=body,
                              headers={"X-Request-Id": request_id})
    assert started.status_code == 201
    job_id = started.json()["id"]
    first = await http.get(f"{lab.edge_url}/v1/jobs/{job_id}",
                           params={"since": 0, "wait_s": 5})
    assert first.json()["tokens"]

    deleted = await http.delete(f"{lab.edge_url}/v1/jobs/{job_id}")
    assert deleted.status_code == 204
    record = await anyio.to_thread.run_sync(wait_for_generation_end, lab, request_id)
    assert record.state == pb.GENERATION_STATE_CANCELLED
    gone = await http.get(f"{lab.edge_url}/v1/jobs/{job_id}")
    assert gone.status_code == 404
    assert gone.json()["error"]["code"] == "job_not_found"


async def test_long_poll_answers_empty_at_its_timeout(lab: Lab, http: httpx.AsyncClient) -> None:
    body = chat_body("slow", prefill_ms=3_000, token_gap_ms=30, answer_tokens=2)
    job_id = (await http.post(f"{lab.edge_url}/v1/jobs", json=body)).json()["id"]
    try:
        started = time.monotonic()
        answer = await http.get(f"{lab.edge_url}/v1/jobs/{job_id}",
                                params={"since": 0, "wait_s": 0.5})
        held_s = time.monotonic() - started
        assert answer.status_code == 200
        assert answer.json()["tokens"] == []
        assert answer.json()["done"] is False
        assert held_s >= 0.5  # it held the request instead of answering at once
    finally:
        await http.delete(f"{lab.edge_url}/v1/jobs/{job_id}")


async def test_engine_refusal_is_an_http_status_on_the_job_start(
    lab: Lab, http: httpx.AsyncClient
) -> None:
    body = chat_body("too long", max_tokens=10**6)
    response = await http.post(f"{lab.edge_url}/v1/jobs", json=body)
    assert response.status_code == 400
    assert "max_tokens" in response.json()["error"]["message"]


async def test_grpc_direct_is_the_same_text_as_the_gateway(lab: Lab) -> None:
    # Guards the floor itself: a broken direct client would make every ratio wrong.
    with anyio.fail_after(15):
        async with grpc.aio.insecure_channel(lab.engine_target) as channel:
            await asyncio.wait_for(channel.channel_ready(), 5)
    run = await grpc_once(lab.engine_target, generate_request("hello", **TIMING))
    assert run.done
    # The whole answer, as the model writes it (the SSE and WebSocket tests
    # above compare their text with the same words).
    assert "".join(run.texts) == "".join(token_text(i) for i in range(TIMING["answer_tokens"]))
