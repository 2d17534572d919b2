"""Mapping an OpenAI-compatible upstream onto the engine: bodies, chunks, errors."""

from __future__ import annotations

import json

import pytest

from services.engine.backends.base import ChatMessage, GenerationInput
from services.engine.backends.fake import FakeTiming, ThinkPause
from services.engine.backends.openai_upstream import (
    OpenAIUpstream,
    http_error,
    parse_chunk,
    request_body,
    status_for_http,
)
from services.engine.settings import FakeModelDefaults, OpenAIUpstreamSettings
from streamlab_protocol.engine.v1 import engine_pb2 as pb

TIMING = FakeTiming(prefill_ms=10, token_gap_ms=5, answer_tokens=7,
                    pauses=(ThinkPause(after_token=2, pause_ms=100),))


def generation(**overrides: object) -> GenerationInput:
    fields: dict[str, object] = {
        "request_id": "r1", "prompt": "", "messages": (ChatMessage("user", "hi"),),
        "max_tokens": 4096,
    }
    fields.update(overrides)
    return GenerationInput(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("status", "expected"), [
    (400, "INVALID_ARGUMENT"), (422, "INVALID_ARGUMENT"), (401, "UNAUTHENTICATED"),
    (403, "PERMISSION_DENIED"), (404, "NOT_FOUND"), (429, "RESOURCE_EXHAUSTED"),
    (500, "UNAVAILABLE"), (502, "UNAVAILABLE"), (503, "UNAVAILABLE"),
    (504, "DEADLINE_EXCEEDED"), (418, "INTERNAL"),
])
def test_http_statuses_map_to_grpc_statuses(status: int, expected: str) -> None:
    assert status_for_http(status) == expected


def test_an_openai_error_body_keeps_the_upstreams_message_and_code() -> None:
    body = json.dumps({"error": {"message": "model `x` does not exist", "type": "invalid",
                                 "code": "model_not_found"}}).encode()
    error = http_error(404, body)
    assert error.status == "NOT_FOUND"
    assert error.code == "upstream_model_not_found"
    assert "model `x` does not exist" in error.message


def test_a_non_json_error_body_is_quoted() -> None:
    error = http_error(502, b"<html>bad gateway</html>")
    assert error.status == "UNAVAILABLE"
    assert "bad gateway" in error.message


def test_only_a_limit_the_client_set_is_sent_upstream() -> None:
    settings = OpenAIUpstreamSettings(base_url="http://x/v1", model="m")
    assert "max_tokens" not in request_body(generation(), settings)
    body = request_body(generation(max_tokens=12, requested_max_tokens=12), settings)
    assert body["max_tokens"] == 12
    assert body["model"] == "m"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert "streamlab" not in body


def test_a_raw_prompt_becomes_one_user_message() -> None:
    body = request_body(generation(prompt="once upon", messages=()),
                        OpenAIUpstreamSettings(base_url="http://x/v1"))
    assert body["messages"] == [{"role": "user", "content": "once upon"}]
    assert "model" not in body


def test_fake_timing_goes_as_the_streamlab_field() -> None:
    settings = OpenAIUpstreamSettings(base_url="http://x/v1", forward_streamlab_timing=True)
    assert request_body(generation(), settings, TIMING)["streamlab"] == {
        "prefill_ms": 10, "token_gap_ms": 5, "answer_tokens": 7,
        "pauses": [{"after_token": 2, "pause_ms": 100}],
    }


@pytest.mark.anyio
async def test_fake_timing_is_forwarded_only_when_asked() -> None:
    request = pb.GenerateRequest(prompt="x", timing=pb.FakeModelTiming(
        prefill_ms=10, answer_tokens=7, pauses=[pb.ThinkPause(after_token=2, pause_ms=100)]))
    defaults = FakeModelDefaults(prefill_ms=300, token_gap_ms=5, answer_tokens=50)
    plain = OpenAIUpstream(OpenAIUpstreamSettings(base_url="http://x/v1"), defaults)
    forwarding = OpenAIUpstream(
        OpenAIUpstreamSettings(base_url="http://x/v1", forward_streamlab_timing=True), defaults)
    try:
        assert plain.options(request).timing is None
        # The request's fields, and this engine's fake defaults for those it left unset.
        assert forwarding.options(request).timing == TIMING
    finally:
        await plain.aclose()
        await forwarding.aclose()


def test_chunks_map_to_text_finish_and_usage() -> None:
    first = parse_chunk({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                      "finish_reason": None}]})
    assert first.text == ""
    assert first.finish_reason is None
    token = parse_chunk({"choices": [{"index": 0, "delta": {"content": "café "}}]})
    assert token.text == "café "
    finish = parse_chunk({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    assert finish.finish_reason == "length"
    usage = parse_chunk({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9}})
    assert usage.usage == {"prompt_tokens": 3, "completion_tokens": 9}


def test_an_error_event_is_an_error() -> None:
    assert parse_chunk({"error": {"message": "engine went away"}}).error == "engine went away"
    assert parse_chunk(["not", "an", "object"]).error is not None


def test_stop_sequences_go_upstream_only_when_asked_for() -> None:
    settings = OpenAIUpstreamSettings(base_url="http://x/v1")
    assert "stop" not in request_body(generation(), settings)
    assert request_body(generation(stop=("\n\n", "END")), settings)["stop"] == ["\n\n", "END"]


@pytest.mark.anyio
async def test_the_client_s_sampling_options_go_to_the_upstream_as_openai_s_fields() -> None:
    """temperature, top_p, seed, ... were dropped at the gateway; now they ride
    the wire (GenerateRequest.sampling) and this backend sends the ones set."""
    request = pb.GenerateRequest(prompt="x", sampling=pb.SamplingOptions(
        temperature=0.25, seed=7, frequency_penalty=-1.5))
    upstream = OpenAIUpstream(OpenAIUpstreamSettings(base_url="http://x/v1"),
                              FakeModelDefaults(prefill_ms=0, token_gap_ms=0, answer_tokens=1))
    try:
        options = upstream.options(request)
        body = request_body(generation(), OpenAIUpstreamSettings(base_url="http://x/v1"),
                            options.timing, options.sampling)
        assert (body["temperature"], body["seed"], body["frequency_penalty"]) == (0.25, 7, -1.5)
        assert "top_p" not in body  # unset: the upstream's default
        assert upstream.options(pb.GenerateRequest(prompt="x")).sampling == ()
    finally:
        await upstream.aclose()
