"""Load shedding: past a cap, a clear refusal before the first byte and before
anything starts at the engine."""

from __future__ import annotations

import contextlib
import uuid

import anyio
import grpc
import httpx
import pytest

from services.client.openai_stream import chat_body
from streamlab.lab import Lab
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.engine.v1 import engine_pb2_grpc as pb_grpc
from tests.integration.conftest import (
    TEST_ENGINE_QUEUED,
    TEST_ENGINE_RUNNING,
    TEST_PER_CLIENT_STREAMS,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

SLOW = chat_body("hold the line", prefill_ms=30_000, answer_tokens=1)


def url(lab: Lab) -> str:
    return f"{lab.edge_url}/v1/chat/completions"


async def test_per_client_stream_cap_answers_429_and_spares_other_clients(
    lab: Lab, http: httpx.AsyncClient
) -> None:
    async with contextlib.AsyncExitStack() as held:
        for _ in range(TEST_PER_CLIENT_STREAMS):
            response = await held.enter_async_context(
                http.stream("POST", url(lab), json=SLOW, headers={"X-Client-Id": "hog"}))
            assert response.status_code == 200
        rid = f"refused-{uuid.uuid4().hex[:8]}"
        refused = await http.post(url(lab), json=SLOW,
                                  headers={"X-Client-Id": "hog", "X-Request-Id": rid})
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "too_many_streams"
        assert not lab.engine_stats(rid).generations  # nothing started at the engine

        other = await http.post(url(lab), json={**chat_body("hi", prefill_ms=1,
                                                            token_gap_ms=1, answer_tokens=2),
                                                "stream": False},
                                headers={"X-Client-Id": "polite"})
        assert other.status_code == 200
    # Closing the held streams gives the slots back.
    with anyio.fail_after(10):
        while True:
            again = await http.post(url(lab), json={**chat_body(
                "hi", prefill_ms=1, token_gap_ms=1, answer_tokens=2), "stream": False},
                headers={"X-Client-Id": "hog"})
            if again.status_code == 200:
                break
            await anyio.sleep(0.05)


async def test_full_engine_queue_is_refused_at_once_as_429(
    lab: Lab, http: httpx.AsyncClient
) -> None:
    capacity = TEST_ENGINE_RUNNING + TEST_ENGINE_QUEUED
    async with grpc.aio.insecure_channel(lab.engine_target) as channel:
        stub = pb_grpc.EngineServiceStub(channel)
        timing = pb.FakeModelTiming(prefill_ms=30_000, answer_tokens=1)
        calls = [stub.Generate(pb.GenerateRequest(prompt="x", timing=timing,
                                                  request_id=f"fill-{i}-{uuid.uuid4().hex[:6]}"))
                 for i in range(capacity)]
        try:
            for call in calls:
                await call.initial_metadata()
            with anyio.fail_after(5):
                while lab.engine_stats().generations_active < TEST_ENGINE_RUNNING:  # noqa: ASYNC110 - polling another process
                    await anyio.sleep(0.05)
            started = lab.engine_stats().generations_started
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
