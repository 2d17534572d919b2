"""compose's `tracing` profile for real (docs/tracing.md): Jaeger in a container,
the gateway and the engine exporting to it (compose.tracing.yaml). Runs on the
compose target started with the profile:

    STREAMLAB_COMPOSE_TRACING=1 STREAMLAB_COMPOSE_TESTS=tests/integration/test_tracing_compose.py \\
        scripts/compose_test.sh

and skips anywhere else (the local lab's tracing is test_tracing.py's)."""

from __future__ import annotations

import os
import time
import uuid

import httpx
import pytest

from services.client.openai_stream import chat_body
from services.common.tracing import new_traceparent, trace_id_of
from streamlab.lab import jaeger
from streamlab.lab.compose import selected_target
from streamlab.lab.target import LabTarget

pytestmark = pytest.mark.integration


def test_a_chat_through_the_compose_edge_is_one_trace_in_its_jaeger(lab: LabTarget) -> None:
    if selected_target() != "compose" or os.environ.get("STREAMLAB_COMPOSE_TRACING") != "1":
        pytest.skip("the compose lab up with its tracing profile: STREAMLAB_COMPOSE_TRACING=1 "
                    "scripts/compose_test.sh")
    traceparent, request_id = new_traceparent(), uuid.uuid4().hex
    trace_id = trace_id_of(traceparent)
    assert trace_id is not None
    answer = httpx.post(f"{lab.edge_url}/v1/chat/completions", timeout=15.0,
                        json=chat_body("hi", prefill_ms=50, token_gap_ms=5, answer_tokens=5),
                        headers={"traceparent": traceparent, "X-Request-Id": request_id})
    assert answer.status_code == 200
    assert trace_id_of(answer.headers["traceresponse"]) == trace_id
    deadline, seen = time.monotonic() + 15.0, set()
    while time.monotonic() < deadline:
        trace = jaeger.get_trace(lab.ports, trace_id)
        if trace is not None:
            processes = trace["processes"]
            seen = {(processes[s["processID"]]["serviceName"], s["operationName"])
                    for s in trace["spans"]}
            if {("streamlab-gateway", "gateway sse"),
                    ("streamlab-engine", "engine generate")} <= seen:
                return
        time.sleep(0.3)
    raise AssertionError(f"trace {trace_id} in the compose Jaeger: {sorted(seen)}")
