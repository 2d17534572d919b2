"""Replicas on real processes: 2 gateways behind nginx (least_conn), 2 engines
balanced by each gateway's gRPC channel (round_robin, health-checked), Redis
behind the `store` hop. A private lab on free ports, for this module alone.

Each verdict names the broken setting it guards against (docs/topology.md):
nginx round-robin instead of least_conn, a gateway channel without health
checks (or without round_robin), nginx without retrying on the next gateway.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
from collections.abc import Iterator

import anyio
import httpx
import pytest

from services.client.openai_stream import StreamResult, chat_body, stream_chat
from services.client.resume_stream import create_stream
from streamlab.lab.local import Lab
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from tests.integration import test_replica_loss as loss
from tests.integration.conftest import (
    replica_test_lab,
)
from tests.integration.engine_probe import wait_for_generation_end
from tests.wait import wait_until_async

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

GATEWAYS = ("gateway", "gateway-2")
ENGINES = ("engine", "engine-2")




@pytest.fixture(scope="module")
def replica_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with replica_test_lab(tmp_path_factory.mktemp("replicas"), {},
                          gateways=2, engines=2) as lab:
        yield lab


def url(lab: Lab) -> str:
    return f"{lab.edge_url}/v1/chat/completions"


def metric(lab: Lab, gateway: str, name: str) -> float:
    """One unlabelled sample of a gateway's /metrics (asked straight, not through nginx)."""
    text = httpx.get(f"{lab.url_of(gateway)}/metrics", timeout=5.0).text
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{gateway} has no metric {name}")


def active(lab: Lab) -> dict[str, float]:
    return {g: metric(lab, g, "streamlab_gateway_streams_active") for g in GATEWAYS}


def started(lab: Lab) -> dict[str, int]:
    return {e: lab.engine_stats_of(e).generations_started for e in ENGINES}


async def wait_idle(lab: Lab) -> None:
    await wait_until_async(lambda: not any(active(lab).values()), timeout_s=15,
                           what="every engine idle")


def short_body() -> dict[str, object]:
    return chat_body("short", prefill_ms=0, token_gap_ms=1, answer_tokens=3)


async def short_stream(client: httpx.AsyncClient, lab: Lab) -> StreamResult:
    result = await stream_chat(client, url(lab), short_body())
    assert result.status == 200, result.error
    assert result.done
    return result


async def test_status_lists_every_replica_and_redis(replica_lab: Lab) -> None:
    status = replica_lab.status()
    for name in (*GATEWAYS, *ENGINES, "redis"):
        assert status[name]["healthy"], (name, status[name])
        assert status[name]["pid"], (name, status[name])
    assert status["gateway-2"]["port"] == replica_lab.ports.gateway_port + 1
    assert status["redis"]["port"] == replica_lab.ports.redis_port
    with replica_lab.toxiproxy() as toxiproxy:
        hops = set(toxiproxy.proxies())
    assert {"upstream", "upstream-2", "engine", "engine-2", "store"} <= hops


async def test_new_streams_go_to_the_gateway_with_fewer_open(replica_lab: Lab) -> None:
    """Long streams with short requests between them: round-robin sends every
    long one to the same gateway (the short ones take the other's turns);
    least_conn sends each to the gateway with fewer open streams."""
    lab = replica_lab
    await wait_idle(lab)
    long_body = chat_body("long", prefill_ms=0, token_gap_ms=50, answer_tokens=400)
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=5.0)) as client:
        tasks: list[asyncio.Task[StreamResult]] = []
        try:
            for _ in range(4):
                first_token = asyncio.Event()
                tasks.append(asyncio.create_task(stream_chat(
                    client, url(lab), long_body,
                    on_token=functools.partial(lambda e, _t: e.set(), first_token))))
                with anyio.fail_after(10):
                    await first_token.wait()
                await short_stream(client, lab)
            assert active(lab) == {"gateway": 2, "gateway-2": 2}
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    await wait_idle(lab)


