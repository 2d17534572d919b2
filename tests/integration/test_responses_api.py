"""The Responses API through the real chain (Toxiproxy, nginx, gateway, engine)
with the official `openai` SDK: a stream whose events the SDK parses into its
own types, a background response cut mid-stream by Toxiproxy and resumed with
`retrieve(stream=True, starting_after=N)`, cancel, and a plain stream closed
early cancelling at the engine."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import pytest
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
)

from services.engine.backends.fake import token_text
from streamlab.lab import processes
from streamlab.lab.local import Lab
from streamlab.lab.toxiproxy import Toxic, Toxiproxy
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from tests.integration.engine_probe import wait_for_generation_end, wait_for_generation_start
from tests.integration.redis_fixtures import RedisServer, StartReplicas

pytestmark = pytest.mark.integration
MODEL = "streamlab-fake"
TOKENS = 40
EXPECTED = "".join(token_text(i) for i in range(TOKENS))


@pytest.fixture
def sdk(lab: Lab) -> Iterator[openai.OpenAI]:
    # No retries: a test must see the first answer, not a retried one. A new
    # connection per request: each is its own Toxiproxy link, so a toxic added
    # before a request cuts that request's connection.
    # Uncompressed (nginx gzips event streams), so a toxic's byte count lands
    # where the test says.
    http = openai.DefaultHttpxClient(timeout=15.0,
                                     limits=httpx2.Limits(max_keepalive_connections=0),
                                     headers={"Accept-Encoding": "identity"})
    client = openai.OpenAI(base_url=f"{lab.edge_url}/v1", api_key="sk-unused",
                           max_retries=0, http_client=http)
    try:
        yield client
    finally:
        client.close()


def timing(**fields: Any) -> dict[str, Any]:
    return {"streamlab": {"prefill_ms": 0, "token_gap_ms": 20, "answer_tokens": TOKENS,
                          **fields}}


def read(events: Any, into: list[ResponseStreamEvent]) -> BaseException | None:
    """Collect `events` until they end or the connection is cut (returned,
    when the cut raised rather than ended the body early)."""
    try:
        for event in events:
            into.append(event)
    except (httpx2.HTTPError, openai.APIError) as cut:
        return cut
    return None


def assert_resumed_whole(client: openai.OpenAI, response_id: str,
                         first: list[ResponseStreamEvent], expected_text: str
                         ) -> list[ResponseStreamEvent]:
    """Resume after the last event `first` saw: every event exactly once, numbered
    without a gap, the whole text, and the completed event last. Returns them all."""
    rest: list[ResponseStreamEvent] = []
    resumed = client.responses.retrieve(response_id, stream=True,
                                        starting_after=first[-1].sequence_number)
    assert read(resumed, rest) is None
    events = first + rest
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if isinstance(e, ResponseTextDeltaEvent))
    assert text == expected_text
    assert isinstance(events[-1], ResponseCompletedEvent)
    return events


def test_a_stream_is_the_sdk_s_typed_events(sdk: openai.OpenAI, lab: Lab) -> None:
    request_id = f"responses-{uuid.uuid4().hex[:8]}"
    events: list[ResponseStreamEvent] = []
    stream = sdk.responses.create(model=MODEL, input="hi", instructions="be brief",
                                  stream=True, extra_body=timing(token_gap_ms=2),
                                  extra_headers={"X-Request-Id": request_id})
    assert read(stream, events) is None
    assert isinstance(events[0], ResponseCreatedEvent)
    assert isinstance(events[-1], ResponseCompletedEvent)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if isinstance(e, ResponseTextDeltaEvent)]
    assert len(deltas) == TOKENS
    assert "".join(deltas) == EXPECTED
    final = events[-1].response
    assert final.status == "completed"
    assert final.output_text == EXPECTED
    assert final.usage is not None
    assert final.usage.output_tokens == TOKENS
    assert wait_for_generation_end(lab, request_id).state == pb.GENERATION_STATE_COMPLETED


def test_a_cut_background_stream_resumes_with_every_delta_once(
        sdk: openai.OpenAI, lab: Lab, toxiproxy: Toxiproxy) -> None:
    uncut = sdk.responses.create(model=MODEL, input="resume me",
                                 extra_body=timing(token_gap_ms=1))
    assert uncut.output_text == EXPECTED
    # The edge closes the connection after this many bytes: past the opening
    # events (two response objects), a few deltas in, long before the end.
    toxiproxy.add_toxic("edge", Toxic("limit_data", {"bytes": 4000}))
    first: list[ResponseStreamEvent] = []
    stream = sdk.responses.create(model=MODEL, input="resume me", background=True,
                                  stream=True, extra_body=timing())
    read(stream, first)  # a cut may end it quietly or raise: either way it stops short
    toxiproxy.reset()
    assert not isinstance(first[-1], ResponseCompletedEvent), "the toxic did not cut it"
    assert isinstance(first[0], ResponseCreatedEvent)
    response_id = first[0].response.id
    seen = [e for e in first if isinstance(e, ResponseTextDeltaEvent)]
    assert 0 < len(seen) < TOKENS, "the cut is meant to land among the deltas"
    # Still running: the generation outlives the connection that watched it.
    assert wait_for_generation_start(lab, response_id.removeprefix("resp_")).state == \
        pb.GENERATION_STATE_RUNNING

    events = assert_resumed_whole(sdk, response_id, first, uncut.output_text)
    assert isinstance(events[-1], ResponseCompletedEvent)
    assert events[-1].response.output_text == EXPECTED
    assert sdk.responses.retrieve(response_id).status == "completed"


def test_cancel_stops_a_background_response_at_the_engine(sdk: openai.OpenAI, lab: Lab) -> None:
    created = sdk.responses.create(model=MODEL, input="long", background=True,
                                   extra_body=timing(token_gap_ms=50, answer_tokens=400))
    assert created.status == "in_progress"
    stream_id = created.id.removeprefix("resp_")
    wait_for_generation_start(lab, stream_id)
    cancelled = sdk.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    record = wait_for_generation_end(lab, stream_id)
    assert record.state == pb.GENERATION_STATE_CANCELLED
    assert record.tokens_generated < 400
    events: list[ResponseStreamEvent] = []
    assert read(sdk.responses.retrieve(created.id, stream=True), events) is None
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.status == "cancelled"


def test_closing_a_plain_stream_early_cancels_the_generation(sdk: openai.OpenAI,
                                                             lab: Lab) -> None:
    request_id = f"responses-early-{uuid.uuid4().hex[:8]}"
    stream = sdk.responses.create(model=MODEL, input="a long one", stream=True,
                                  extra_body=timing(token_gap_ms=50, answer_tokens=400),
                                  extra_headers={"X-Request-Id": request_id})
    deltas = 0
    for event in stream:
        deltas += isinstance(event, ResponseTextDeltaEvent)
        if deltas >= 3:
            break
    stream.close()
    record = wait_for_generation_end(lab, request_id)
    assert record.state == pb.GENERATION_STATE_CANCELLED
    assert record.tokens_generated < 400


def test_unsupported_parameters_are_the_sdk_s_bad_request(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(model=MODEL, input="hi",
                             tools=[{"type": "function", "name": "f", "parameters": {},
                                     "strict": False}])
    assert refused.value.param == "tools"


def client_of(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="sk-unused", max_retries=0,
                         timeout=25.0)


def test_a_background_response_resumes_on_another_replica_after_its_owner_is_killed(
        redis_server: RedisServer, start_replicas: StartReplicas) -> None:
    """Two gateways sharing the Redis resume log: the owner is SIGKILLed under
    a live background stream; the other one takes the generation over (the
    engine's, re-attached) and the SDK's resume there gets every delta once."""
    replicas = start_replicas(redis_server.url, STREAMLAB_GATEWAY_REDIS_TIMEOUT_S="1",
                              STREAMLAB_GATEWAY_REDIS_FOLLOWER_TTL_S="1.5")
    tokens = 120  # 3 s of tokens: still running when the takeover comes
    on_a, on_b = client_of(replicas.gateways["a"]), client_of(replicas.gateways["b"])
    first: list[ResponseStreamEvent] = []
    stream = on_a.responses.create(model=MODEL, input="survive me", background=True,
                                   stream=True,
                                   extra_body=timing(token_gap_ms=25, answer_tokens=tokens))
    for event in stream:
        first.append(event)
        if sum(isinstance(e, ResponseTextDeltaEvent) for e in first) >= 10:
            break
    processes.stop(replicas.processes["a"], grace_s=0)  # SIGKILL
    stream.close()
    assert isinstance(first[0], ResponseCreatedEvent)
    response_id = first[0].response.id

    assert_resumed_whole(on_b, response_id, first,
                         "".join(token_text(i) for i in range(tokens)))
    records = list(replicas.stats(response_id.removeprefix("resp_")).generations)
    assert [(r.state, r.tokens_generated) for r in records] == [
        (pb.GENERATION_STATE_COMPLETED, tokens)], "one generation, re-attached, not rerun"
    on_a.close()
    on_b.close()
