"""The stream's shape: what the OpenAI SDKs and LangChain assume of each chunk.

    shape       the first delta carries `role: "assistant"` (clients that build
                a message from the deltas take its role from there); the last
                chunk with a choice carries a `finish_reason` (clients tell a
                finished answer from a cut one by it); no `usage` chunk unless
                `stream_options.include_usage` asked (its `choices: []` breaks a
                client that reads `chunk.choices[0]`); which field reasoning
                deltas use, if any (`reasoning_content` or `reasoning`), is
                reported, not judged: both are in use
    tool-calls  offered a tool and told to call it: every tool-call delta has an
                `index`; `id`, `type` and the function's name come on the first
                delta of a call only (the SDKs concatenate string fields, so a
                repeated name reads `get_weatherget_weather`); the arguments
                concatenate to a JSON object
    responses   `POST /responses` with `stream: true`, where it answers: the
                events start with `response.created`, their `sequence_number`s
                count up by one, and one terminal event ends them
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from streamlab.experiments.check.registry import Session, check, streams_budget
from streamlab.experiments.check.verdict import judged, not_applicable
from streamlab.experiments.report import JSON, Check, Figure, Report
from streamlab_protocol.sse import Event, SSEDecoder

SHAPE = "the first delta has the role, the last choice a finish_reason, usage only if asked"
TOOLS = "tool-call deltas accumulate as the SDKs accumulate them"
RESPONSES = "Responses events in order, numbered, one terminal event"
WEATHER_TOOL: dict[str, JSON] = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TERMINAL = ("response.completed", "response.failed", "response.incomplete")
MAX_RESPONSE_EVENTS = 5000


@check("shape", SHAPE, headline=("role_first", "finish_last", "reasoning_field"),
       budget_s=streams_budget())
async def stream_shape(session: Session) -> Report:
    target = session.target
    body = target.body("Name three colours.", max_tokens=16,
                       lab={"prefill_ms": 0, "token_gap_ms": 5, "answer_tokens": 6})
    record = await session.stream(body)
    first = record.first_delta or {}
    last_choices = (record.last_choice_chunk or {}).get("choices") or []
    finish = next((c.get("finish_reason") for c in last_choices
                   if isinstance(c, dict) and c.get("finish_reason")), None)
    figures: dict[str, Figure] = {
        "status": record.status, "role_first": first.get("role") == "assistant",
        "first_delta": json.dumps(first)[:120] if record.first_delta is not None else None,
        "finish_last": finish is not None, "finish_reason": finish,
        "unasked_usage_chunks": record.usage_chunks,
        "reasoning_field": ",".join(sorted(record.reasoning_fields)) or "none",
        "transport_error": record.error_text or None}
    if record.status != 200 or record.first_delta is None:
        return not_applicable("shape", SHAPE, f"no delta came back (status {record.status}"
                              f"{', ' + record.error_text if record.error else ''})", figures)
    return judged("shape", SHAPE, figures, (
        Check("role_first", "==", True, "put `\"role\": \"assistant\"` on the first delta: "
                                        "clients that build the message read the role there"),
        Check("finish_last", "==", True, "send a `finish_reason` (stop, length, tool_calls) on "
                                         "the last chunk with a choice, before [DONE]"),
        Check("unasked_usage_chunks", "==", 0, "send a usage chunk only when "
                                               "stream_options.include_usage asks: its empty "
                                               "`choices` breaks clients that read choices[0]"),
    ))


def tool_call_shape(deltas: Sequence[Mapping[str, JSON]]) -> dict[str, Figure]:
    """Each rule of tool-call deltas, and the first delta that breaks it."""
    seen: set[int] = set()
    arguments: dict[int, str] = {}
    problems: list[str] = []
    no_index = repeated = missing = 0
    for n, delta in enumerate(deltas):
        index = delta.get("index")
        if not isinstance(index, int):
            no_index += 1
            problems.append(f"delta {n} has no index")
            index = 0  # read on as a lenient client would, to find the other faults too
        raw = delta.get("function")
        function: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if index not in seen:
            seen.add(index)
            if not (delta.get("id") and delta.get("type") == "function" and function.get("name")):
                missing += 1
                problems.append(f"call {index}'s first delta lacks id, type or name")
        elif delta.get("id") or function.get("name"):
            repeated += 1
            problems.append(f"call {index}'s delta {n} repeats its id or name")
        arguments[index] = arguments.get(index, "") + str(function.get("arguments") or "")
    bad_json = []
    for index, text in arguments.items():
        try:
            ok = isinstance(json.loads(text), dict)
        except ValueError:
            ok = False
        if not ok:
            bad_json.append(index)
            problems.append(f"call {index}'s arguments are not a JSON object: {text[:60]!r}")
    return {"tool_deltas": len(deltas), "calls": len(seen), "deltas_without_index": no_index,
            "first_without_id_or_name": missing, "repeated_id_or_name": repeated,
            "arguments_not_json": len(bad_json), "first_problem": problems[0] if problems else None}


@check("tool-calls", TOOLS, headline=("calls", "tool_deltas"), budget_s=streams_budget())
async def tool_calls(session: Session) -> Report:
    target = session.target
    body = target.body("What is the weather in Paris? Use the tool.", max_tokens=64,
                       lab={"prefill_ms": 0, "token_gap_ms": 5, "answer_tokens": 8},
                       tools=[WEATHER_TOOL],
                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    record = await session.stream(body)
    if record.status != 200:
        return not_applicable("tool-calls", TOOLS, f"the server refused a request with tools "
                              f"(status {record.status}: {record.error_text[:120]})")
    if not record.tool_deltas:
        return not_applicable("tool-calls", TOOLS, "told to call get_weather, the server "
                              "answered without a tool call (no tool support, or a chat "
                              "template without tools)", {"tokens": record.token_chunks})
    figures = tool_call_shape(record.tool_deltas)
    return judged("tool-calls", TOOLS, figures, (
        Check("deltas_without_index", "==", 0, "put `index` on every tool-call delta: the SDKs "
                                               "merge deltas by it"),
        Check("first_without_id_or_name", "==", 0, "send `id`, `type: function` and the name "
                                                   "on a call's first delta"),
        Check("repeated_id_or_name", "==", 0, "send the id and name once, on the first delta: "
                                              "the SDKs concatenate them (get_weatherget_weather)"),
        Check("arguments_not_json", "==", 0, "the argument fragments must concatenate to one "
                                             "JSON object"),
    ))


async def response_events(session: Session) -> tuple[int, list[Event], str]:
    target = session.target
    body: dict[str, JSON] = {"model": target.model, "input": "Name three colours.",
                             "stream": True, "max_output_tokens": 16, **target.extra_body}
    events: list[Event] = []
    decoder = SSEDecoder()
    try:
        async with session.client.stream("POST", target.api_url + "/responses", json=body,
                                         headers=target.headers()) as response:
            if response.status_code != 200:
                await response.aread()
                return response.status_code, events, ""
            async for chunk in response.aiter_bytes():
                events += [e for e in decoder.feed(chunk) if isinstance(e, Event)]
                if len(events) > MAX_RESPONSE_EVENTS or decoder.pending_chars > 1 << 20:
                    return 200, events, "the events did not end (or a line never did)"
    except httpx.HTTPError as exc:
        return 0, events, f"{type(exc).__name__}: {exc}"
    return 200, events, ""


@check("responses", RESPONSES, headline=("events", "terminal"), budget_s=streams_budget())
async def responses_order(session: Session) -> Report:
    status, events, error = await response_events(session)
    if status != 200:
        return not_applicable("responses", RESPONSES, f"POST /responses (stream) answered "
                              f"{status or 'nothing'}: no Responses API here")
    kinds, numbers = [], []
    for event in events:
        try:
            data = json.loads(event.data)
        except ValueError:
            data = {}
        kinds.append(data.get("type", event.event) if isinstance(data, dict) else event.event)
        numbers.append(data.get("sequence_number") if isinstance(data, dict) else None)
    ints = [n for n in numbers if isinstance(n, int)]
    counted = len(ints) == len(numbers) and all(b == a + 1 for a, b in itertools.pairwise(ints))
    terminals = [k for k in kinds if k in TERMINAL]
    figures: dict[str, Figure] = {
        "events": len(events), "first": kinds[0] if kinds else None,
        "terminal": terminals[-1] if terminals else None,
        "created_first": bool(kinds) and kinds[0] == "response.created",
        "sequence_counts_up": bool(numbers) and counted,
        "one_terminal_last": len(terminals) == 1 and kinds[-1] in TERMINAL,
        "text_deltas": kinds.count("response.output_text.delta"), "error": error or None}
    return judged("responses", RESPONSES, figures, (
        Check("created_first", "==", True, "start with `response.created`"),
        Check("sequence_counts_up", "==", True, "number every event: sequence_number 0, 1, 2, "
                                                "... with no gap (clients resume by it)"),
        Check("one_terminal_last", "==", True, "end with one terminal event "
                                               "(response.completed / failed / incomplete)"),
    ))
