"""The fake model's tool calls: arguments from a schema, their cut into deltas,
the interleaving of several calls, and the engine's checks on the request."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.engine.backends.base import ChatMessage, GenerationInput, InvalidRequest, ToolSpec
from services.engine.backends.fake import Clock, FakeModel, FakeTiming, calls_tools
from services.engine.backends.tool_calls import (
    MIN_PIECES,
    call_id,
    deltas,
    example_value,
    plan,
    split_pieces,
)
from services.engine.servicer import to_generation_input
from services.engine.settings import EngineSettings, FakeModelDefaults
from streamlab_protocol.engine.v1 import engine_pb2 as pb

pytestmark = pytest.mark.anyio

WEATHER = ToolSpec("get_weather", "", {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}})
TIME = ToolSpec("get_time", "", {"type": "object", "properties": {
    "city": {"type": "string"}, "hours_ahead": {"type": "integer", "minimum": 0}}})


@pytest.mark.parametrize("text", ["", "{}", "abc", '{"city": "example city"}', "x" * 101])
def test_split_pieces_rejoin_to_the_text_in_at_most_five_non_empty_pieces(text: str) -> None:
    pieces = split_pieces(text)
    assert "".join(pieces) == text
    assert len(pieces) == max(1, min(MIN_PIECES, len(text)))
    if text:
        assert all(pieces)
    # As even as they go: no piece more than one character longer than another.
    assert max(map(len, pieces)) - min(map(len, pieces)) <= 1


@pytest.mark.parametrize(("schema", "value"), [
    ({"type": "string"}, "example value"),
    ({"type": "integer"}, 1),
    ({"type": "integer", "minimum": 5}, 5),
    ({"type": "number"}, 1.5),
    ({"type": "boolean"}, True),
    ({"type": "null"}, None),
    ({"type": ["null", "integer"]}, 1),
    ({"enum": ["b", "a"]}, "b"),
    ({"const": 7, "type": "integer"}, 7),
    ({"default": "x", "type": "string"}, "x"),
    ({"anyOf": [{"type": "boolean"}, {"type": "string"}]}, True),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 2}, [1, 1]),
    ({"type": "object", "properties": {"a": {"type": "object", "properties": {
        "b": {"type": "string"}}}}}, {"a": {"b": "example b"}}),
    ({}, "example value"),
])
def test_example_values_follow_the_schema(schema: dict[str, Any], value: Any) -> None:
    assert example_value(schema) == value


def test_a_self_nesting_schema_still_ends() -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {}}
    schema["properties"]["child"] = schema  # a loop, as a resolved $ref can make
    depth, node = 0, example_value(schema)
    while isinstance(node, dict):
        node, depth = node["child"], depth + 1
    assert node is None
    assert depth <= 10


def test_call_ids_are_openai_shaped_stable_and_distinct() -> None:
    assert call_id("r", 0) == call_id("r", 0)
    assert len({call_id("r", 0), call_id("r", 1), call_id("s", 0)}) == 3
    assert call_id("r", 0).startswith("call_")
    assert len(call_id("r", 0)) == len("call_") + 24


def test_plan_cycles_the_offered_tools_or_repeats_the_forced_one() -> None:
    tools = (WEATHER, TIME)
    assert [c.name for c in plan(tools, None, 3, "r")] == ["get_weather", "get_time",
                                                            "get_weather"]
    assert [c.name for c in plan(tools, "get_time", 2, "r")] == ["get_time", "get_time"]
    assert [c.index for c in plan(tools, None, 3, "r")] == [0, 1, 2]
    assert json.loads(plan(tools, None, 1, "r")[0].arguments) == {
        "city": "example city", "unit": "celsius"}


def test_two_calls_interleave_by_index_each_head_first_then_its_pieces() -> None:
    calls = plan((WEATHER, TIME), None, 2, "req")
    out = deltas(calls)
    assert [d.index for d in out] == [0, 1] * (1 + MIN_PIECES)
    for call in calls:
        mine = [d for d in out if d.index == call.index]
        head, rest = mine[0], mine[1:]
        assert (head.id, head.name, head.arguments) == (call.id, call.name, "")
        assert all((d.id, d.name) == ("", "") for d in rest)
        assert len(rest) >= MIN_PIECES
        assert json.loads("".join(d.arguments for d in rest)) == json.loads(call.arguments)


def test_calls_of_unequal_length_still_carry_every_piece() -> None:
    short = ToolSpec("ping", "", {})  # "{}": two characters, two pieces
    out = deltas(plan((WEATHER, short), None, 2, "r"))
    assert [d.index for d in out][:6] == [0, 1, 0, 1, 0, 1]
    assert "".join(d.arguments for d in out if d.index == 1) == "{}"
    assert out[-1].index == 0


class Counter:
    def __init__(self) -> None:
        self.made = 0

    def generated(self) -> None:
        self.made += 1


@pytest.mark.parametrize("clock", ["batched", "per_stream"])
async def test_the_fake_model_streams_the_planned_deltas_one_step_each(clock: Clock) -> None:
    model = FakeModel(FakeModelDefaults(prefill_ms=0, token_gap_ms=1, answer_tokens=3))
    request = GenerationInput("r", "", (), max_tokens=2, tools=(WEATHER, TIME))
    timing = FakeTiming(prefill_ms=0, token_gap_ms=1, answer_tokens=3,
                        clock=clock, tool_calls=2)
    counter = Counter()
    got = [item async for item in model.generate(request, timing, counter)]
    expected = deltas(plan(request.tools, None, 2, "r"))
    assert got == expected  # neither answer_tokens nor max_tokens cut a call's JSON
    assert counter.made == len(expected)
    assert not model.finished_by_length(request, timing, counter.made)
    await model.aclose()


def test_the_tool_call_count_is_a_timing_option_at_least_one() -> None:
    model = FakeModel(FakeModelDefaults())
    assert model.options(pb.GenerateRequest(prompt="x")).tool_calls == 1
    two = pb.GenerateRequest(prompt="x", timing=pb.FakeModelTiming(tool_calls=2))
    assert model.options(two).tool_calls == 2
    with pytest.raises(InvalidRequest, match=r"timing\.tool_calls"):
        model.options(pb.GenerateRequest(prompt="x", timing=pb.FakeModelTiming(tool_calls=0)))


def wire_tools(*names: str, parameters: str = '{"type": "object"}') -> list[pb.Tool]:
    return [pb.Tool(name=name, parameters_json=parameters) for name in names]


def test_the_engine_reads_tools_and_the_choice() -> None:
    settings = EngineSettings()
    auto = to_generation_input(pb.GenerateRequest(prompt="x", tools=wire_tools("a", "b")),
                               settings)
    assert [t.name for t in auto.tools] == ["a", "b"]
    assert auto.tools[0].parameters == {"type": "object"}
    assert auto.forced_tool is None
    none = to_generation_input(pb.GenerateRequest(
        prompt="x", tools=wire_tools("a"),
        tool_choice=pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_NONE)), settings)
    assert none.tools == ()  # the model answers text
    forced = to_generation_input(pb.GenerateRequest(
        prompt="x", tools=wire_tools("a", "b"),
        tool_choice=pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_FUNCTION, function="b")), settings)
    assert forced.forced_tool == "b"


@pytest.mark.parametrize(("request_", "named"), [
    (pb.GenerateRequest(prompt="x", tools=wire_tools("a", parameters="{nope")),
     r"tools\.0\.parameters_json"),
    (pb.GenerateRequest(prompt="x", tools=wire_tools("a", parameters="[1]")),
     r"tools\.0\.parameters_json"),
    (pb.GenerateRequest(prompt="x", tools=wire_tools("")), r"tools\.0\.name"),
    (pb.GenerateRequest(prompt="x", tool_choice=pb.ToolChoice(
        mode=pb.TOOL_CHOICE_MODE_REQUIRED)), "tool_choice"),
    (pb.GenerateRequest(prompt="x", tools=wire_tools("a"), tool_choice=pb.ToolChoice(
        mode=pb.TOOL_CHOICE_MODE_FUNCTION, function="b")), "tool_choice"),
])
def test_bad_tool_requests_are_refused_naming_the_field(request_: pb.GenerateRequest,
                                                        named: str) -> None:
    with pytest.raises(InvalidRequest, match=named):
        to_generation_input(request_, EngineSettings())


@pytest.mark.parametrize(("last_role", "required", "calls"), [
    ("user", False, True), ("tool", False, False), ("tool", True, True)])
def test_after_a_tool_s_result_the_fake_model_answers_text_unless_a_call_is_required(
        last_role: str, required: bool, calls: bool) -> None:
    messages = (ChatMessage("user", "hi"), ChatMessage(last_role, "12 C"))
    request = GenerationInput("r", "", messages, max_tokens=5, tools=(WEATHER,),
                              tool_required=required)
    assert calls_tools(request) is calls
    assert not calls_tools(GenerationInput("r", "", messages, max_tokens=5))


def test_a_named_or_required_choice_marks_the_call_required() -> None:
    def read(mode: pb.ToolChoiceMode, function: str = "") -> GenerationInput:
        return to_generation_input(pb.GenerateRequest(
            prompt="x", tools=wire_tools("a"),
            tool_choice=pb.ToolChoice(mode=mode, function=function)), EngineSettings())

    assert read(pb.TOOL_CHOICE_MODE_REQUIRED).tool_required
    assert read(pb.TOOL_CHOICE_MODE_FUNCTION, "a").tool_required
    assert not read(pb.TOOL_CHOICE_MODE_AUTO).tool_required
