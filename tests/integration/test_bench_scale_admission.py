"""Set-up admission on a real gateway (services/gateway/admission.py): a burst
of new streams at a gateway admitting 5 set-ups a second is spaced out at that
rate and what cannot start within the longest wait is refused with 503 and
Retry-After before anything started; the same burst at a gateway without
admission (the broken mode, rate 0) is set up all at once. The burst goes
straight at each gateway (the raw-socket load generator), so the spacing is
the gateway's own."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from services.client.openai_stream import chat_body
from streamlab.experiments.bench.load import LoadResult, run_load
from streamlab.lab import processes
from streamlab.lab.local import Lab
from tests.integration.conftest import start_extra_gateway

pytestmark = pytest.mark.integration

RATE, MAX_WAIT_S, BURST = 5.0, 1.0, 20


@pytest.fixture(scope="module")
def gateways(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    logs = tmp_path_factory.mktemp("admission")
    on = start_extra_gateway(lab, logs, "gateway-admission-on",
                             STREAMLAB_GATEWAY_ADMISSION_RATE_PER_S=f"{RATE:g}",
                             STREAMLAB_GATEWAY_ADMISSION_MAX_WAIT_S=f"{MAX_WAIT_S:g}")
    try:
        off = start_extra_gateway(lab, logs, "gateway-admission-off",
                                  STREAMLAB_GATEWAY_ADMISSION_RATE_PER_S="0")
        try:
            yield {"on": on.url, "off": off.url}
        finally:
            processes.stop(off.process, grace_s=15.0)
    finally:
        processes.stop(on.process, grace_s=15.0)


def burst(url: str) -> LoadResult:
    target = urlsplit(url)
    body = chat_body("burst", max_tokens=2, prefill_ms=0, token_gap_ms=0, answer_tokens=2,
                     heartbeat_s=0)
    return asyncio.run(run_load(target.hostname or "127.0.0.1", target.port or 80,
                                "/v1/chat/completions", body, streams=BURST, ramp_s=0.0,
                                timeout_s=30))


def test_without_admission_a_burst_is_set_up_at_once(gateways: dict[str, str]) -> None:
    result = burst(gateways["off"])
    assert result.completed == BURST, result.errors
    # Set up as they came: the slowest first token is nowhere near the spaced
    # burst's (BURST / RATE = 4 s); the bound is loose for a loaded machine.
    assert result.ttft_ms["p99"] < 0.5 * (BURST - 1) / RATE * 1000, result.ttft_ms


async def burst_httpx(url: str) -> list[tuple[httpx.Response, float]]:
    """BURST requests at once; each response (read whole) and its seconds."""
    body = chat_body("burst", max_tokens=2, prefill_ms=0, token_gap_ms=0, answer_tokens=2,
                     heartbeat_s=0)
    limits = httpx.Limits(max_connections=BURST)
    async with httpx.AsyncClient(timeout=30.0, limits=limits) as client:
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def one() -> tuple[httpx.Response, float]:
            response = await client.post(f"{url}/v1/chat/completions", json=body)
            return response, loop.time() - started

        return await asyncio.gather(*(one() for _ in range(BURST)))


def test_with_admission_a_burst_is_spaced_and_the_rest_refused_with_retry_after(
        gateways: dict[str, str]) -> None:
    answers = asyncio.run(burst_httpx(gateways["on"]))
    admitted = sorted(took for r, took in answers
                      if r.status_code == 200 and "[DONE]" in r.text)
    refused = [r for r, _ in answers if r.status_code == 503]
    # 50 ms worth at once (one set-up), then one per 200 ms up to a 1 s wait:
    # about 6 admitted, the rest refused at once. The loop-lag gate may hold
    # set-ups back on a loaded machine (more refused), never let more through.
    assert len(admitted) + len(refused) == BURST, [r.status_code for r, _ in answers]
    assert 1 <= len(admitted) <= 2 + RATE * MAX_WAIT_S, len(admitted)
    assert refused
    for refusal in refused:
        assert refusal.json()["error"]["code"] == "server_busy"
        assert int(refusal.headers["Retry-After"]) >= 1
    # Spaced at the rate: the last admitted waited its turns behind the others.
    assert admitted[-1] >= (len(admitted) - 2) / RATE, admitted
