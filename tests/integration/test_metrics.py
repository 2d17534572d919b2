"""Both /metrics endpoints count what really went through the lab: streams
through the edge show up in the gateway's latency histograms and the engine's
step, queue and outcome figures, with values the fake model's timing allows.

Figures are deltas between two scrapes: the lab is shared by the session."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.client.openai_stream import chat_body, stream_chat
from streamlab.lab.target import LabTarget
from tests.integration.conftest import ENGINE_WIRE
from tests.integration.engine_probe import ended
from tests.wait import wait_until_async

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

PREFILL_S, GAP_S, TOKENS, STREAMS = 0.2, 0.02, 10, 3
# How much later than the model's own timing a figure may be on a busy 2-core
# machine (every hop is a process of its own).
SLACK_S = 1.0

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(http: httpx.AsyncClient, urls: list[str]) -> Samples:
    """Every replica's samples, summed (with replicas a stream may go to any)."""
    total: Samples = {}
    for url in urls:
        response = await http.get(url)
        response.raise_for_status()
        for family in text_string_to_metric_families(response.text):
            for s in family.samples:
                key = (s.name, frozenset(s.labels.items()))
                total[key] = total.get(key, 0.0) + s.value
    return total


def delta(before: Samples, after: Samples) -> Callable[..., float]:
    def figure(name: str, **labels: str) -> float:
        key = (name, frozenset(labels.items()))
        return after.get(key, 0.0) - before.get(key, 0.0)
    return figure


def urls(lab: LabTarget) -> tuple[list[str], list[str]]:
    """Every gateway's /metrics and every engine's."""
    return ([f"{lab.url_of(gateway)}/metrics" for gateway in lab.gateway_names],
            [lab.engine_metrics_url_of(engine) for engine in lab.engine_names])


def body() -> dict[str, object]:
    return chat_body("count me", prefill_ms=int(PREFILL_S * 1000),
                     token_gap_ms=int(GAP_S * 1000), answer_tokens=TOKENS)


async def test_streams_through_the_edge_fill_both_metrics_endpoints(
        lab: LabTarget, http: httpx.AsyncClient) -> None:
    gateway_url, engine_url = urls(lab)
    gw0, en0 = await scrape(http, gateway_url), await scrape(http, engine_url)
    completions = f"{lab.edge_url}/v1/chat/completions"
    rids = [f"metrics-{uuid.uuid4().hex[:8]}" for _ in range(STREAMS)]

    async def one(rid: str) -> None:
        await stream_chat(http, completions, body(), headers={"X-Request-Id": rid})

    async with anyio.create_task_group() as tasks:
        for rid in rids:
            tasks.start_soon(one, rid)
    for rid in rids:
        # The engine ends its record just after the finish has left: wait for it.
        ended(lab.engine_stats, rid)
    gw1, en1 = await scrape(http, gateway_url), await scrape(http, engine_url)
    gw, en = delta(gw0, gw1), delta(en0, en1)

    # Gateway: one TTFT per stream, never shorter than the prefill.
    assert gw("streamlab_gateway_ttft_seconds_count", surface="sse") == STREAMS
    ttft_sum = gw("streamlab_gateway_ttft_seconds_sum", surface="sse")
    assert STREAMS * PREFILL_S <= ttft_sum <= STREAMS * (PREFILL_S + SLACK_S), ttft_sum
    assert gw("streamlab_gateway_ttft_seconds_bucket", surface="sse", le="0.1") == 0
    # A gap between each pair of tokens. A busy machine may delay a first token
    # and bunch the rest, but no token comes before the model's schedule: the
    # last at prefill + TOKENS gaps (1 ms: the clock's slack).
    gaps = STREAMS * (TOKENS - 1)
    assert gw("streamlab_gateway_token_gap_seconds_count", surface="sse") == gaps
    gap_sum = gw("streamlab_gateway_token_gap_seconds_sum", surface="sse")
    assert gap_sum <= gaps * GAP_S + STREAMS * SLACK_S, gap_sum
    assert ttft_sum + gap_sum >= STREAMS * (PREFILL_S + TOKENS * GAP_S - 0.001)
    # Each stream's whole life: at least its prefill and its tokens.
    assert gw("streamlab_gateway_stream_duration_seconds_count", surface="sse") == STREAMS
    assert (gw("streamlab_gateway_stream_duration_seconds_sum", surface="sse")
            >= STREAMS * (PREFILL_S + (TOKENS - 1) * GAP_S * 0.5))
    assert gw("streamlab_gateway_cancel_latency_seconds_count", surface="sse") == 0

    # Engine: every generation waited for a slot once and completed; every token
    # the model made was made in exactly one decode step.
    assert en("streamlab_engine_generations_total", outcome="completed") == STREAMS
    assert en("streamlab_engine_queue_wait_seconds_count") == STREAMS
    made = en("streamlab_engine_tokens_generated_total")
    assert made == STREAMS * TOKENS
    assert en("streamlab_engine_decode_batch_size_sum") == made
    steps = en("streamlab_engine_decode_step_seconds_count")
    assert steps > 0
    # The streams share the clock's grid, so a busy clock steps about once a gap.
    mean_step = en("streamlab_engine_decode_step_seconds_sum") / steps
    assert 0.5 * GAP_S <= mean_step <= GAP_S + 0.05, mean_step


