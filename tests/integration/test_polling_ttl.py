"""The seed's fourth break: polling that leaks, and the TTL that fixes it.

A polling job has no connection to close, so a client that walks away is
invisible: without a TTL the engine writes the whole answer for nobody and
the tokens stay in the gateway's memory. Two extra gateways on the lab's
engine, one with the TTL off and one with 1 s, get the same abandoned job;
the engine's counters tell what each did.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from services.client.openai_stream import chat_body
from services.client.polling import short_poll
from streamlab import processes
from streamlab.api.engine.v1 import engine_pb2 as pb
from streamlab.lab import Lab
from streamlab.processes import ServiceSpec
from streamlab.topology import REPO_ROOT
from tests.integration.conftest import free_ports
from tests.integration.engine_probe import wait_for_generation_end

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TTL_S = 1.0
# 10 s of tokens: far longer than the TTL and the test.
ABANDONED: dict[str, Any] = {"prefill_ms": 10, "token_gap_ms": 20, "answer_tokens": 500}


@pytest.fixture
def start_gateway(lab: Lab, tmp_path: Path) -> Iterator[Callable[[float], str]]:
    """Start an extra gateway with a given job TTL; stop every one at the end."""
    started: list[processes.Running] = []

    def start(ttl_s: float) -> str:
        port = free_ports(1)[0]
        url = f"http://{lab.ports.host}:{port}"
        spec = ServiceSpec(
            f"gateway-ttl-{ttl_s:g}", [sys.executable, "-m", "services.gateway"],
            env={"STREAMLAB_GATEWAY_HOST": lab.ports.host,
                 "STREAMLAB_GATEWAY_PORT": str(port),
                 "STREAMLAB_GATEWAY_ENGINE_TARGET": lab.engine_target,
                 "STREAMLAB_GATEWAY_JOB_TTL_S": str(ttl_s)},
            ready=lambda: httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200,
            cwd=REPO_ROOT)
        running = processes.start(spec, tmp_path / "logs")
        started.append(running)
        processes.wait_ready(running)
        return url

    try:
        yield start
    finally:
        for running in started:
            processes.stop(running, grace_s=5.0)


def state_of(lab: Lab, request_id: str) -> pb.GenerationRecord:
    records = lab.engine_stats(request_id).generations
    assert records, f"the engine never saw {request_id}"
    return records[0]


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_abandoned_job_leaks_without_ttl_and_is_cancelled_with_it(
    lab: Lab, http: httpx.AsyncClient, start_gateway: Callable[[float], str]
) -> None:
    leaky, reaping = await anyio.to_thread.run_sync(start_gateway, 0.0), \
        await anyio.to_thread.run_sync(start_gateway, TTL_S)
    tag = uuid.uuid4().hex[:8]
    ids = {"off": f"ttl-off-{tag}", "on": f"ttl-on-{tag}"}
    jobs = {}
    for key, base in (("off", leaky), ("on", reaping)):
        response = await http.post(f"{base}/v1/jobs", json=chat_body("abandon me", **ABANDONED),
                                   headers={"X-Request-Id": ids[key]})
        assert response.status_code == 201
        jobs[key] = response.json()["id"]
    started = time.monotonic()

    # Nobody polls. The TTL gateway cancels its job at the engine...
    record_on = await anyio.to_thread.run_sync(
        wait_for_generation_end, lab, ids["on"], TTL_S * 5 + 5)
    lived_s = time.monotonic() - started
    assert record_on.state == pb.GENERATION_STATE_CANCELLED
    assert lived_s >= TTL_S * 0.9, "cancelled before anyone could have polled"
    assert record_on.tokens_generated < ABANDONED["answer_tokens"]

    # ...while the other engine call goes on writing for nobody.
    record_off = await anyio.to_thread.run_sync(state_of, lab, ids["off"])
    assert record_off.state == pb.GENERATION_STATE_RUNNING
    assert record_off.tokens_generated > record_on.tokens_generated

    # The reaped job is gone; the leaked one is still held, tokens and all.
    assert (await http.get(f"{reaping}/v1/jobs/{jobs['on']}")).status_code == 404
    metrics_on = (await http.get(f"{reaping}/metrics")).text
    assert metric(metrics_on, 'streamlab_gateway_jobs_expired_total{state="generating"}') == 1
    assert metric(metrics_on, "streamlab_gateway_jobs") == 0
    held = await http.get(f"{leaky}/v1/jobs/{jobs['off']}")
    assert held.status_code == 200
    assert len(held.json()["tokens"]) > 0
    assert metric((await http.get(f"{leaky}/metrics")).text, "streamlab_gateway_jobs") == 1

    # Clean up the leak by hand, the only way there is without a TTL.
    assert (await http.delete(f"{leaky}/v1/jobs/{jobs['off']}")).status_code == 204
    record_off = await anyio.to_thread.run_sync(wait_for_generation_end, lab, ids["off"])
    assert record_off.state == pb.GENERATION_STATE_CANCELLED


async def test_a_job_that_is_polled_outlives_the_ttl(
    lab: Lab, start_gateway: Callable[[float], str]
) -> None:
    reaping = await anyio.to_thread.run_sync(start_gateway, TTL_S)
    timing: dict[str, Any] = {"prefill_ms": 10, "token_gap_ms": 30, "answer_tokens": 100}
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=5.0)) as http:
        run = await short_poll(http, reaping, chat_body("keep me", **timing),
                               interval_s=TTL_S / 4)
    assert run.error is None, run.error
    assert run.done
    assert len(run.texts) == timing["answer_tokens"]
