"""Per-identity caps across replicas: real redis-server, gateways "a" and "b"
sharing it, one real engine (tests/integration/redis_fixtures.py). Every
request comes from 127.0.0.1, so to both gateways it is one identity.

The broken thing is each gateway counting alone (`shared_caps_lease_s` 0):
with the cap full across both, the next stream still gets 201 wherever it
lands, since each gateway holds only half of it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from streamlab.lab import processes
from tests.integration.redis_fixtures import RedisServer, StartReplicas, create_stream
from tests.wait import wait_until

pytestmark = pytest.mark.integration

CAP = 4
LEASE_S = 2.0
ENV = {"STREAMLAB_GATEWAY_REDIS_TIMEOUT_S": "1",
       "STREAMLAB_GATEWAY_MAX_STREAMS_PER_CLIENT": str(CAP),
       # No reader attaches: the streams must hold their slots meanwhile.
       "STREAMLAB_GATEWAY_RESUME_ATTACH_TIMEOUT_S": "30"}
# Runs past every test here (each stream holds its slot until it ends).
BODY: dict[str, Any] = {"messages": [{"role": "user", "content": "hold a slot"}],
                        "streamlab": {"prefill_ms": 10, "token_gap_ms": 10,
                                      "answer_tokens": 3000}}


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=httpx.Timeout(10.0, connect=5.0)) as client:
        yield client


def post(http: httpx.Client, base_url: str) -> httpx.Response:
    return http.post(f"{base_url}/v1/streams", json=BODY)


@pytest.mark.parametrize("lease_s", [LEASE_S, 0.0], ids=["shared", "broken-per-gateway"])
def test_the_cap_holds_across_replicas_whichever_gateway_the_next_stream_hits(
        redis_server: RedisServer, start_replicas: StartReplicas, http: httpx.Client,
        lease_s: float) -> None:
    replicas = start_replicas(redis_server.url, **ENV,
                              STREAMLAB_GATEWAY_SHARED_CAPS_LEASE_S=str(lease_s))
    a, b = replicas.gateways["a"], replicas.gateways["b"]
    for i in range(CAP):  # half on each gateway: each is under the cap on its own
        create_stream(http, (a, b)[i % 2], BODY)
    answers = {name: post(http, url) for name, url in (("a", a), ("b", b))}
    statuses = {name: r.status_code for name, r in answers.items()}
    if lease_s == 0:
        # Each gateway counted CAP / 2: the identity holds CAP + 2.
        assert statuses == {"a": 201, "b": 201}
        return
    assert statuses == {"a": 429, "b": 429}, {n: r.text for n, r in answers.items()}
    for response in answers.values():
        assert response.json()["error"]["code"] == "too_many_streams"
        assert int(response.headers["Retry-After"]) >= 1


def test_a_killed_gateways_slots_come_back_within_the_lease(
        redis_server: RedisServer, start_replicas: StartReplicas, http: httpx.Client) -> None:
    replicas = start_replicas(redis_server.url, **ENV,
                              STREAMLAB_GATEWAY_SHARED_CAPS_LEASE_S=str(LEASE_S))
    a, b = replicas.gateways["a"], replicas.gateways["b"]
    for _ in range(CAP // 2):
        create_stream(http, a, BODY)
    for _ in range(CAP - CAP // 2):
        create_stream(http, b, BODY)
    # Held past one lease while b renews them: still full.
    time.sleep(LEASE_S * 1.5)  # the time the slots must outlive, not a sync point
    assert post(http, a).status_code == 429
    processes.stop(replicas.processes["b"], grace_s=0)  # SIGKILL: nobody releases them
    killed_at = time.monotonic()
    wait_until(lambda: post(http, a).status_code == 201, timeout_s=LEASE_S + 5.0,
               interval_s=0.1, what="a slot freed on a after b was killed")
    back_after = time.monotonic() - killed_at
    print(f"\na killed gateway's slots came back after {back_after:.2f} s (lease {LEASE_S} s)")
    assert back_after <= LEASE_S + 1.0
