"""The engine's `openai` backend against a real OpenAI-compatible server: a
second streamlab gateway + engine (tests/integration/upstream_fixtures.py)."""

from __future__ import annotations

import uuid

import grpc
import httpx
import pytest

from services.client.openai_stream import chat_body, stream_chat
from services.engine.backends.fake import token_text
from services.engine.settings import EngineSettings, OpenAIUpstreamSettings
from streamlab.lab.local import Lab
from streamlab.lab.processes import free_ports
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from tests.integration.engine_inproc import running_engine
from tests.integration.engine_probe import ended, wait_for_generation_end
from tests.integration.upstream_fixtures import UPSTREAM_MAX_TOKENS, UpstreamPair

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


def completions(lab: Lab) -> str:
    return f"{lab.edge_url}/v1/chat/completions"


async def test_upstream_tokens_and_usage_come_through_both_gateways(
    openai_lab: Lab, upstream_pair: UpstreamPair, http: httpx.AsyncClient
) -> None:
    rid = f"up-{uuid.uuid4().hex[:8]}"
    body = {**chat_body("hello there", prefill_ms=50, token_gap_ms=10, answer_tokens=12),
            "stream_options": {"include_usage": True}}
    result = await stream_chat(http, completions(openai_lab), body,
                               headers={"X-Request-Id": rid})

    assert result.status == 200, result.error
    assert result.done
    assert result.error is None
    assert result.texts == [token_text(i) for i in range(12)]  # the inner fake's words
    assert result.finish_reason == "stop"
    assert result.usage == {"prompt_tokens": 2, "completion_tokens": 12, "total_tokens": 14}
    # The request id travelled upstream: the inner engine ran this very generation.
    inner = upstream_pair.engine_stats(rid).generations
    assert inner
    assert inner[0].state == pb.GENERATION_STATE_COMPLETED
    assert inner[0].tokens_generated == 12


async def test_the_upstreams_length_limit_is_reported_as_length(
    openai_lab: Lab, http: httpx.AsyncClient
) -> None:
    body = chat_body("hello", max_tokens=5, prefill_ms=10, token_gap_ms=5, answer_tokens=50)
    result = await stream_chat(http, completions(openai_lab), body)
    assert result.done, result.error
    assert len(result.texts) == 5
    assert result.finish_reason == "length"


async def test_an_upstream_refusal_maps_to_the_same_http_status(
    openai_lab: Lab, http: httpx.AsyncClient
) -> None:
    """The outer engine accepts 2000 tokens; the upstream refuses more than 1000 with
    400, which must reach the client as 400 with the upstream's reason."""
    body = chat_body("hello", max_tokens=2 * UPSTREAM_MAX_TOKENS)
    result = await stream_chat(http, completions(openai_lab), body)
    assert result.status == 400
    assert result.error is not None
    assert f"exceeds the limit {UPSTREAM_MAX_TOKENS}" in result.error["message"]


async def test_a_client_that_leaves_closes_the_upstream_stream_at_once(
    openai_lab: Lab, upstream_pair: UpstreamPair, http: httpx.AsyncClient
) -> None:
    rid = f"up-leave-{uuid.uuid4().hex[:8]}"
    body = chat_body("write an essay", prefill_ms=50, token_gap_ms=20, answer_tokens=300)
    result = await stream_chat(http, completions(openai_lab), body,
                               headers={"X-Request-Id": rid}, stop_after_tokens=3)
    assert result.closed_early, result.error

    outer = wait_for_generation_end(openai_lab, rid)
    inner = ended(upstream_pair.engine_stats, rid)
    assert outer.state == pb.GENERATION_STATE_CANCELLED
    assert inner.state == pb.GENERATION_STATE_CANCELLED
    # Both engines stamp CLOCK_MONOTONIC: the outer engine's cancel to the upstream
    # model's cancel is the backend closing its HTTP stream plus the upstream
    # gateway noticing. Milliseconds here; 1 s is the tolerance of a busy machine.
    hop_s = inner.cancelled_at - outer.cancelled_at
    print(f"outer cancel → upstream cancel: {hop_s * 1000:.1f} ms")
    assert hop_s < 1.0
    assert inner.tokens_after_cancel <= 1
    assert inner.tokens_generated < 300 // 2


async def test_an_upstream_that_dies_mid_stream_is_an_error_event(
    openai_lab: Lab, upstream_pair: UpstreamPair, http: httpx.AsyncClient
) -> None:
    seen: list[str] = []

    def on_token(text: str) -> None:
        seen.append(text)
        if len(seen) == 3:
            upstream_pair.stop("upstream-engine", grace_s=0)  # the upstream's model dies

    body = chat_body("hello", prefill_ms=10, token_gap_ms=50, answer_tokens=200)
    try:
        result = await stream_chat(http, completions(openai_lab), body, on_token=on_token)
    finally:
        upstream_pair.start("upstream-engine")
    assert result.status == 200
    assert len(result.texts) >= 3
    assert not result.done, "a cut answer must not end with [DONE]"
    assert result.error is not None
    assert "upstream" in result.error["message"]


async def test_unreachable_and_unknown_upstreams_map_to_grpc_statuses(
    upstream_pair: UpstreamPair,
) -> None:
    """Straight at the engine's gRPC API: a closed port is UNAVAILABLE (the
    gateway's 503); a path the upstream does not serve is its 404, NOT_FOUND."""
    (closed,) = free_ports(1)
    cases = {
        f"http://127.0.0.1:{closed}/v1": grpc.StatusCode.UNAVAILABLE,
        f"http://127.0.0.1:{upstream_pair.gateway_port}/nope/v1": grpc.StatusCode.NOT_FOUND,
    }
    for base_url, status in cases.items():
        settings = EngineSettings(backend="openai",
                                  openai=OpenAIUpstreamSettings(base_url=base_url))
        async with running_engine(settings) as stub:
            with pytest.raises(grpc.aio.AioRpcError) as error:
                async for _ in stub.Generate(pb.GenerateRequest(prompt="hi"), timeout=10):
                    pass
        assert error.value.code() == status, error.value.details()
