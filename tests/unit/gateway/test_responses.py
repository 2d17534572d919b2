"""/v1/responses in-process: the event sequence and its shapes (validated by
the official SDK's own pydantic types), replay with starting_after, cancel,
and the parameters refused by name."""

from __future__ import annotations

import json
import typing
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent

from services.gateway.responses_api import Echo, ResponseWriter
from tests.unit.gateway.inprocess import leave_midway, running, until
from tests.unit.gateway.scripted_engine import Script, ScriptedEngine

# The SDK's event classes by their `type` (its union is discriminated at
# parse time, so validating against the union would report every variant).
EVENT_TYPES: dict[str, Any] = {
    typing.get_args(cls.model_fields["type"].annotation)[0]: cls
    for cls in typing.get_args(typing.get_args(ResponseStreamEvent)[0])}
OPENING = ["response.created", "response.in_progress", "response.output_item.added",
           "response.content_part.added"]
CLOSING = ["response.output_text.done", "response.content_part.done",
           "response.output_item.done", "response.completed"]


def events(body: bytes) -> list[dict[str, Any]]:
    """The SSE body's events; each one's `event:` name must match its JSON type."""
    parsed: list[dict[str, Any]] = []
    name = None
    for line in body.decode().splitlines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
            assert data["type"] == name
            parsed.append(data)
    return parsed


def strict(event: dict[str, Any]) -> Any:
    """Validated (not merely constructed) as the SDK's type for it."""
    return EVENT_TYPES[event["type"]].model_validate(event)


async def test_a_stream_is_the_sdk_s_event_sequence_numbered_from_zero() -> None:
    async with running(ScriptedEngine(Script(tokens=3))) as lab:
        reply = await lab.http.post("/v1/responses", json={"input": "hi", "stream": True})
    assert reply.status_code == 200
    got = events(reply.content)
    assert [e["type"] for e in got] == OPENING + ["response.output_text.delta"] * 3 + CLOSING
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    parsed = [strict(e) for e in got]
    assert "".join(e.delta for e in parsed if e.type == "response.output_text.delta") == \
        "t0 t1 t2 "
    final = parsed[-1].response
    assert final.status == "completed"
    assert final.output_text == "t0 t1 t2 "
    assert final.usage.output_tokens == 3
    assert parsed[0].response.id == final.id
    assert final.id.startswith("resp_")


async def test_input_messages_and_instructions_reach_the_engine_as_chat_turns() -> None:
    async with running() as lab:
        reply = await lab.http.post("/v1/responses", json={
            "instructions": "be brief", "max_output_tokens": 9,
            "streamlab": {"token_gap_ms": 3, "answer_tokens": 5},
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "a"},
                                                   {"type": "input_text", "text": "b"}]}]})
        request = lab.engine.last.request
    assert reply.status_code == 200
    answer = Response.model_validate(reply.json())
    assert answer.status == "completed"
    assert answer.output_text == "t0 t1 t2 "
    assert answer.instructions == "be brief"
    assert answer.max_output_tokens == 9
    assert [(m.role, m.content) for m in request.messages] == [("system", "be brief"),
                                                               ("user", "a\nb")]
    assert request.max_tokens == 9
    assert (request.timing.token_gap_ms, request.timing.answer_tokens) == (3, 5)


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x", "tools": [{"type": "function", "name": "f"}]}, "tools"),
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "store": True}, "store"),
    ({"input": "x", "background": True, "store": False}, "store"),
    ({"input": []}, "input"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "text": "x"}]}]},
     "input.0.content.0.type"),
    ({"input": "x", "streamlab": {"prefill_ms": -1}}, "streamlab.prefill_ms"),
])
async def test_unsupported_or_bad_parameters_are_a_400_naming_them(
        body: dict[str, Any], param: str) -> None:
    async with running() as lab:
        reply = await lab.http.post("/v1/responses", json=body)
        assert lab.engine.calls == []
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"


async def test_a_background_response_replays_after_starting_after_exactly() -> None:
    async with running(ScriptedEngine(Script(tokens=4))) as lab:
        created = await lab.http.post("/v1/responses", json={"input": "hi", "background": True})
        assert created.status_code == 200
        first = Response.model_validate(created.json())
        assert first.status == "in_progress"
        assert first.background
        stream = lab.gateway.streams.local(first.id.removeprefix("resp_"))
        assert stream is not None
        await until(lambda: stream.ended)
        everything = events((await lab.http.get(f"/v1/responses/{first.id}",
                                                params={"stream": "true"})).content)
        for n in (0, 3, 5, len(everything) - 2):
            tail = events((await lab.http.get(
                f"/v1/responses/{first.id}",
                params={"stream": "true", "starting_after": n})).content)
            assert tail == everything[n + 1:], n
        done = Response.model_validate((await lab.http.get(f"/v1/responses/{first.id}")).json())
    assert [e["sequence_number"] for e in everything] == list(range(len(everything)))
    assert [strict(e).type for e in everything][-1] == "response.completed"
    assert done.status == "completed"
    assert done.output_text == "t0 t1 t2 t3 "
    # Rebuilt from the stream's age: the same second, or the next one.
    assert abs(done.created_at - first.created_at) <= 1


