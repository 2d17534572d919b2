"""Slow readers: flow control pauses the engine, the send timeout frees it, and
the gateway's memory stays bounded; the detached relay shows the opposite."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from services.client.openai_stream import chat_body, stream_chat
from services.client.silent import open_silent_reader
from streamlab.experiments.bench import slow_readers
from streamlab.lab.local import Lab
from streamlab.lab.toxiproxy import Toxic
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from tests.integration.conftest import TEST_SEND_TIMEOUT_S

pytestmark = pytest.mark.integration


def flood(answer: int, relay: str = "direct") -> dict[str, object]:
    """As fast as the engine can go: the kernel's send buffers (several MiB,
    autotuned) fill in a second or two instead of a minute."""
    return chat_body("flood", prefill_ms=0, token_gap_ms=0, answer_tokens=answer,
                     max_tokens=answer, relay=relay)


def test_stopped_reader_pauses_the_engine_then_the_send_timeout_cancels_it(lab: Lab) -> None:
    rid = f"silent-{uuid.uuid4().hex[:8]}"
    answer = 100_000
    # Straight at the gateway: through the whole chain the same proof needs tens
    # of MiB (every hop's autotuned kernel buffers, nginx, Toxiproxy) before the
    # engine feels it; see docs/cancellation-and-backpressure.md.
    sock = open_silent_reader(lab.ports.host, lab.ports.gateway_port, "/v1/chat/completions",
                              flood(answer),
                              headers={"X-Request-Id": rid})
    samples: list[tuple[float, int]] = []
    try:
        deadline = time.monotonic() + 60
        record = None
        while time.monotonic() < deadline:
            records = lab.engine_stats(rid).generations
            if records:
                record = records[0]
                samples.append((time.monotonic(), record.tokens_generated))
                if record.state != pb.GENERATION_STATE_RUNNING:
                    break
            time.sleep(0.1)
    finally:
        sock.close()
    assert record is not None
    assert record.state == pb.GENERATION_STATE_CANCELLED, record
    assert record.tokens_generated < answer
    # Before the cancel, generation stood still: flow control paused the engine
    # for (about) the send timeout, rather than the tokens piling up somewhere.
    last = samples[-1][1]
    stalled_since = min(t for t, n in samples if n == last)
    stalled_for = samples[-1][0] - stalled_since
    print(f"paused at {last} tokens for {stalled_for:.1f} s, then cancelled")
    assert stalled_for >= TEST_SEND_TIMEOUT_S * 0.5


def test_silent_readers_keep_gateway_memory_bounded_unlike_the_detached_relay(lab: Lab) -> None:
    if lab.pids is None:
        pytest.skip("reads the gateway process's RSS from the host by pid; the compose "
                    "lab's gateway runs in a container (STREAMLAB_TARGET=compose)")
    # 20 fit under the suite's per-client stream cap (25); 50 and more run in
    # `streamlab bench slow-readers` on a lab with the default caps (64).
    clients, answer = 20, 6000
    direct = slow_readers.measure(lab, "direct", clients, answer)
    detached = slow_readers.measure(lab, "detached_unbounded", clients, answer)
    direct_mb, direct_tokens = direct.growth_mb, direct.tokens_generated
    detached_mb, detached_tokens = detached.growth_mb, detached.tokens_generated
    print(f"{clients} silent readers: direct relay +{direct_mb:.1f} MiB RSS "
          f"({direct_tokens} tokens generated, {dict(direct.states)}); detached relay "
          f"+{detached_mb:.1f} MiB ({detached_tokens} tokens generated, "
          f"{dict(detached.states)})")
    assert not direct.timed_out
    assert not detached.timed_out
    # Direct: every engine stopped early (paused, then cut by the send timeout).
    assert direct_tokens < clients * answer * 0.75
    assert direct_mb < 25
    # Detached: the engine ran on for readers who took nothing (every answer in
    # full, on an unloaded machine), and the gateway held it all in memory.
    assert detached_tokens > 2 * direct_tokens
    assert detached_mb > direct_mb


@pytest.mark.anyio
async def test_reader_throttled_by_a_bandwidth_toxic_still_gets_every_token_in_order(
    lab: Lab,
) -> None:
    body = chat_body("hello", prefill_ms=10, token_gap_ms=2, answer_tokens=150)
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as http:
        url = f"{lab.gateway_url}/v1/chat/completions"
        reference = await stream_chat(http, url, body)
        client = lab.toxiproxy()
        try:
            # 8 KB/s to the client: ~35 KB of events take ~4 s instead of 0.3 s.
            client.add_toxic("edge", Toxic("bandwidth", {"rate": 8}))
        finally:
            client.close()
        throttled = await stream_chat(http, f"{lab.edge_url}/v1/chat/completions", body,
                                      headers={"Accept-Encoding": "identity"})
    assert reference.done
    assert throttled.done
    assert throttled.error is None
    assert throttled.texts == reference.texts
    assert throttled.total_s > 3 * reference.total_s