async def test_one_gateway_spreads_calls_over_both_engines(replica_lab: Lab) -> None:
    """Straight to one gateway: its channel alternates the engines (pick_first
    would send all eight to one)."""
    lab = replica_lab
    before = started(lab)
    gateway_url = f"{lab.url_of('gateway')}/v1/chat/completions"
    async with httpx.AsyncClient(timeout=10.0) as client:
        for _ in range(8):
            result = await stream_chat(client, gateway_url, short_body())
            assert result.status == 200
            assert result.done
    after = started(lab)
    spread = {e: after[e] - before[e] for e in ENGINES}
    assert sum(spread.values()) == 8
    assert min(spread.values()) >= 3, spread


async def test_a_draining_engine_gets_no_new_calls(replica_lab: Lab) -> None:
    """engine-2 reports NOT_SERVING (SIGUSR1: draining, still able to serve):
    the gateways' health checks take it out of rotation; engine takes every
    new call. Without health checks half of them would still go to engine-2."""
    lab = replica_lab
    pid = lab.pids["engine-2"]
    os.kill(pid, signal.SIGUSR1)
    try:
        await wait_until_async(lambda: not lab.engine_healthy("engine-2"), timeout_s=5,
                               what="engine-2 to answer NOT_SERVING after SIGUSR1")
        before = started(lab)
        async with httpx.AsyncClient(timeout=10.0) as client:
            for _ in range(8):
                await short_stream(client, lab)
        after = started(lab)
        assert after["engine-2"] == before["engine-2"], (before, after)
        assert after["engine"] - before["engine"] == 8
    finally:
        os.kill(pid, signal.SIGUSR2)
    # Back in rotation once it serves again (the channel's health watch says so).
    drained_count = started(lab)["engine-2"]
    async with httpx.AsyncClient(timeout=10.0) as client:
        async def engine_2_serves() -> bool:
            # Each try sends a stream: the balancer only shows its choice on traffic.
            if started(lab)["engine-2"] != drained_count:
                return True
            await short_stream(client, lab)
            return False
        await wait_until_async(engine_2_serves, timeout_s=10, interval_s=0,
                               what="engine-2 to get a call after SIGUSR2")


async def test_stopping_and_restarting_one_gateway_keeps_the_chain_serving(
        replica_lab: Lab) -> None:
    """gateway-2 stopped (its hop still listening, as a load balancer's target
    would be until a health check notices): every request still gets its answer
    (nginx retries it on gateway); after a restart gateway-2 takes streams again."""
    lab = replica_lab
    await wait_idle(lab)
    lab.stop_service("gateway-2", grace_s=5.0)
    async with httpx.AsyncClient(timeout=10.0) as client:
        for _ in range(6):
            await short_stream(client, lab)
        lab.start_service("gateway-2")
        before = metric(lab, "gateway-2", "streamlab_gateway_tokens_relayed_total")

        async def gateway_2_serves() -> bool:
            # Each try sends a stream: nginx only shows its choice on traffic.
            if metric(lab, "gateway-2", "streamlab_gateway_tokens_relayed_total") != before:
                return True
            await short_stream(client, lab)
            return False
        await wait_until_async(gateway_2_serves, timeout_s=10, interval_s=0,
                               what="gateway-2 to take a stream after its restart")
    assert lab.status()["gateway-2"]["healthy"]


