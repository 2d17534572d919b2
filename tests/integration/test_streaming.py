"""The chain end to end: client → edge → nginx → upstream → gateway → engine."""

from __future__ import annotations

import statistics
import time
import uuid
from dataclasses import dataclass

import anyio
import httpx
import pytest

from services.client.openai_stream import StreamResult, chat_body, stream_chat
from streamlab.lab.local import Lab
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from tests.integration.conftest import TEST_HEARTBEAT_S
from tests.integration.engine_probe import wait_for_generation_end
from tests.wait import wait_until_async

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

PREFILL_MS, GAP_MS, TOKENS = 300, 50, 20


def completions(base: str, location: str = "/") -> str:
    return f"{base}{location.rstrip('/')}/v1/chat/completions"


async def test_tokens_stream_through_the_full_chain(lab: Lab, http: httpx.AsyncClient) -> None:
    body = chat_body("hello", prefill_ms=PREFILL_MS, token_gap_ms=GAP_MS, answer_tokens=TOKENS)
    result = await stream_chat(http, completions(lab.edge_url), body)

    assert result.status == 200, result.error
    assert result.error is None
    assert result.done, "the stream must end with data: [DONE]"
    assert len(result.texts) == TOKENS
    assert result.ttft_s is not None
    # The first token comes right after prefill + one gap, not near the end.
    assert PREFILL_MS / 1000 <= result.ttft_s < (PREFILL_MS + 4 * GAP_MS) / 1000
    assert result.ttft_s < 0.5 * result.total_s
    gaps = [b - a for a, b in zip(result.token_times, result.token_times[1:], strict=False)]
    # Tokens arrive one gap apart (a relay that batched them would show ~0);
    # wide bounds, since the machine may be busy.
    assert 0.5 * GAP_MS / 1000 <= statistics.median(gaps) <= 2 * GAP_MS / 1000

    # Same text, same order, as the whole (non-streamed) completion of the request.
    whole = await http.post(completions(lab.gateway_url),
                            json={**body, "stream": False})
    assert whole.status_code == 200
    assert result.text == whole.json()["choices"][0]["message"]["content"]
    assert result.finish_reason == whole.json()["choices"][0]["finish_reason"] == "stop"


async def test_buffered_location_holds_the_stream_back_to_one_lump(
    lab: Lab, http: httpx.AsyncClient
) -> None:
    """The classic first bug: behind nginx's defaults (buffering on, gzip on) a
    stream of tokens arrives all at once, at the end."""
    body = chat_body("hello", prefill_ms=PREFILL_MS, token_gap_ms=GAP_MS, answer_tokens=TOKENS)
    buffered = await stream_chat(http, completions(lab.edge_url, "/buffered/"), body,
                                 headers={"Accept-Encoding": "gzip"})
    fixed = await stream_chat(http, completions(lab.edge_url, "/"), body,
                              headers={"Accept-Encoding": "gzip"})

    for result in (buffered, fixed):
        assert result.done
        assert len(result.texts) == TOKENS
    assert buffered.first_byte_s is not None
    assert buffered.ttft_s is not None
    # Broken: nothing at all until ≥ 90 % of the total, then every token at once.
    assert buffered.first_byte_s >= 0.9 * buffered.total_s
    assert buffered.token_times[-1] - buffered.token_times[0] < 0.1 * buffered.total_s
    # Fixed, same compression: tokens spread over the generation.
    assert fixed.ttft_s is not None
    assert fixed.ttft_s < 0.5 * fixed.total_s
    assert fixed.token_times[-1] - fixed.token_times[0] > 0.5 * fixed.total_s


async def test_client_close_cancels_the_generation_at_the_engine(
    lab: Lab, http: httpx.AsyncClient
) -> None:
    request_id = f"close-{uuid.uuid4().hex[:8]}"
    body = chat_body("write an essay", prefill_ms=50, token_gap_ms=GAP_MS, answer_tokens=200)
    result = await stream_chat(http, completions(lab.edge_url), body,
                               headers={"X-Request-Id": request_id}, stop_after_tokens=3)
    closed_at = time.monotonic()
    assert result.closed_early
    assert len(result.texts) == 3

    record = await anyio.to_thread.run_sync(wait_for_generation_end, lab, request_id)

    assert record.state == pb.GENERATION_STATE_CANCELLED
    assert record.tokens_after_cancel <= 1
    # Stopped within a few decode steps of the close, nowhere near 200 tokens.
    assert record.tokens_generated < 3 + 10
    # When the engine heard, on its own clock (CLOCK_MONOTONIC, as ours).
    assert record.cancelled_at - closed_at < 2.0