async def test_the_gateways_reach_the_engines_on_the_wire_the_run_asked_for(
        lab: LabTarget, http: httpx.AsyncClient) -> None:
    """The suite runs on either engine wire (STREAMLAB_GATEWAY_ENGINE_WIRE; CI's
    compose run on the per_request one): a run that meant one wire and tested the
    other would prove nothing about it. The engines count Session calls open."""
    _, engine_urls = urls(lab)
    # One stream per engine at least, so every gateway-engine pair is used
    # (with replicas a stream may land on any).
    for _ in range(2 * len(engine_urls)):
        result = await stream_chat(http, f"{lab.edge_url}/v1/chat/completions",
                                   chat_body("which wire", answer_tokens=2))
        assert result.done, result.error

    async def sessions() -> float:
        return (await scrape(http, engine_urls)).get(("streamlab_engine_sessions",
                                                      frozenset()), 0.0)

    if ENGINE_WIRE == "multiplexed":
        # A gateway's Session stays open while it runs.
        assert await sessions() >= 1, "no Session open: the gateways speak per_request"
    else:
        # Another test may have run gateways on the other wire against these
        # engines (bench cancel --wire both): their Sessions end with them.
        async def none_open() -> bool:
            return await sessions() == 0

        await wait_until_async(none_open, timeout_s=15.0,
                               what="no Session open on a per_request lab")


async def test_a_client_that_leaves_is_one_cancel_latency_and_one_cancelled_generation(
        lab: LabTarget, http: httpx.AsyncClient) -> None:
    gateway_url, engine_url = urls(lab)
    gw0, en0 = await scrape(http, gateway_url), await scrape(http, engine_url)
    rid = f"metrics-cancel-{uuid.uuid4().hex[:8]}"
    # A prefill longer than the bound: a cancel timed from the wrong start fails it.
    answer = chat_body("leave early", prefill_ms=400, token_gap_ms=20, answer_tokens=200)
    result = await stream_chat(http, f"{lab.edge_url}/v1/chat/completions", answer,
                               headers={"X-Request-Id": rid}, stop_after_tokens=3)
    assert result.left_at is not None
    record = ended(lab.engine_stats, rid)
    # The gateway times the cancel when its close runs: poll for it.
    async def cancel_timed() -> Callable[..., float] | None:
        gw = delta(gw0, await scrape(http, gateway_url))
        return gw if gw("streamlab_gateway_cancel_latency_seconds_count", surface="sse") else None
    gw = await wait_until_async(cancel_timed, timeout_s=5.0, interval_s=0.02,
                                what="the gateway to time the SSE stream's cancel")
    en = delta(en0, await scrape(http, engine_url))

    assert gw("streamlab_gateway_cancel_latency_seconds_count", surface="sse") == 1
    # From the disconnect reaching the gateway to the call cancelled: the same
    # event-loop turn in a healthy gateway, far under the token gap.
    assert gw("streamlab_gateway_cancel_latency_seconds_sum", surface="sse") <= 0.25
    assert en("streamlab_engine_generations_total", outcome="cancelled") == 1
    assert en("streamlab_engine_tokens_after_cancel_total") == record.tokens_after_cancel <= 1