async def test_a_job_started_on_either_gateway_is_polled_and_deleted_through_the_edge(
        replica_lab: Lab) -> None:
    """Jobs live in the gateway that started them; nginx sends every poll and
    DELETE of a job to that gateway (the id carries its tag). Without that,
    least_conn sent about every other poll to the other gateway: 404."""
    lab = replica_lab
    body = chat_body("poll me", prefill_ms=0, token_gap_ms=10, answer_tokens=20)
    edge_jobs = f"{lab.edge_url}/v1/jobs"
    async with httpx.AsyncClient(timeout=10.0) as client:
        ids = {}
        for gateway in GATEWAYS:  # one job on each, started there
            started_job = await client.post(f"{lab.url_of(gateway)}/v1/jobs", json=body)
            assert started_job.status_code == 201, started_job.text
            ids[gateway] = started_job.json()["id"]
        assert ids["gateway"].startswith("g1."), ids
        assert ids["gateway-2"].startswith("g2."), ids

        for gateway, job_id in ids.items():
            tokens: list[str] = []
            with anyio.fail_after(10):
                while True:  # long polls through the edge, each asking from `next`
                    poll = await client.get(f"{edge_jobs}/{job_id}",
                                            params={"since": len(tokens), "wait_s": 1})
                    assert poll.status_code == 200, (gateway, poll.text)
                    tokens += poll.json()["tokens"]
                    if poll.json()["done"]:
                        break
            assert len(tokens) == 20, (gateway, tokens)

        for gateway, job_id in ids.items():
            assert (await client.delete(f"{edge_jobs}/{job_id}")).status_code == 204, gateway
            assert (await client.get(f"{edge_jobs}/{job_id}")).status_code == 404, gateway
        # An id no gateway made goes to the pool, and gets the gateways' own 404.
        unknown = await client.get(f"{edge_jobs}/g7.{'0' * 32}")
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "job_not_found"


async def test_a_delete_stops_a_resumable_generation_on_whichever_engine_runs_it(
        replica_lab: Lab) -> None:
    """Resumable generations outlive their call (for re-attach), so a DELETE
    stops them with an explicit Cancel by request id. The balanced channel sent
    that Cancel to either engine: on the wrong one it stopped nothing, and the
    generation ran on until its orphan grace (10 s)."""
    lab = replica_lab
    body = {"messages": [{"role": "user", "content": "stop me"}],
            "streamlab": {"prefill_ms": 0, "token_gap_ms": 20, "answer_tokens": 400},
            "resume": {"retry_ms": 100}}
    ran_on: set[str] = set()
    async with httpx.AsyncClient(timeout=10.0) as client:
        for _ in range(6):
            created = await create_stream(client, lab.edge_url, body)
            deleted = await client.delete(f"{lab.edge_url}/v1/streams/{created['id']}")
            assert deleted.status_code == 200, deleted.text
            record = await anyio.to_thread.run_sync(
                wait_for_generation_end, lab, created["id"], 2.0)
            assert record.state == pb.GENERATION_STATE_CANCELLED
            ran_on.update(e for e in ENGINES
                          if lab.engine_stats_of(e, created["id"]).generations)
    assert ran_on == set(ENGINES), "every engine ran some of them"


def test_a_killed_gateways_streams_reattach_to_whichever_engine_runs_them(
        replica_lab: Lab) -> None:
    """Two resumable streams owned by gateway-2, one on each engine (the channel
    alternates them); gateway-2 is SIGKILLed; each client resumes on gateway
    and ends with the full text exactly once: the takeover found each
    generation on its own engine (an Attach by request id through the balanced
    channel reached the other engine half the time: NOT_FOUND, a lost stream)."""
    lab = replica_lab
    owner, other = lab.url_of("gateway-2"), lab.url_of("gateway")
    with httpx.Client(timeout=httpx.Timeout(10.0, connect=5.0)) as http:
        on: dict[str, str] = {}  # engine -> the first stream that runs there
        for _ in range(8):
            stream_id = loss.create(http, owner)
            engine = next(e for e in ENGINES if lab.engine_stats_of(e, stream_id).generations)
            if engine in on:  # a second one there: not needed
                assert http.delete(f"{owner}/v1/streams/{stream_id}").status_code == 200
            on.setdefault(engine, stream_id)
            if len(on) == len(ENGINES):
                break
        assert set(on) == set(ENGINES), "one stream on each engine"
        ids = list(on.values())
        before = [loss.read(http, owner, i, stop_after=20) for i in ids]
        lab.kill_service("gateway-2")
        try:
            for stream_id, first in zip(ids, before, strict=True):
                after = loss.read(http, other, stream_id, last_event_id=first.last.id)
                assert after.status == 200
                assert loss.exactly_once(first, after), (loss.seqs(after.events), after.last)
        finally:
            lab.start_service("gateway-2")
