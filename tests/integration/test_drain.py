"""SIGTERM drains instead of cutting: live streams finish within the grace,
the rest are told to come back, new work is refused cleanly meanwhile."""

from __future__ import annotations

import os
import signal
import time
import uuid

import anyio
import httpx
import pytest

from services.client.openai_stream import StreamResult, chat_body, stream_chat
from streamlab.lab.local import Lab
from streamlab.lab.processes import pid_alive
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from tests.integration.conftest import TEST_DRAIN_GRACE_S
from tests.integration.engine_probe import wait_for_generation_end
from tests.wait import wait_until_async

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


def url(lab: Lab) -> str:
    return f"{lab.edge_url}/v1/chat/completions"


def needs_local_process(lab: Lab, name: str) -> None:
    # These tests signal the service's process by pid and watch it exit.
    if lab.pids is None or name not in lab.pids:
        pytest.skip(f"signals the {name} process by pid; on the compose target it runs in "
                    "a container (STREAMLAB_TARGET=compose)")


async def wait_exited(lab: Lab, name: str, timeout_s: float) -> float:
    started = time.monotonic()
    await wait_until_async(lambda: not pid_alive(lab.pids[name]), timeout_s=timeout_s,
                           what=f"the {name} process ({lab.pids[name]}) to exit")
    return time.monotonic() - started


async def test_gateway_sigterm_finishes_short_streams_and_sends_long_ones_back(
    lab: Lab, http: httpx.AsyncClient
) -> None:
    needs_local_process(lab, "gateway")
    short_rid, long_rid = (f"drain-{k}-{uuid.uuid4().hex[:6]}" for k in ("short", "long"))
    results: dict[str, StreamResult] = {}
    started = {short_rid: anyio.Event(), long_rid: anyio.Event()}

    async def stream(rid: str, tokens: int) -> None:
        results[rid] = await stream_chat(
            http, url(lab), chat_body("x", prefill_ms=10, token_gap_ms=50, answer_tokens=tokens),
            headers={"X-Request-Id": rid}, on_token=lambda _: started[rid].set())

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(stream, short_rid, 20)  # 1 s: inside the grace
            tasks.start_soon(stream, long_rid, 400)  # 20 s: outlives it
            with anyio.fail_after(5):
                for event in started.values():
                    await event.wait()
            os.kill(lab.pids["gateway"], signal.SIGTERM)
            # Draining: the listener stays up and says so, with a retry hint.
            async def draining() -> httpx.Response | None:
                health = await http.get(f"{lab.gateway_url}/healthz")
                return health if health.status_code == 503 else None
            health = await wait_until_async(draining, timeout_s=3, interval_s=0.02,
                                            what="the draining gateway's /healthz to answer 503")
            assert health.json()["status"] == "draining"
            refused = await http.post(url(lab), json=chat_body("new", answer_tokens=1))
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "server_draining"
            assert "retry-after" in refused.headers
        took = await wait_exited(lab, "gateway", TEST_DRAIN_GRACE_S + 8)
    finally:
        lab.stop_service("gateway")  # reap
        await anyio.to_thread.run_sync(lab.start_service, "gateway")

    short, long = results[short_rid], results[long_rid]
    assert short.done, short.error
    assert len(short.texts) == 20
    assert not long.done
    assert long.error is not None
    assert long.error["code"] == "server_draining"
    assert long.retry_ms is not None
    assert took < TEST_DRAIN_GRACE_S + 5
    record = await anyio.to_thread.run_sync(wait_for_generation_end, lab, long_rid)
    assert record.state == pb.GENERATION_STATE_CANCELLED


async def test_engine_sigterm_finishes_live_streams_and_refuses_new_ones(
    lab: Lab, http: httpx.AsyncClient
) -> None:
    needs_local_process(lab, "engine")
    rid = f"engine-drain-{uuid.uuid4().hex[:6]}"
    first = anyio.Event()
    result: list[StreamResult] = []

    async def stream() -> None:
        result.append(await stream_chat(
            http, url(lab), chat_body("x", prefill_ms=10, token_gap_ms=50, answer_tokens=30),
            headers={"X-Request-Id": rid}, on_token=lambda _: first.set()))

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(stream)
            with anyio.fail_after(5):
                await first.wait()
            os.kill(lab.pids["engine"], signal.SIGTERM)
            async def refusing() -> httpx.Response | None:
                answer = await http.post(url(lab), json=chat_body("new", answer_tokens=1))
                return answer if answer.status_code != 200 else None
            refused = await wait_until_async(refusing, timeout_s=3, interval_s=0,
                                             what="the gateway to refuse while the engine drains")
            assert refused.status_code == 503
        await wait_exited(lab, "engine", 10)
    finally:
        lab.stop_service("engine")
        await anyio.to_thread.run_sync(lab.start_service, "engine")
    assert result[0].done, result[0].error  # finished within the engine's grace
    assert len(result[0].texts) == 30
