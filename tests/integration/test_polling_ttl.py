"""A classic break: polling that leaks, and the TTL that fixes it.

A polling job has no connection to close, so a client that walks away is
invisible: without a TTL the engine writes the whole answer for nobody and
the tokens stay in the gateway's memory. Two extra gateways on the lab's
engine, one with the TTL off and one with 1 s, get the same abandoned job;
the engine's counters tell what each did.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest

from services.client.openai_stream import chat_body
from services.client.polling import short_poll
from streamlab.lab.local import Lab
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from tests.integration.conftest import ExtraGateway
from tests.integration.engine_probe import wait_for_generation_end
from tests.wait import wait_until_async

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TTL_S = 1.0
# 10 s of tokens: far longer than the TTL and the test.
ABANDONED: dict[str, Any] = {"prefill_ms": 10, "token_gap_ms": 20, "answer_tokens": 500}


@pytest.fixture
def start_gateway(extra_gateway: Callable[..., ExtraGateway]) -> Callable[[float], str]:
    """Start an extra gateway on the lab's engine with a given job TTL."""
    return lambda ttl_s: extra_gateway(f"gateway-ttl-{ttl_s:g}",
                                       STREAMLAB_GATEWAY_JOB_TTL_S=str(ttl_s)).url


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

    # ...while the other engine call goes on writing for nobody. Both jobs step
    # on the engine's one batched clock, so right at the cancel they can hold the
    # same count: watch the leaked one pass it (a few steps), still running.
    async def leaked_past_the_reaped() -> bool:
        record_off = await anyio.to_thread.run_sync(state_of, lab, ids["off"])
        assert record_off.state == pb.GENERATION_STATE_RUNNING  # at every look, not just the last
        return record_off.tokens_generated > record_on.tokens_generated + 5
    await wait_until_async(leaked_past_the_reaped, timeout_s=5,
                           what="the unreaped job to generate past the reaped one")

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


async def test_a_request_may_shorten_its_jobs_ttl_but_not_lengthen_it(
    lab: Lab, http: httpx.AsyncClient
) -> None:
    """Per-job TTL on the lab's own gateway (TTL 30 s): the leak and its fix
    side by side without extra gateways (the poll-leak scenario runs on this)."""
    tag = uuid.uuid4().hex[:8]
    for asked, granted in ((None, 30.0), (120, 30.0)):  # 30 s: the gateway's default
        started = await http.post(f"{lab.edge_url}/v1/jobs",
                                  json=chat_body("x", answer_tokens=1, job_ttl_s=asked))
        assert started.status_code == 201
        assert started.json()["ttl_s"] == granted, f"asked for {asked}"

    shorter = await http.post(f"{lab.edge_url}/v1/jobs",
                              json=chat_body("abandon me", **ABANDONED, job_ttl_s=TTL_S),
                              headers={"X-Request-Id": f"ttl-short-{tag}"})
    assert shorter.status_code == 201
    assert shorter.json()["ttl_s"] == TTL_S
    record = await anyio.to_thread.run_sync(
        wait_for_generation_end, lab, f"ttl-short-{tag}", TTL_S * 5 + 5)
    assert record.state == pb.GENERATION_STATE_CANCELLED
    job = await http.get(f"{lab.edge_url}/v1/jobs/{shorter.json()['id']}")
    assert job.status_code == 404