async def test_silent_prefill_notices_the_disconnect(lab: Lab, http: httpx.AsyncClient) -> None:
    """No token has been written yet, so no failed write can reveal the close:
    the gateway must learn of it from the connection itself."""
    request_id = f"prefill-{uuid.uuid4().hex[:8]}"
    body = chat_body("slow start", prefill_ms=20_000, token_gap_ms=GAP_MS, answer_tokens=5)
    with anyio.move_on_after(0.5):
        await stream_chat(http, completions(lab.edge_url), body,
                          headers={"X-Request-Id": request_id})
    record = await anyio.to_thread.run_sync(wait_for_generation_end, lab, request_id, 3.0)
    assert record.state == pb.GENERATION_STATE_CANCELLED
    assert record.tokens_generated == 0


async def test_think_pause_is_filled_with_heartbeats(lab: Lab, http: httpx.AsyncClient) -> None:
    pause_s = 3.0
    body = chat_body("think", prefill_ms=50, token_gap_ms=GAP_MS, answer_tokens=5,
                     pauses=[{"after_token": 1, "pause_ms": int(pause_s * 1000)}])
    # Through the location with a 2 s idle timeout: without pings nginx would
    # cut this stream in the middle of the pause.
    result = await stream_chat(http, completions(lab.edge_url, "/short-timeout/"), body)

    assert result.done
    assert result.error is None
    assert len(result.texts) == 5
    silent_from, silent_to = result.token_times[1], result.token_times[2]
    assert silent_to - silent_from >= 0.9 * pause_s
    pings = [t for t in result.ping_times if silent_from < t < silent_to]
    assert len(pings) >= int(pause_s / TEST_HEARTBEAT_S) - 2
    assert max(b - a for a, b in zip([silent_from, *pings], [*pings, silent_to],
                                     strict=True)) < 2 * TEST_HEARTBEAT_S


async def test_engine_down_is_a_clear_error_not_a_hang(lab: Lab, http: httpx.AsyncClient) -> None:
    body = chat_body("anyone there?", prefill_ms=10, token_gap_ms=10, answer_tokens=3)
    for engine in lab.engine_names:  # every one: a second engine would answer
        await anyio.to_thread.run_sync(lab.stop_service, engine)
    try:
        started = time.monotonic()
        result = await stream_chat(http, completions(lab.edge_url), body)
        elapsed = time.monotonic() - started
        assert result.status == 503
        assert result.error is not None
        assert "engine" in result.error["message"]
        assert elapsed < 5.0
    finally:
        for engine in lab.engine_names:
            await anyio.to_thread.run_sync(lab.start_service, engine)

    # A restarted engine serves again without restarting the gateway: the first
    # try after the restart does, locally and on compose (8 of 8 there, 0.05 s).
    # The bound is for a loaded CI machine, where a restarted container's network
    # has come back late once (compose pass, 2026-12-06); the failure names the
    # last answer seen, not only that none was a 200.
    async def served() -> Answer:
        return Answer(await stream_chat(http, completions(lab.edge_url), body))
    again = await wait_until_async(served, timeout_s=30, interval_s=0.1,
                                   what="a stream served (200) by the restarted engine")
    assert again.result.done
    assert len(again.result.texts) == 3


@dataclass(frozen=True)
class Answer:
    """One try's answer: true when it was served (200); shown by its status and error."""

    result: StreamResult

    def __bool__(self) -> bool:
        return self.result.status == 200

    def __repr__(self) -> str:
        return f"status {self.result.status}, error {self.result.error}"


async def test_bad_request_gets_a_400_that_names_the_field(
    lab: Lab, http: httpx.AsyncClient
) -> None:
    response = await http.post(completions(lab.edge_url),
                               json={"stream": True, "messages": "not a list"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "messages"
    assert error["type"] == "invalid_request_error"
