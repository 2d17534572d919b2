"""OpenAI's `stop` through the whole chain: the answer ends before the first
stop sequence to complete, none of it reaches the client, even when it spans
tokens, and the engine stops generating there (a stop saves GPU time too)."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import httpx
import pytest

from services.client.openai_stream import chat_body, stream_chat
from services.engine.backends.fake import token_text
from streamlab.lab.local import Lab
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from tests.integration.engine_probe import wait_for_generation_end

pytestmark = [
    pytest.mark.integration, pytest.mark.anyio,
    pytest.mark.local_only("stop sequences are the engine's and the gateway's text "
                           "logic, the same code on both targets"),
]

ANSWER = 40
# The fake model's words, as the client would see them with no stop at all.
FULL = "".join(token_text(i) for i in range(ANSWER))


def body(stop: Any, **extra: Any) -> dict[str, Any]:
    request = chat_body("stop me", prefill_ms=0, token_gap_ms=5, answer_tokens=ANSWER, **extra)
    request["stop"] = stop
    request["stream_options"] = {"include_usage": True}
    return request


@pytest.mark.parametrize("stop", ["fox", "brown fox", ["lazy", "quick brown"], "own f"],
                         ids=["in-a-token", "across-tokens", "first-to-complete", "mid-word"])
async def test_the_answer_ends_before_the_stop_and_the_engine_stops_there(
    lab: Lab, http: httpx.AsyncClient, stop: Any
) -> None:
    rid = f"stop-{uuid.uuid4().hex[:8]}"
    result = await stream_chat(http, f"{lab.edge_url}/v1/chat/completions", body(stop),
                               headers={"X-Request-Id": rid})
    sequences = [stop] if isinstance(stop, str) else stop
    cut = min((FULL.find(s) + len(s), FULL.find(s)) for s in sequences if s in FULL)[1]
    assert result.done, result.error
    assert result.text == FULL[:cut]
    assert result.finish_reason == "stop"
    record = await anyio.to_thread.run_sync(wait_for_generation_end, lab, rid)
    assert record.state == pb.GENERATION_STATE_COMPLETED
    # It stopped at the token that completed the stop, not at the end.
    assert record.tokens_generated <= len(FULL[:cut].split()) + 2
    assert result.usage is not None
    assert result.usage["completion_tokens"] == record.tokens_generated


async def test_a_stop_that_never_occurs_changes_nothing(lab: Lab, http: httpx.AsyncClient
                                                         ) -> None:
    result = await stream_chat(http, f"{lab.edge_url}/v1/chat/completions",
                               body(["zebra", "dog while x", FULL.split()[-1] + " X"]))
    # Held-back text leaves as one chunk for several tokens; usage still counts tokens.
    assert result.usage is not None
    assert result.usage["completion_tokens"] == ANSWER
    assert FULL.endswith(FULL.split()[-1] + " ")
    assert result.done
    # Text held back as a possible stop came out: mid-answer with the next
    # token ("dog while " before "a "), at the end with the finish (the last word).
    assert result.text == FULL
    assert result.finish_reason == "stop"


@pytest.mark.parametrize("stop", [["a", "b", "c", "d", "e"], "", ["ok", ""], "x" * 257, 7])
async def test_bad_stop_sequences_get_a_400_before_anything_starts(
    lab: Lab, http: httpx.AsyncClient, stop: Any
) -> None:
    rid = f"bad-stop-{uuid.uuid4().hex[:8]}"
    response = await http.post(f"{lab.edge_url}/v1/chat/completions", json=body(stop),
                               headers={"X-Request-Id": rid})
    assert response.status_code == 400, response.text
    assert "stop" in response.json()["error"]["message"]
    assert not lab.engine_stats(rid).generations, "refused, yet it started"


async def test_a_non_streamed_answer_is_cut_the_same_way(lab: Lab, http: httpx.AsyncClient
                                                         ) -> None:
    response = await http.post(f"{lab.edge_url}/v1/chat/completions",
                               json=body("lazy", stream=False))
    assert response.status_code == 200
    choice = response.json()["choices"][0]
    assert choice["message"]["content"] == FULL[:FULL.find("lazy")]
    assert choice["finish_reason"] == "stop"
