"""The whole chain (edge → nginx → gateway → engine) with the engine on a real
transformers model: a tiny one with random weights, built by the fixtures."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import httpx
import pytest

from services.client.openai_stream import chat_body, stream_chat
from streamlab.lab import Lab
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from tests.integration.engine_probe import wait_for_generation_end
from tests.integration.hf_fixtures import LONG_ANSWER

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


def completions(lab: Lab) -> str:
    return f"{lab.edge_url}/v1/chat/completions"


async def test_a_real_model_streams_through_the_full_chain(
    hf_lab: Lab, http: httpx.AsyncClient
) -> None:
    body = {**chat_body("tell me about café owners", max_tokens=40),
            "stream_options": {"include_usage": True}}
    result = await stream_chat(http, completions(hf_lab), body)

    assert result.status == 200, result.error
    assert result.done
    assert result.error is None
    assert result.finish_reason == "length"  # the lab's engine ignores end-of-sequence
    assert result.usage is not None
    assert result.usage["completion_tokens"] == 40
    assert result.usage["prompt_tokens"] > 0
    assert 1 <= len(result.texts) <= 40  # a chunk holds the text of one or more tokens
    # Greedy decoding: the same answer as the non-streamed completion, token for token.
    whole = await http.post(completions(hf_lab), json={**body, "stream": False})
    assert whole.status_code == 200
    assert whole.json()["choices"][0]["message"]["content"] == result.text
    assert whole.json()["model"] == "tiny-llama"


async def test_a_client_that_leaves_stops_the_model(hf_lab: Lab, http: httpx.AsyncClient) -> None:
    rid = f"hf-leave-{uuid.uuid4().hex[:8]}"
    result = await stream_chat(http, completions(hf_lab),
                               chat_body("write an essay", max_tokens=LONG_ANSWER),
                               headers={"X-Request-Id": rid}, stop_after_tokens=3)
    assert result.closed_early, result.error

    record = wait_for_generation_end(hf_lab, rid, timeout_s=10)
    assert record.state == pb.GENERATION_STATE_CANCELLED
    assert record.tokens_after_cancel <= 1
    assert record.tokens_generated < LONG_ANSWER
    assert hf_lab.engine_stats().load.queue_waiting == 0


async def test_the_queue_is_visible_and_a_waiter_that_leaves_is_removed(
    hf_lab: Lab, http: httpx.AsyncClient
) -> None:
    first, second = (f"hf-q{n}-{uuid.uuid4().hex[:8]}" for n in (1, 2))
    started = asyncio.Event()
    holder = asyncio.create_task(stream_chat(
        http, completions(hf_lab), chat_body("hold the model", max_tokens=LONG_ANSWER),
        headers={"X-Request-Id": first}, on_token=lambda _: started.set()))
    waiter: asyncio.Task[object] | None = None
    try:
        async with asyncio.timeout(10):
            await started.wait()
        waiter = asyncio.create_task(stream_chat(
            http, completions(hf_lab), chat_body("wait for it", max_tokens=5),
            headers={"X-Request-Id": second}))
        await _until(lambda: hf_lab.engine_stats().load.queue_waiting == 1)
        load = hf_lab.engine_stats().load
        assert (load.running, load.running_limit, load.queue_limit) == (1, 1, 2)

        waiter.cancel()  # the client closes its connection while it waits
        await _until(lambda: hf_lab.engine_stats().load.queue_waiting == 0)
        # It left before reaching the model: no generation was ever started for it.
        assert not hf_lab.engine_stats(second).generations
        assert hf_lab.engine_stats(first).generations[0].state == pb.GENERATION_STATE_RUNNING
    finally:
        for task in (holder, waiter):
            if task is not None:
                task.cancel()
        await asyncio.gather(holder, *([waiter] if waiter else []), return_exceptions=True)
    await asyncio.to_thread(wait_for_generation_end, hf_lab, first)


async def _until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while True:
            if await asyncio.to_thread(condition):
                return
            await asyncio.sleep(0.02)
