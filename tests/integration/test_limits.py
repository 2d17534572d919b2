"""Load shedding: past a cap, a clear refusal before the first byte and before
anything starts at the engine."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable

import grpc
import httpx
import pytest

from services.client.openai_stream import chat_body
from streamlab.lab.local import Lab
from streamlab.lab.processes import free_ports
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.engine.v1 import engine_pb2_grpc as pb_grpc
from tests.integration.conftest import (
    TEST_ENGINE_QUEUED,
    TEST_ENGINE_RUNNING,
    TEST_PER_CLIENT_STREAMS,
    ExtraGateway,
)
from tests.wait import wait_until_async

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

SLOW = chat_body("hold the line", prefill_ms=30_000, answer_tokens=1)
QUICK = {**chat_body("hi", prefill_ms=1, token_gap_ms=1, answer_tokens=2), "stream": False}


def url(lab: Lab) -> str:
    return f"{lab.edge_url}/v1/chat/completions"


async def test_a_claimed_client_id_does_not_buy_another_cap(
    lab: Lab, http: httpx.AsyncClient
) -> None:
    """Without auth the client is its address (nginx forwards it); X-Client-Id
    used to be the key, so a client dodged its cap by naming itself anew.
    With replicas the cap is still one: they count it together in Redis
    (services/gateway/shared_caps.py; each used to count alone, so a client
    held the cap on every gateway)."""
    async with contextlib.AsyncExitStack() as held:
        for i in range(TEST_PER_CLIENT_STREAMS):
            response = await held.enter_async_context(
                http.stream("POST", url(lab), json=SLOW, headers={"X-Client-Id": f"hog-{i}"}))
            assert response.status_code == 200
        rid = f"refused-{uuid.uuid4().hex[:8]}"
        refused = await http.post(url(lab), json=SLOW,
                                  headers={"X-Client-Id": "a-new-name", "X-Request-Id": rid})
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "too_many_streams"
        assert not lab.engine_stats(rid).generations  # nothing started at the engine
    # Closing the held streams gives the slots back.
    async def slot_free() -> bool:
        return (await http.post(url(lab), json=QUICK)).status_code == 200
    await wait_until_async(slot_free, timeout_s=10,
                           what="a slot back (200) after the held streams closed")


KEYS = ("sk-hog", "sk-polite")


@pytest.fixture
def keyed_gateway(extra_gateway: Callable[..., ExtraGateway]) -> str:
    """A gateway with auth on: each key is one client, with a cap of 3."""
    return extra_gateway("gateway-keys", STREAMLAB_GATEWAY_API_KEYS=json.dumps(list(KEYS)),
                         STREAMLAB_GATEWAY_MAX_STREAMS_PER_CLIENT="3").url


async def test_every_kind_of_work_counts_against_its_key_s_cap(
    lab: Lab, http: httpx.AsyncClient, keyed_gateway: str
) -> None:
    """A stream, a polling job and a resumable stream each hold one of the key's
    slots, however the key's header is spelled; other keys are spared. (Jobs
    took no slot: one client held 128 and starved the others; `Bearer  sk-a`
    with two spaces was a new client.)"""
    hog = {"Authorization": "Bearer sk-hog"}
    async with contextlib.AsyncExitStack() as held:
        response = await held.enter_async_context(
            http.stream("POST", f"{keyed_gateway}/v1/chat/completions", json=SLOW, headers=hog))
        assert response.status_code == 200
        job = await http.post(f"{keyed_gateway}/v1/jobs", json=SLOW, headers=hog)
        assert job.status_code == 201
        stream = await http.post(f"{keyed_gateway}/v1/streams", json=SLOW, headers=hog)
        assert stream.status_code == 201
        for spelling in ("Bearer  sk-hog", "bearer sk-hog", "BEARER sk-hog"):
            rid = f"refused-{uuid.uuid4().hex[:8]}"
            refused = await http.post(f"{keyed_gateway}/v1/jobs", json=SLOW,
                                      headers={"Authorization": spelling, "X-Request-Id": rid})
            assert refused.status_code == 429, spelling
            assert refused.json()["error"]["type"] == "rate_limit_error"
            assert not lab.engine_stats(rid).generations
        polite = await http.post(f"{keyed_gateway}/v1/chat/completions", json=QUICK,
                                 headers={"Authorization": "Bearer sk-polite"})
        assert polite.status_code == 200
        # Stopping the job and the stream gives their slots back.
        assert (await http.delete(f"{keyed_gateway}/v1/jobs/{job.json()['id']}",
                                  headers=hog)).status_code == 204
        await http.delete(f"{keyed_gateway}/v1/streams/{stream.json()['id']}", headers=hog)
        again = await http.post(f"{keyed_gateway}/v1/chat/completions", json=QUICK, headers=hog)
        assert again.status_code == 200


async def test_full_engine_queue_is_refused_at_once_as_429(
    lab: Lab, http: httpx.AsyncClient
) -> None:
    """Every engine full (with replicas, a gateway would send the request on to
    one with room, as it should): the gateway refuses at once."""
    capacity = TEST_ENGINE_RUNNING + TEST_ENGINE_QUEUED
    timing = pb.FakeModelTiming(prefill_ms=30_000, answer_tokens=1)
    async with contextlib.AsyncExitStack() as channels:
        stubs = [pb_grpc.EngineServiceStub(await channels.enter_async_context(
                     grpc.aio.insecure_channel(lab.engine_target_of(engine))))
                 for engine in lab.engine_names]
        calls = [stub.Generate(pb.GenerateRequest(prompt="x", timing=timing,
                                                  request_id=f"fill-{i}-{uuid.uuid4().hex[:6]}"))
                 for stub in stubs for i in range(capacity)]
        try:
            for call in calls:
                await call.initial_metadata()
            running = TEST_ENGINE_RUNNING * len(stubs)
            await wait_until_async(
                lambda: lab.engine_stats().generations_active >= running, timeout_s=5,
                what=f"{running} generations running (every engine full)")
            started = lab.engine_stats().generations_started
            for stub in stubs:
                over = stub.Generate(pb.GenerateRequest(prompt="x", timing=timing))
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await over.read()
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

            response = await http.post(url(lab), json=SLOW)
            assert response.status_code == 429
            assert "engine at capacity" in response.json()["error"]["message"]
            assert response.headers["retry-after"] == "1"
            assert lab.engine_stats().generations_started == started
        finally:
            for call in calls:
                call.cancel()


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"messages": [{"role": "user", "content": "x" * 200_000}]}, 400, "prompt_too_long"),
        ({"messages": [{"role": "user", "content": "x" * 1_500_000}]}, 413, "body_too_large"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**9}, 400,
         "invalid_argument"),
    ],
    ids=["prompt-too-long", "body-too-large", "absurd-max-tokens"],
)
async def test_oversized_requests_get_a_named_4xx(lab: Lab, http: httpx.AsyncClient,
                                                  body: dict[str, object], status: int,
                                                  code: str) -> None:
    response = await http.post(url(lab), json=body)
    assert response.status_code == status
    assert response.json()["error"]["code"] == code


async def test_an_unreachable_engine_is_a_503_that_names_no_internal_address(
    http: httpx.AsyncClient, extra_gateway: Callable[..., ExtraGateway]
) -> None:
    """The 503 said `ipv4:127.0.0.1:8473: Connection refused`."""
    nowhere = extra_gateway("gateway-no-engine",
                            STREAMLAB_GATEWAY_ENGINE_TARGET=f"127.0.0.1:{free_ports(1)[0]}")
    response = await http.post(f"{nowhere.url}/v1/chat/completions", json=QUICK)
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["type"] == "server_error"
    assert "127.0.0.1" not in error["message"]
    assert ":" + nowhere.url.rsplit(":", 1)[1] not in error["message"]
