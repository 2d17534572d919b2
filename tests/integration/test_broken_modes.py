"""A gateway with `allow_broken_modes` off refuses every knob that selects a
broken behaviour, with a 400 that names it, before the engine starts anything.
(The lab's own gateway allows them: the scenarios use them for contrast.)"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest

from services.client.openai_stream import chat_body, stream_chat
from streamlab.lab.local import Lab
from tests.integration.conftest import ExtraGateway

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

BROKEN: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"relay": "detached_unbounded"}),
    ("/v1/chat/completions", {"engine_errors": "swallow"}),
    ("/v1/jobs", {"job_ttl_s": 0}),
    ("/v1/streams", {"relay": "detached_unbounded"}),
]


async def test_a_gateway_that_refuses_broken_modes_starts_nothing(
    lab: Lab, http: httpx.AsyncClient, extra_gateway: Callable[..., ExtraGateway]
) -> None:
    strict = (await anyio.to_thread.run_sync(
        lambda: extra_gateway("gateway-strict", STREAMLAB_GATEWAY_ALLOW_BROKEN_MODES="false")
    )).url
    for path, knobs in BROKEN:
        rid = f"strict-{uuid.uuid4().hex[:8]}"
        response = await http.post(f"{strict}{path}", json=chat_body("x", **knobs),
                                   headers={"X-Request-Id": rid})
        assert response.status_code == 400, (path, knobs, response.text)
        error = response.json()["error"]
        assert error["code"] == "broken_mode_disabled"
        assert next(iter(knobs)) in error["message"]
        assert not lab.engine_stats(rid).generations, f"{path} {knobs} reached the engine"

    # The fixed knobs still work there, end to end.
    result = await stream_chat(http, f"{strict}/v1/chat/completions",
                               chat_body("fine", prefill_ms=0, token_gap_ms=0, answer_tokens=5,
                                         relay="direct", engine_errors="report"))
    assert result.done, result.error
    assert len(result.texts) == 5
