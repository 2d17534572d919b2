"""The auth profile: a gateway started with API keys refuses requests without
one, before any work starts, and serves requests with one."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from services.client.openai_stream import chat_body
from streamlab.lab import Lab
from streamlab.processes import wait_until
from streamlab.topology import REPO_ROOT
from tests.integration.conftest import free_ports

pytestmark = pytest.mark.integration

KEY = "sk-lab-test-key"


@pytest.fixture(scope="module")
def guarded_gateway(lab: Lab) -> Iterator[str]:
    port = free_ports(1)[0]
    env = {**os.environ, "STREAMLAB_GATEWAY_PORT": str(port),
           "STREAMLAB_GATEWAY_ENGINE_TARGET": lab.engine_target,
           "STREAMLAB_GATEWAY_API_KEYS": f'["{KEY}", "another-key"]'}
    process = subprocess.Popen([sys.executable, "-m", "services.gateway"], cwd=REPO_ROOT,
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(f"{url}/healthz", timeout=1).status_code == 200, 20,
                   "guarded gateway")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=15)
        assert process.stdout is not None
        log = process.stdout.read().decode()
        process.stdout.close()
        assert KEY not in log  # nothing secret in logs


@pytest.mark.parametrize("auth", [None, "Bearer wrong", "Basic abc", f"Token {KEY}"])
def test_requests_without_a_valid_key_get_401(guarded_gateway: str, auth: str | None) -> None:
    headers = {"Authorization": auth} if auth else {}
    response = httpx.post(f"{guarded_gateway}/v1/chat/completions", headers=headers,
                          json=chat_body("hi", answer_tokens=1), timeout=5)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_a_valid_key_is_served_and_probes_stay_open(guarded_gateway: str) -> None:
    response = httpx.post(f"{guarded_gateway}/v1/chat/completions",
                          headers={"Authorization": f"Bearer {KEY}"},
                          json={**chat_body("hi", prefill_ms=1, token_gap_ms=1, answer_tokens=3),
                                "stream": False}, timeout=10)
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 3
    assert httpx.get(f"{guarded_gateway}/healthz", timeout=5).status_code == 200
