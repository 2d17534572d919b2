"""Tool calls through the whole topology (edge, gateway, engine hop, fake model),
read by the official `openai` SDK's own stream helper: what a client that
assembles tool-call deltas by index gets out of this lab."""

from __future__ import annotations

import json
import uuid
from contextlib import AbstractAsyncContextManager
from typing import Any

import grpc
import openai
import pytest

from services.engine.backends.fake import FakeModel
from services.engine.backends.tool_calls import MIN_PIECES
from services.engine.settings import EngineSettings, FakeModelDefaults
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.engine.v1 import engine_pb2_grpc as pb_grpc
from tests.integration.engine_inproc import running_engine

pytestmark = pytest.mark.integration
MODEL = "streamlab-fake"

WEATHER: Any = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "required": ["city", "unit"], "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}}
TIME: Any = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "hours_ahead": {"type": "integer", "minimum": 0}}}}}


def fast(**fields: Any) -> dict[str, Any]:
    return {"streamlab": {"prefill_ms": 0, "token_gap_ms": 2, **fields}}


def test_two_interleaved_calls_assemble_in_the_sdk_stream_helper(sdk: openai.OpenAI) -> None:
    deltas_by_call: dict[int, int] = {}
    order: list[int] = []
    with sdk.chat.completions.stream(
            model=MODEL, messages=[{"role": "user", "content": "weather and time in Oslo?"}],
            tools=[WEATHER, TIME], extra_body=fast(tool_calls=2),
            extra_headers={"X-Request-Id": f"tools-{uuid.uuid4().hex[:8]}"}) as stream:
        for event in stream:
            if event.type == "tool_calls.function.arguments.delta":
                deltas_by_call[event.index] = deltas_by_call.get(event.index, 0) + 1
                order.append(event.index)
        final = stream.get_final_completion()

    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert [call.type for call in calls] == ["function", "function"]
    named = {call.function.name: call for call in calls}
    assert set(named) == {"get_weather", "get_time"}
    assert json.loads(named["get_weather"].function.arguments) == {
        "city": "example city", "unit": "celsius"}
    assert json.loads(named["get_time"].function.arguments) == {
        "city": "example city", "hours_ahead": 0}
    assert all(call.id.startswith("call_") for call in calls)
    assert len({call.id for call in calls}) == 2
    # Each call's arguments came in pieces, and the two calls' pieces interleaved.
    assert min(deltas_by_call[0], deltas_by_call[1]) >= MIN_PIECES
    assert order[:4] == [0, 1, 0, 1]


def test_a_named_choice_calls_that_tool_and_no_streaming_assembles_it(
        sdk: openai.OpenAI) -> None:
    completion = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "time?"}], tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        extra_body=fast())
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls or []
    assert [call.function.name for call in calls] == ["get_time"]  # type: ignore[union-attr]
    assert json.loads(calls[0].function.arguments)["hours_ahead"] == 0  # type: ignore[union-attr]


def test_a_call_then_its_result_then_a_text_answer(sdk: openai.OpenAI) -> None:
    """The loop an agent runs: the model calls, the client answers each call
    with a `tool` message and sends the history back (the assistant's turn with
    `content: null`), and the model answers in text."""
    messages: list[Any] = [{"role": "user", "content": "weather in Oslo?"}]
    first = sdk.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER],
                                        extra_body=fast())
    turn = first.choices[0].message
    assert turn.tool_calls
    messages.append(turn.model_dump(exclude_none=False, include={"role", "content",
                                                                  "tool_calls"}))
    messages += [{"role": "tool", "tool_call_id": call.id, "content": "12 C, cloudy"}
                 for call in turn.tool_calls]
    second = sdk.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER],
                                         extra_body=fast(answer_tokens=4))
    choice = second.choices[0]
    assert (choice.finish_reason, choice.message.tool_calls) == ("stop", None)
    assert choice.message.content
    # tool_choice "required" asks for another call even after a result.
    third = sdk.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER],
                                        tool_choice="required", extra_body=fast())
    assert third.choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_answers_text(sdk: openai.OpenAI) -> None:
    completion = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], tools=[WEATHER],
        tool_choice="none", extra_body=fast(answer_tokens=3))
    choice = completion.choices[0]
    assert (choice.finish_reason, choice.message.tool_calls) == ("stop", None)
    assert choice.message.content


def test_unserved_options_are_refused_by_name(sdk: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as json_mode:
        sdk.chat.completions.create(model=MODEL, messages=messages,
                                    response_format={"type": "json_object"})
    assert json_mode.value.param == "response_format.type"
    with pytest.raises(openai.BadRequestError) as logprobs:
        sdk.chat.completions.create(model=MODEL, messages=messages, logprobs=True)
    assert logprobs.value.param == "logprobs"


# ---- the engine alone, in this process, over real gRPC -----------------------------

class NoToolsModel(FakeModel):
    """The fake model's text, from a backend that cannot call tools (as hf and openai)."""

    name = "no-tools"
    calls_tools = False


def generate(**fields: Any) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=f"eng-{uuid.uuid4().hex[:8]}", prompt="hi",
        tools=[pb.Tool(name="get_time",
                       parameters_json=json.dumps(TIME["function"]["parameters"]))],
        timing=pb.FakeModelTiming(prefill_ms=0, token_gap_ms=1, tool_calls=2), **fields)


def engine(backend: FakeModel | None = None
           ) -> AbstractAsyncContextManager[pb_grpc.EngineServiceStub]:
    return running_engine(EngineSettings(), backend or FakeModel(FakeModelDefaults()))


@pytest.mark.anyio
async def test_the_engine_streams_tool_call_events_then_a_tool_calls_finish() -> None:
    async with engine() as stub:
        request = generate()
        responses = [r async for r in stub.Generate(request, timeout=10)]
        record = await stats(stub, request.request_id)
    kinds = [r.WhichOneof("event") for r in responses]
    assert set(kinds[:-1]) == {"tool_call"}
    assert kinds[-1] == "finish"
    finish = responses[-1].finish
    assert finish.reason == pb.FINISH_REASON_TOOL_CALLS
    assert finish.usage.completion_tokens == len(kinds) - 1  # one decode step per delta
    pieces = [r.tool_call for r in responses[:-1]]
    assert [p.index for p in pieces[:4]] == [0, 1, 0, 1]
    for index in (0, 1):
        assert json.loads("".join(p.arguments for p in pieces if p.index == index)) == {
            "city": "example city", "hours_ahead": 0}
    assert record.generations[0].tokens_generated == len(pieces)


@pytest.mark.anyio
@pytest.mark.parametrize(("backend", "fields", "named"), [
    (NoToolsModel(FakeModelDefaults()), {}, "the no-tools backend does not call tools"),
    (None, {"detachable": True}, "detachable"),
])
async def test_the_engine_refuses_tools_it_would_drop(backend: FakeModel | None,
                                                      fields: dict[str, Any], named: str) -> None:
    async with engine(backend) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            [r async for r in stub.Generate(generate(**fields), timeout=10)]
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert named in (refused.value.details() or "")
        assert (await stats(stub)).generations_started == 0


async def stats(stub: pb_grpc.EngineServiceStub, request_id: str = "") -> pb.GetStatsResponse:
    response: pb.GetStatsResponse = await stub.GetStats(
        pb.GetStatsRequest(request_id=request_id), timeout=5)
    return response