async def test_a_background_stream_is_the_same_events_as_a_retrieve() -> None:
    async with running(ScriptedEngine(Script(tokens=2))) as lab:
        streamed = events((await lab.http.post(
            "/v1/responses", json={"input": "hi", "background": True, "stream": True})).content)
        response_id = streamed[0]["response"]["id"]
        again = events((await lab.http.get(f"/v1/responses/{response_id}",
                                           params={"stream": "true"})).content)
    assert [e["type"] for e in streamed] == OPENING + ["response.output_text.delta"] * 2 + CLOSING
    assert [e["type"] for e in again] == [e["type"] for e in streamed]
    assert [e["sequence_number"] for e in again] == [e["sequence_number"] for e in streamed]


async def test_cancel_stops_the_generation_and_ends_the_stream_cancelled() -> None:
    async with running(ScriptedEngine(Script(tokens=10, hold_after=2))) as lab:
        created = (await lab.http.post("/v1/responses",
                                       json={"input": "hi", "background": True})).json()
        await until(lambda: bool(lab.engine.calls) and lab.engine.last.sent == 2)
        cancelled = await lab.http.post(f"/v1/responses/{created['id']}/cancel")
        assert lab.engine.last.cancelled
        replay = events((await lab.http.get(f"/v1/responses/{created['id']}",
                                            params={"stream": "true"})).content)
    assert cancelled.status_code == 200
    answer = Response.model_validate(cancelled.json())
    assert answer.status == "cancelled"
    assert answer.output_text == "t0 t1 "
    assert [e["type"] for e in replay] == OPENING + ["response.output_text.delta"] * 2 + [
        "response.incomplete"]
    assert strict(replay[-1]).response.status == "cancelled"


async def test_a_client_that_leaves_a_plain_stream_cancels_it_at_the_engine() -> None:
    engine = ScriptedEngine(Script(tokens=10, hold_after=2))
    async with running(engine) as lab:
        await leave_midway(lab.app, "/v1/responses", {"input": "hi", "stream": True},
                           lambda seen: seen.body.count(b"output_text.delta") >= 4)
        await until(lambda: engine.last.cancelled)
        registry = lab.gateway.metrics.registry
        # Counted as the chat route counts its streams: none left open.
        await until(lambda: registry.get_sample_value("streamlab_gateway_streams_active") == 0)
        assert registry.get_sample_value("streamlab_gateway_streams_total",
                                         {"outcome": "client_disconnect"}) == 1


async def test_an_engine_failure_mid_stream_ends_with_response_failed() -> None:
    async with running(ScriptedEngine(Script(tokens=1, end="error"))) as lab:
        got = events((await lab.http.post("/v1/responses",
                                          json={"input": "hi", "stream": True})).content)
    assert got[-1]["type"] == "response.failed"
    failed = strict(got[-1]).response
    assert failed.status == "failed"
    assert failed.error is not None


@pytest.mark.parametrize("path", ["/v1/responses/resp_" + "0" * 32, "/v1/responses/nope",
                                  "/v1/responses/resp_" + "0" * 32 + "?stream=true"])
async def test_unknown_responses_are_404(path: str) -> None:
    async with running() as lab:
        reply = await lab.http.get(path)
    assert reply.status_code == 404
    assert "error" in reply.json()


async def test_a_negative_starting_after_is_refused() -> None:
    async with running() as lab:
        created = (await lab.http.post("/v1/responses",
                                       json={"input": "hi", "background": True})).json()
        reply = await lab.http.get(f"/v1/responses/{created['id']}",
                                   params={"stream": "true", "starting_after": -1})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "starting_after"


def test_a_length_cut_ends_incomplete_with_the_sdk_s_reason() -> None:
    writer = ResponseWriter("abc", "m", 0, Echo(max_output_tokens=1))
    opening = writer.opening()
    delta = writer.delta("x")
    closing = writer.completed("length", {"prompt_tokens": 2, "completion_tokens": 1})
    events = [strict(e.data) for e in [*opening, delta, *closing]]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    end = events[-1]
    assert end.type == "response.incomplete"
    assert end.response.status == "incomplete"
    assert end.response.incomplete_details.reason == "max_output_tokens"
    assert end.response.output_text == "x"
    assert end.response.usage.total_tokens == 3
