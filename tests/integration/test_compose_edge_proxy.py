"""The compose lab's edge proxy, whichever stands in its `nginx` service
(compose.<proxy>.yaml, docs/proxies.md): it is the proxy the lab tool was
told of, tokens stream through `/`, `/buffered/` does what that proxy does
out of the box (the table test_proxies.py measures on the local lab), and
`/short-timeout/` cuts a silent stream but not one with heartbeats.

`make test-compose-proxies` runs this file on each proxy's compose lab; CI's
compose run (nginx) runs it too. The local lab's proxies are test_proxies.py's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from services.client.openai_stream import chat_body, stream_chat
from streamlab.lab.compose import ComposeLab
from streamlab.lab.compose_config import HEALTH_PATHS
from streamlab.lab.target import LabTarget
from tests.integration.test_proxies import (
    GAP_MS,
    HEARTBEAT_S,
    NO_IDLE_TIMEOUT,
    PREFILL_MS,
    TOKENS,
    assert_out_of_the_box,
    completions,
    streamed,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

# The compose lab's /short-timeout/ is the lab's own 2 s (compose_config
# renders NginxOptions' defaults); a pause well past it, so a loaded machine
# cannot blur cut and kept.
PAUSE_S = 4.0


@pytest.fixture
def compose_lab(lab: LabTarget) -> ComposeLab:
    if not isinstance(lab, ComposeLab):
        pytest.skip("the compose lab's edge proxy; the local lab's are test_proxies.py's")
    return lab


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    # The read timeout is every test's watchdog: no test can hang on a stream.
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=5.0)) as client:
        yield client


async def test_the_proxy_at_the_edge_is_the_one_the_lab_was_told_of(
    compose_lab: ComposeLab, http: httpx.AsyncClient
) -> None:
    """Each proxy answers its own health path itself and passes the others'
    to the gateway (its 404): only the named proxy's answers 200. A project
    brought up without the proxy's compose file fails here."""
    answers = {name: (await http.get(f"{compose_lab.nginx_url}{path}")).status_code
               for name, path in HEALTH_PATHS.items()}
    assert answers == {name: 200 if name == compose_lab.edge_proxy else 404
                       for name in HEALTH_PATHS}, answers


async def test_streaming_location_passes_tokens_one_by_one(
    compose_lab: ComposeLab, http: httpx.AsyncClient
) -> None:
    body = chat_body("hello", prefill_ms=PREFILL_MS, token_gap_ms=GAP_MS, answer_tokens=TOKENS)
    result = await stream_chat(http, completions(compose_lab.edge_url), body,
                               headers={"Accept-Encoding": "gzip"})
    assert result.status == 200, result.error
    assert result.done
    assert streamed(result), (result.ttft_s, result.token_times, result.total_s)


async def test_out_of_the_box_location(compose_lab: ComposeLab,
                                       http: httpx.AsyncClient) -> None:
    await assert_out_of_the_box(http, compose_lab.edge_url, compose_lab.edge_proxy)


@pytest.mark.parametrize("heartbeat_s", [0.0, HEARTBEAT_S], ids=["silent", "heartbeats"])
async def test_short_idle_timeout_cuts_a_silent_stream_only(
    compose_lab: ComposeLab, http: httpx.AsyncClient, heartbeat_s: float
) -> None:
    if compose_lab.edge_proxy in NO_IDLE_TIMEOUT:
        pytest.skip(NO_IDLE_TIMEOUT[compose_lab.edge_proxy])
    body = chat_body("think", prefill_ms=50, token_gap_ms=GAP_MS, answer_tokens=5,
                     pauses=[{"after_token": 1, "pause_ms": int(PAUSE_S * 1000)}],
                     heartbeat_s=heartbeat_s)
    result = await stream_chat(http, completions(compose_lab.edge_url, "/short-timeout/"), body)
    if heartbeat_s:
        assert result.done, result.error
        assert len(result.texts) == 5
    else:
        assert not result.done, "a stream silent past the idle timeout must be cut"
        assert 1 <= len(result.texts) < 5
        assert result.total_s < PAUSE_S  # cut inside the pause, not at its end
