"""The shared caps' policy when the store cannot answer, and when they apply
(tests/integration/test_shared_caps.py counts them across real replicas)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from services.gateway.settings import GatewaySettings
from services.gateway.shared_caps import SharedCaps, build_shared_caps
from streamlab.lab.processes import free_ports

pytestmark = pytest.mark.anyio


def test_only_the_shared_store_and_a_lease_turn_them_on() -> None:
    registry = CollectorRegistry()
    assert build_shared_caps(GatewaySettings(), registry) is None  # one gateway's memory
    assert build_shared_caps(GatewaySettings(resume_store="redis", shared_caps_lease_s=0),
                             registry) is None  # the broken mode: each gateway alone
    caps = build_shared_caps(GatewaySettings(resume_store="redis"), registry)
    assert isinstance(caps, SharedCaps)


async def test_with_the_store_down_a_slot_is_admitted_on_the_local_count_without_waiting(
) -> None:
    """Nothing listens on the port (connection refused): the first acquire
    fails open, and the next ones do not ask the store again for a while (a
    store outage must not add its timeout to every new stream)."""
    port = free_ports(1)[0]
    registry = CollectorRegistry()
    caps = SharedCaps(f"redis://127.0.0.1:{port}/0", per_client=1, lease_s=10.0,
                      timeout_s=1.0, retry_after_s=1, replica="a", registry=registry)
    try:
        assert await caps.acquire("addr:10.0.0.1") is None

        async def asked(**_: object) -> int:
            raise AssertionError("the store was asked again within FAIL_OPEN_S")

        caps._acquire = asked
        for _ in range(5):  # over the cap of 1, were the store counting
            assert await caps.acquire("addr:10.0.0.1") is None
        assert registry.get_sample_value("streamlab_gateway_shared_caps_unavailable_total") == 6
        assert caps.held == 0
    finally:
        await caps.close()
