"""The auth profile: a gateway started with API keys refuses requests without
one, before any work starts, and serves requests with one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from services.client.openai_stream import chat_body
from streamlab import processes
from streamlab.lab import Lab
from tests.integration.conftest import start_extra_gateway

pytestmark = pytest.mark.integration

KEY = "sk-lab-test-key"


@pytest.fixture(scope="module")
def guarded_gateway(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    gateway = start_extra_gateway(lab, tmp_path_factory.mktemp("auth"), "gateway-auth",
                                  STREAMLAB_GATEWAY_API_KEYS=f'["{KEY}", "another-key"]')
    try:
        yield gateway.url
    finally:
        processes.stop(gateway.process, grace_s=15.0)
        assert KEY not in gateway.process.log.read_text()  # nothing secret in logs


@pytest.mark.parametrize("auth", [None, "Bearer wrong", "Basic abc", f"Token {KEY}"])
def test_requests_without_a_valid_key_get_401(lab: Lab, guarded_gateway: str,
                                              auth: str | None) -> None:
    rid = f"no-key-{uuid.uuid4().hex[:8]}"
    headers = {"Authorization": auth} if auth else {}
    response = httpx.post(f"{guarded_gateway}/v1/chat/completions",
                          headers={**headers, "X-Request-Id": rid},
                          json=chat_body("hi", answer_tokens=1), timeout=5)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert not lab.engine_stats(rid).generations, "refused, yet the engine started"


def test_a_valid_key_is_served_and_probes_stay_open(guarded_gateway: str) -> None:
    response = httpx.post(f"{guarded_gateway}/v1/chat/completions",
                          headers={"Authorization": f"Bearer {KEY}"},
                          json={**chat_body("hi", prefill_ms=1, token_gap_ms=1, answer_tokens=3),
                                "stream": False}, timeout=10)
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 3
    assert httpx.get(f"{guarded_gateway}/healthz", timeout=5).status_code == 200
