"""What OpenAI clients parse, through the in-process gateway: tool-call chunks
and their assembly, `usage: null` on every chunk but the last with
include_usage, and the options this gateway refuses by name."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.gateway.engine_client import EngineStream
from services.gateway.openai_api import ChunkWriter, ToolCallAssembler
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from tests.unit.gateway.inprocess import chat, running, sse_data
from tests.unit.gateway.scripted_engine import EOF, Script, ScriptedEngine

pytestmark = pytest.mark.anyio
CHAT = "/v1/chat/completions"
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "b"}}]

# Two calls, interleaved by index, as the fake model streams them.
DELTAS = [
    pb.ToolCallDelta(index=0, id="call_0", name="a"),
    pb.ToolCallDelta(index=1, id="call_1", name="b"),
    pb.ToolCallDelta(index=0, arguments='{"x"'),
    pb.ToolCallDelta(index=1, arguments='{"y"'),
    pb.ToolCallDelta(index=0, arguments=": 1}"),
    pb.ToolCallDelta(index=1, arguments=": 2}"),
]


class ToolCallCall:
    """A scripted engine call that answers with DELTAS, then a TOOL_CALLS finish."""

    def __init__(self, request: pb.GenerateRequest) -> None:
        self.request = request
        self._messages = [pb.GenerateResponse(tool_call=d) for d in DELTAS] + [
            pb.GenerateResponse(finish=pb.Finish(
                reason=pb.FINISH_REASON_TOOL_CALLS,
                usage=pb.Usage(prompt_tokens=1, completion_tokens=len(DELTAS))))]

    async def read(self) -> object:
        return self._messages.pop(0) if self._messages else EOF

    def cancel(self) -> bool:
        return True


class ToolCallEngine(ScriptedEngine):
    def __init__(self) -> None:
        super().__init__()
        self.requests: list[pb.GenerateRequest] = []

    async def open(self, request: pb.GenerateRequest) -> EngineStream:
        self.requests.append(request)
        return EngineStream(ToolCallCall(request), request.request_id, 30.0, 3600.0)


def with_tools(stream: bool, **extra: Any) -> dict[str, Any]:
    return {**chat(stream=stream), "tools": TOOLS, **extra}


def test_a_call_s_first_delta_names_it_and_later_ones_carry_only_arguments() -> None:
    writer = ChunkWriter("rid", "m")
    head = json.loads(writer.tool_call(DELTAS[0]))["choices"][0]
    assert head["delta"] == {"role": "assistant", "content": None, "tool_calls": [
        {"index": 0, "id": "call_0", "type": "function",
         "function": {"name": "a", "arguments": ""}}]}
    assert head["finish_reason"] is None
    piece = json.loads(writer.tool_call(DELTAS[2]))["choices"][0]
    assert piece["delta"] == {"tool_calls": [{"index": 0, "function": {"arguments": '{"x"'}}]}
    end = json.loads(writer.finish(pb.Finish(reason=pb.FINISH_REASON_TOOL_CALLS)))
    assert end["choices"][0]["finish_reason"] == "tool_calls"


def test_the_assembler_joins_interleaved_pieces_by_index() -> None:
    assembler = ToolCallAssembler()
    for delta in reversed(DELTAS[:2]):
        assembler.add(delta)  # calls first seen out of order still come out by index
    for delta in DELTAS[2:]:
        assembler.add(delta)
    assert assembler.calls() == [
        {"id": "call_0", "type": "function", "function": {"name": "a", "arguments": '{"x": 1}'}},
        {"id": "call_1", "type": "function", "function": {"name": "b", "arguments": '{"y": 2}'}},
    ]


async def test_tools_and_the_choice_reach_the_engine_request() -> None:
    engine = ToolCallEngine()
    async with running(engine) as gw:
        body = with_tools(False, tool_choice={"type": "function", "function": {"name": "b"}})
        body["streamlab"] = {"tool_calls": 2}
        assert (await gw.http.post(CHAT, json=body)).status_code == 200
    request = engine.requests[-1]
    assert [(t.name, t.parameters_json) for t in request.tools] == [
        ("a", '{"type": "object"}'), ("b", "")]
    assert (request.tool_choice.mode, request.tool_choice.function) == (
        pb.TOOL_CHOICE_MODE_FUNCTION, "b")
    assert request.timing.tool_calls == 2


async def test_a_streamed_tool_call_answer_is_openai_s_chunks() -> None:
    async with running(ToolCallEngine()) as gw:
        response = await gw.http.post(CHAT, json=with_tools(True))
    data = sse_data(response.content)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks[:-1]]
    assert [c["index"] for c in calls] == [0, 1, 0, 1, 0, 1]
    assert [c.get("id") for c in calls[:2]] == ["call_0", "call_1"]
    assert all(set(c) == {"index", "function"} for c in calls[2:])
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "tool_calls"}


async def test_a_non_streamed_tool_call_answer_assembles_message_tool_calls() -> None:
    async with running(ToolCallEngine()) as gw:
        answer = (await gw.http.post(CHAT, json=with_tools(False))).json()
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert [json.loads(c["function"]["arguments"]) for c in choice["message"]["tool_calls"]] == [
        {"x": 1}, {"y": 2}]


@pytest.mark.parametrize("include_usage", [True, False])
async def test_include_usage_puts_null_on_every_chunk_but_the_last(include_usage: bool) -> None:
    async with running(ScriptedEngine(Script(tokens=3))) as gw:
        body = {**chat(), "stream_options": {"include_usage": include_usage}}
        response = await gw.http.post(CHAT, json=body)
    data = sse_data(response.content)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    if not include_usage:
        assert all("usage" not in c for c in chunks)
        return
    assert all(c["usage"] is None for c in chunks[:-1])
    assert len(chunks[:-1]) == 4  # three tokens and the finish
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 1, "completion_tokens": 3,
                                   "total_tokens": 4}


def test_the_token_hot_path_matches_the_formatted_chunk_with_usage_null() -> None:
    fast, slow = ChunkWriter("r", "m", include_usage=True), ChunkWriter("r", "m", True)
    slow._head = fast._head  # the same `created` second
    for text in ["a ", 'q"uote ', "\u2028"]:
        assert fast.token_event(text) == f"data: {slow.token(text)}\n\n".encode()
    assert json.loads(fast.token_event("z")[6:])["usage"] is None


@pytest.mark.parametrize(("extra", "param"), [
    ({"response_format": {"type": "json_object"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.type"),
    ({"logprobs": True}, "logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "zz"}}},
     "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]},
     "tools.0.function.name"),
    ({"streamlab": {"tool_calls": 0}}, "streamlab.tool_calls"),
])
async def test_unserved_options_are_a_400_naming_the_parameter(extra: dict[str, Any],
                                                               param: str) -> None:
    async with running() as gw:
        response = await gw.http.post(CHAT, json={**chat(), **extra})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["type"]) == (param, "invalid_request_error")
    assert gw.engine.calls == []  # refused before the engine heard of it


@pytest.mark.parametrize("extra", [{"response_format": {"type": "text"}}, {"logprobs": False},
                                   {"top_logprobs": 0}, {"tools": TOOLS, "tool_choice": "none"}])
async def test_their_defaults_are_served(extra: dict[str, Any]) -> None:
    async with running() as gw:
        assert (await gw.http.post(CHAT, json={**chat(False), **extra})).status_code == 200


async def test_surfaces_that_cannot_relay_tool_calls_refuse_tools() -> None:
    async with running() as gw:
        response = await gw.http.post("/v1/jobs", json=with_tools(False))
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "tools"
    assert gw.engine.calls == []


async def test_an_assistant_turn_with_null_content_is_history_a_user_s_is_not() -> None:
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_0", "type": "function",
                    "function": {"name": "a", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "call_0", "content": "42"}]
    async with running() as gw:
        ok = await gw.http.post(CHAT, json={**chat(False), "messages": history})
        assert ok.status_code == 200
        sent = gw.engine.last.request.messages
        assert [(m.role, m.content) for m in sent] == [
            ("user", "hi"), ("assistant", ""), ("tool", "42")]
        for message in ({"role": "user", "content": None}, {"role": "user"}):
            refused = await gw.http.post(CHAT, json={**chat(False), "messages": [message]})
            assert refused.status_code == 400
            assert refused.json()["error"]["param"] == "messages.0.content"
