"""The raw-socket load generator through the whole chain: every stream
completes with every token counted, and it reports its own CPU."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from services.client.openai_stream import chat_body
from streamlab.experiments.bench.load import run_load
from streamlab.lab.target import LabTarget

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def test_load_through_the_edge_counts_every_token_of_every_stream(lab: LabTarget) -> None:
    streams, tokens = 12, 8  # under the suite's per-client cap
    edge = urlsplit(lab.edge_url)
    body = chat_body("load", max_tokens=tokens, prefill_ms=0, token_gap_ms=5,
                     answer_tokens=tokens)
    result = await run_load(edge.hostname or "127.0.0.1", edge.port or 80,
                            "/v1/chat/completions", body, streams=streams, ramp_s=0.1,
                            timeout_s=30)
    print(result.figures())
    assert result.errors == {}
    assert result.completed == streams
    assert result.tokens == streams * tokens
    assert set(result.icl_ms) == {"p50", "p90", "p99"}
    assert result.client_cpu_ms is not None
