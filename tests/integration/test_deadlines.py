"""Per-stream deadlines on the engine hop end a stream with a clean error event."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import anyio
import httpx
import pytest

from services.client.openai_stream import chat_body, stream_chat
from streamlab.lab.local import Lab
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from tests.integration.conftest import TEST_ENGINE_IDLE_S, ExtraGateway
from tests.integration.engine_probe import wait_for_generation_end

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def test_silent_engine_past_the_idle_deadline_gets_an_error_event(
    lab: Lab, http: httpx.AsyncClient
) -> None:
    rid = f"idle-{uuid.uuid4().hex[:6]}"
    pause_ms = int((TEST_ENGINE_IDLE_S + 3) * 1000)
    body = chat_body("think hard", prefill_ms=10, token_gap_ms=10, answer_tokens=3,
                     pauses=[{"after_token": 0, "pause_ms": pause_ms}])
    result = await stream_chat(http, f"{lab.edge_url}/v1/chat/completions", body,
                               headers={"X-Request-Id": rid})
    assert result.status == 200
    assert not result.done
    assert result.error is not None
    assert result.error["code"] == "engine_idle_timeout"
    assert len(result.texts) == 1
    assert TEST_ENGINE_IDLE_S <= result.total_s < TEST_ENGINE_IDLE_S + 3
    record = await anyio.to_thread.run_sync(wait_for_generation_end, lab, rid)
    assert record.state == pb.GENERATION_STATE_CANCELLED


async def test_a_stream_past_its_total_deadline_gets_an_error_event(
    lab: Lab, http: httpx.AsyncClient, extra_gateway: Callable[..., ExtraGateway]
) -> None:
    """The total deadline shares the idle deadline's code path; its own bound is
    checked on a gateway of its own (the suite's is 40 s)."""
    max_s = 1.5
    short = (await anyio.to_thread.run_sync(
        lambda: extra_gateway("gateway-deadline",
                              STREAMLAB_GATEWAY_MAX_STREAM_DURATION_S=str(max_s)))).url
    rid = f"deadline-{uuid.uuid4().hex[:6]}"
    answer = 200  # 4 s of tokens: the deadline falls in the middle
    body = chat_body("go on", prefill_ms=0, token_gap_ms=20, answer_tokens=answer)
    result = await stream_chat(http, f"{short}/v1/chat/completions", body,
                               headers={"X-Request-Id": rid})
    assert result.status == 200
    assert not result.done
    assert result.error is not None
    assert result.error["code"] == "stream_deadline"
    assert 1 <= len(result.texts) < answer
    assert max_s <= result.total_s < max_s + 2
    record = await anyio.to_thread.run_sync(wait_for_generation_end, lab, rid)
    assert record.state == pb.GENERATION_STATE_CANCELLED
