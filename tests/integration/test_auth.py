"""The auth profile: a gateway started with API keys refuses requests without
one, before any work starts, and serves requests with one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from services.client.openai_stream import chat_body
from streamlab.lab import processes
from streamlab.lab.local import Lab
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


def test_another_key_cannot_read_or_stop_a_job_or_a_stream(lab: Lab,
                                                           guarded_gateway: str) -> None:
    """One key could read and DELETE another key's stream and job: now 404,
    as for an id that never existed."""
    mine = {"Authorization": f"Bearer {KEY}"}
    theirs = {"Authorization": "Bearer another-key"}
    body = chat_body("hi", prefill_ms=0, token_gap_ms=20, answer_tokens=50)
    with httpx.Client(base_url=guarded_gateway, timeout=5) as http:
        job = http.post("/v1/jobs", json=body, headers=mine).json()["id"]
        stream = http.post("/v1/streams", json=body, headers=mine).json()["id"]
        for method, path in [("GET", f"/v1/jobs/{job}"), ("DELETE", f"/v1/jobs/{job}"),
                             ("GET", f"/v1/streams/{stream}"),
                             ("GET", f"/v1/streams/{stream}/events"),
                             ("DELETE", f"/v1/streams/{stream}")]:
            assert http.request(method, path, headers=theirs).status_code == 404, (method, path)
        assert http.get(f"/v1/jobs/{job}", headers=mine).status_code == 200
        assert http.get(f"/v1/streams/{stream}", headers=mine).json()["state"] in (
            "running", "completed")
        assert http.delete(f"/v1/jobs/{job}", headers=mine).status_code == 204
        assert http.delete(f"/v1/streams/{stream}", headers=mine).status_code == 200


def duplicate_authorization(url: str) -> httpx.Response:
    # A list of pairs: httpx sends each, where a dict would keep one.
    return httpx.post(f"{url}/v1/chat/completions", json=chat_body("hi", answer_tokens=1),
                      headers=[("Authorization", "Bearer another-key"),
                               ("Authorization", f"Bearer {KEY}")], timeout=5)


def test_authorization_twice_is_a_400_with_auth_on_or_off(lab: Lab,
                                                          guarded_gateway: str) -> None:
    """Auth read the last Authorization header, identity the first: a request
    passed auth with one key and was counted as, and owned streams of, the other."""
    for url in (guarded_gateway, lab.gateway_url):
        response = duplicate_authorization(url)
        assert response.status_code == 400, (url, response.text)
        error = response.json()["error"]
        assert (error["code"], error["param"]) == ("duplicate_header", "Authorization")
        assert KEY not in response.text
