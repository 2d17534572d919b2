from __future__ import annotations

import pytest

from services.gateway.openai_api import StreamlabOptions


@pytest.mark.parametrize(("heartbeat_s", "expected"), [(None, 15.0), (0, 0.0), (0.5, 0.5),
                                                       (0.001, 0.05)])
def test_per_request_heartbeat_overrides_the_gateways(heartbeat_s: float | None,
                                                      expected: float) -> None:
    assert StreamlabOptions(heartbeat_s=heartbeat_s).heartbeat_or(15.0) == expected
