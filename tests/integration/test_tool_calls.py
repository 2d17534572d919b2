"""Tool calls through the whole topology (edge, gateway, engine hop, fake model),
read by the official `openai` SDK's own stream helper: what a client that
assembles tool-call deltas by index gets out of this lab."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from services.engine.backends.tool_calls import MIN_PIECES
from streamlab.lab.local import Lab

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


@pytest.fixture
def sdk(lab: Lab) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{lab.edge_url}/v1", api_key="sk-unused",
                           max_retries=0, timeout=15.0)
    try:
        yield client
    finally:
        client.close()


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
