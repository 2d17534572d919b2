"""Replay memory is bounded overall: a gateway with a tiny total budget.

Its own small lab (the shared one has production-sized budgets): finished
streams are evicted first (their ids answer 410), then a growing stream drops
its own oldest events, and a client resuming from before them is told.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.client.resume_stream import create_stream, follow_stream
from streamlab.lab.local import Lab, LabOptions
from streamlab_protocol.sse import Comment, SSEDecoder
from tests.integration.conftest import free_lab_ports

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

BUDGET_BYTES = 4096  # about forty token events


@pytest.fixture(scope="module")
def small_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    ports = free_lab_ports()
    run_dir: Path = tmp_path_factory.mktemp("small-lab")
    lab = Lab(ports, LabOptions(run_dir=run_dir, gateway_env={
        "STREAMLAB_GATEWAY_RESUME_TOTAL_MAX_BYTES": str(BUDGET_BYTES)}))
    lab.up()
    try:
        yield lab
    finally:
        lab.down()


def replay_bytes(metrics: str) -> float:
    match = re.search(r"^streamlab_gateway_resume_replay_bytes (\S+)$", metrics, re.M)
    assert match, "the replay-bytes gauge is exported"
    return float(match.group(1))


async def test_total_replay_memory_stays_under_the_budget(small_lab: Lab) -> None:
    edge = small_lab.edge_url

    def body(tokens: int) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": "x"}],
                "streamlab": {"prefill_ms": 10, "token_gap_ms": 5, "answer_tokens": tokens}}

    async with httpx.AsyncClient(timeout=10.0) as http:
        first = await create_stream(http, edge, body(10))
        assert (await follow_stream(http, edge, first)).terminal == "done"

        big = await create_stream(http, edge, body(80))
        assert (await follow_stream(http, edge, big)).terminal == "done"

        # The finished stream made room first...
        gone = await http.get(f"{edge}{first['events_url']}")
        assert gone.status_code == 410
        # ...then the big one dropped its own oldest events, and says so.
        replay = await http.get(f"{edge}{big['events_url']}")
        assert replay.status_code == 200
        events = [i for i in SSEDecoder().feed(replay.content) if not isinstance(i, Comment)]
        assert events[0].event == "gap"
        missed = json.loads(events[0].data)
        assert missed["missed_from"] == f"{big['id']}:1"
        assert replay.headers["last-event-id"] == missed["missed_to"]
        tokens = [json.loads(e.data)["index"] for e in events if e.event == "token"]
        assert tokens, "some of the newest events were kept"
        assert tokens == list(range(80 - len(tokens), 80)), "the newest are kept, in order"
        # ...and the replay starts right after the gap (token i is event i + 1).
        assert missed["missed_to"] == f"{big['id']}:{tokens[0]}"
        assert events[-1].event == "done"

        metrics = (await http.get(f"{small_lab.gateway_url}/metrics")).text
        assert 0 < replay_bytes(metrics) <= BUDGET_BYTES
