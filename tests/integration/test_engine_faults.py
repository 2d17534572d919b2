"""Faults on the gRPC hop, mid-stream: the client always gets an error event and
an ended stream (no hang, no truncation that looks like success), and the
engine is left generating for nobody."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import httpx
import pytest

from services.client.openai_stream import StreamResult, chat_body, stream_chat
from streamlab.lab.local import Lab
from streamlab.lab.toxiproxy import Toxic
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from tests.integration.conftest import ExtraGateway
from tests.integration.engine_probe import wait_for_generation_end

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


def toxic(kind: str, **attributes: int) -> Callable[[Lab, str], None]:
    def inject(lab: Lab, request_id: str) -> None:
        client = lab.toxiproxy()
        try:
            # Every engine hop: with replicas the stream may use any of them.
            for hop in lab.hops_of("engine"):
                client.add_toxic(hop, Toxic(kind, dict(attributes)))
        finally:
            client.close()
    return inject


def disable_engine_proxy(lab: Lab, request_id: str) -> None:
    client = lab.toxiproxy()
    try:
        for hop in lab.hops_of("engine"):
            client.set_enabled(hop, False)
    finally:
        client.close()


def kill_serving_engine(lab: Lab, request_id: str) -> None:
    """The engine that runs the stream's generation (with replicas, found by its
    records; the other keeps serving)."""
    serving = [engine for engine in lab.engine_names
               if lab.engine_stats_of(engine, request_id).generations]
    assert len(serving) == 1, f"{request_id} runs on {serving}"
    lab.kill_service(serving[0])


def restart_stopped_engines(lab: Lab) -> None:
    for engine in lab.engine_names:
        try:
            serving = lab.engine_healthy(engine)
        except Exception:  # refused: it is down
            serving = False
        if not serving:
            lab.start_service(engine)


@dataclass(frozen=True)
class Fault:
    name: str
    inject: Callable[[Lab, str], None]
    # Upper bound on the time from the fault to the client's error event.
    detect_within_s: float = 3.0
    engine_survives: bool = True


FAULTS = [
    Fault("reset-peer", toxic("reset_peer", timeout=0)),
    Fault("limit-data", toxic("limit_data", bytes=1)),
    Fault("proxy-disabled", disable_engine_proxy),
    # Silence, no FIN or RST: found by the gateway's keepalive (1 s + 1 s in tests).
    Fault("black-hole", toxic("timeout", timeout=0), detect_within_s=6.0),
    Fault("engine-killed", kill_serving_engine, engine_survives=False),
]


async def stream_until_fault(lab: Lab, http: httpx.AsyncClient, fault: Fault,
                             request_id: str) -> tuple[StreamResult, float]:
    third = anyio.Event()
    result: list[StreamResult] = []
    body = chat_body("long answer", prefill_ms=20, token_gap_ms=30, answer_tokens=400)

    def on_token(_: str) -> None:
        if not third.is_set():
            third.set()

    async def run() -> None:
        result.append(await stream_chat(
            http, f"{lab.edge_url}/v1/chat/completions", body,
            headers={"X-Request-Id": request_id}, on_token=on_token))
        if not third.is_set():  # ended before any token: say why, do not time out
            raise AssertionError(
                f"stream ended before the fault was injected: {result[-1].error}")

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(run)
        with anyio.fail_after(10):
            await third.wait()
        await anyio.to_thread.run_sync(fault.inject, lab, request_id)
        injected_at = time.monotonic()
    return result[0], time.monotonic() - injected_at


async def chain_serves(lab: Lab, http: httpx.AsyncClient) -> None:
    """Wait (bounded) until short streams through the edge complete, several in
    a row (nginx spreads them over every gateway). The fault before this one
    (hops disabled, an engine killed) was undone, but a gateway's channel
    reconnects on its backoff: on the 2x2 lab a stream started at once got
    "connections to all backends failing" and this test ended before its fault."""
    body = chat_body("warm", prefill_ms=0, token_gap_ms=1, answer_tokens=2)
    in_a_row = 0
    with anyio.fail_after(15):
        while in_a_row < 2 * len(lab.gateway_names):
            result = await stream_chat(http, f"{lab.edge_url}/v1/chat/completions", body)
            in_a_row = in_a_row + 1 if result.done else 0
            if not result.done:
                await anyio.sleep(0.2)


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name)
async def test_engine_hop_fault_ends_the_stream_with_an_error_event(
    lab: Lab, http: httpx.AsyncClient, fault: Fault
) -> None:
    await chain_serves(lab, http)
    request_id = f"fault-{fault.name}-{uuid.uuid4().hex[:6]}"
    try:
        result, took = await stream_until_fault(lab, http, fault, request_id)
    finally:
        if not fault.engine_survives:
            await anyio.to_thread.run_sync(restart_stopped_engines, lab)

    print(f"{fault.name}: error event {took * 1000:.0f} ms after the fault: {result.error}")
    assert result.status == 200  # the fault came after the first byte...
    assert not result.done  # ...so no [DONE]: nobody may take the cut for a whole answer
    assert result.error is not None
    assert result.error.get("type") == "server_error", result.error
    assert 1 <= len(result.texts) < 400
    assert took < fault.detect_within_s

    if fault.engine_survives:
        # The engine's side of the call ends too (its own keepalive covers the
        # black hole), so nothing generates on for a client that got an error.
        record = await anyio.to_thread.run_sync(wait_for_generation_end, lab, request_id, 8.0)
        assert record.state == pb.GENERATION_STATE_CANCELLED


def test_a_frozen_gateway_is_found_by_the_engines_own_keepalive(
    lab: Lab, extra_gateway: Callable[..., ExtraGateway]
) -> None:
    """The one engine-hop failure where no FIN or RST ever reaches the engine: the
    gateway process stops (SIGSTOP, as in a long GC pause or a hung host) with
    its sockets open. Its kernel still ACKs, so only HTTP/2 pings that go
    unanswered tell the engine; without its keepalive, the call would sit
    there, holding a generation slot, for as long as the gateway stays frozen."""
    if lab.options.engine_env.get("STREAMLAB_ENGINE_KEEPALIVE_S") is None:
        pytest.skip("needs the suite's engine keepalive (2 s + 1 s)")
    keepalive_s = float(lab.options.engine_env["STREAMLAB_ENGINE_KEEPALIVE_S"]) + float(
        lab.options.engine_env["STREAMLAB_ENGINE_KEEPALIVE_TIMEOUT_S"])
    gateway = extra_gateway("gateway-frozen")
    rid = f"frozen-{uuid.uuid4().hex[:6]}"
    body = chat_body("long answer", prefill_ms=0, token_gap_ms=20, answer_tokens=2000)
    with httpx.Client(timeout=httpx.Timeout(5.0)) as http, http.stream(
            "POST", f"{gateway.url}/v1/chat/completions", json=body,
            headers={"X-Request-Id": rid}) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        while not next(lines).startswith("data:"):  # the first token is through
            pass
        os.kill(gateway.process.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            record = wait_for_generation_end(lab, rid, keepalive_s + 5.0)
        finally:
            os.kill(gateway.process.pid, signal.SIGCONT)
    took = record.cancelled_at - frozen_at
    print(f"frozen gateway: the engine cancelled after {took:.2f} s "
          f"({record.tokens_generated} tokens generated)")
    assert record.state == pb.GENERATION_STATE_CANCELLED
    assert record.tokens_generated < 2000
    assert took < keepalive_s + 3.0
