"""The whole chain (edge → nginx → gateway → engine) with the engine on a real
transformers model: a tiny one with random weights, built by the fixtures."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import httpx
import pytest

from services.client.openai_stream import chat_body, stream_chat
from streamlab.lab.local import Lab
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from tests.integration.engine_probe import wait_for_generation_end
from tests.integration.hf_fixtures import LONG_ANSWER
from tests.wait import wait_until_async

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
    """Two holders fill the batch (STREAMLAB_HF_MAX_BATCH=2); the third waits."""
    holders_ids = [f"hf-hold{n}-{uuid.uuid4().hex[:8]}" for n in (1, 2)]
    waiter_id = f"hf-wait-{uuid.uuid4().hex[:8]}"
    started = [asyncio.Event() for _ in holders_ids]
    holders = [asyncio.create_task(stream_chat(
        http, completions(hf_lab), chat_body("hold the model", max_tokens=LONG_ANSWER),
        headers={"X-Request-Id": rid}, on_token=_setter(event)))
        for rid, event in zip(holders_ids, started, strict=True)]
    waiter: asyncio.Task[object] | None = None
    try:
        async with asyncio.timeout(10):
            for event in started:
                await event.wait()
        waiter = asyncio.create_task(stream_chat(
            http, completions(hf_lab), chat_body("wait for it", max_tokens=5),
            headers={"X-Request-Id": waiter_id}))
        # GetStats from a thread: the waiter's stream runs on this loop meanwhile.
        await wait_until_async(
            lambda: asyncio.to_thread(lambda: hf_lab.engine_stats().load.queue_waiting == 1),
            timeout_s=10.0, interval_s=0.02, what="the third request waiting in the queue")
        load = hf_lab.engine_stats().load
        assert (load.running, load.running_limit, load.queue_limit) == (2, 2, 2)

        waiter.cancel()  # the client closes its connection while it waits
        await wait_until_async(
            lambda: asyncio.to_thread(lambda: hf_lab.engine_stats().load.queue_waiting == 0),
            timeout_s=10.0, interval_s=0.02, what="the cancelled waiter gone from the queue")
        # It left before reaching the model: no generation was ever started for it.
        assert not hf_lab.engine_stats(waiter_id).generations
        for rid in holders_ids:
            assert hf_lab.engine_stats(rid).generations[0].state == pb.GENERATION_STATE_RUNNING
    finally:
        tasks = [*holders, *([waiter] if waiter else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for rid in holders_ids:
        await asyncio.to_thread(wait_for_generation_end, hf_lab, rid)


def _setter(event: asyncio.Event) -> Callable[[str], None]:
    return lambda _: event.set()

