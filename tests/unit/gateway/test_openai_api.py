from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from services.gateway.openai_api import FINISH_REASONS, ChatCompletionRequest, ChunkWriter
from streamlab_protocol.engine.v1 import engine_pb2 as pb


def test_streamlab_extra_body_shapes_the_engine_request() -> None:
    body = ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.2,  # OpenAI fields the fake model ignores are accepted
        "max_tokens": 7,
        "streamlab": {"prefill_ms": 10, "token_gap_ms": 5,
                      "pauses": [{"after_token": 2, "pause_ms": 100}]},
    })
    request = body.to_engine_request("rid")
    assert request.request_id == "rid"
    assert request.max_tokens == 7
    assert (request.timing.prefill_ms, request.timing.token_gap_ms) == (10, 5)
    assert [(p.after_token, p.pause_ms) for p in request.timing.pauses] == [(2, 100)]


@pytest.mark.parametrize("streamlab", [{"prefill_ms": -1}, {"pauses": [{"after_token": 1}]},
                                       {"unknown": 1}, {"request_id": "has space"}])
def test_bad_streamlab_options_are_rejected(streamlab: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate(
            {"messages": [{"role": "user", "content": "x"}], "streamlab": streamlab})


@pytest.mark.parametrize("extra", [{"max_tokens": 2**32}, {"max_completion_tokens": 2**32},
                                   {"streamlab": {"pauses": [{"after_token": 2**32,
                                                              "pause_ms": 1}]}}])
def test_counts_past_the_wire_s_uint32_are_rejected_not_a_500(extra: dict[str, object]) -> None:
    """Found by the bad-input fuzz test against the compose lab: max_tokens=2**32
    passed validation and failed building the protobuf request (500)."""
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate(
            {"messages": [{"role": "user", "content": "x"}], **extra})


def test_chunks_are_openai_chat_completion_chunks() -> None:
    writer = ChunkWriter("rid", "m")
    first, second = json.loads(writer.token("a")), json.loads(writer.token("b"))
    assert first["object"] == "chat.completion.chunk"
    assert first["id"] == "chatcmpl-rid"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "a"}
    assert second["choices"][0]["delta"] == {"content": "b"}
    end = json.loads(writer.finish(pb.Finish(reason=pb.FINISH_REASON_LENGTH)))
    assert end["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "length"}


def test_token_event_is_byte_for_byte_the_formatted_chunk() -> None:
    """The pre-formatted hot path must never drift from the dict-built JSON."""
    from services.engine.backends.fake import WORDS
    from services.gateway.openai_api import ChunkWriter

    fast, slow = ChunkWriter("r-1", "m\u00e9"), ChunkWriter("r-1", "m\u00e9")
    slow._head = fast._head  # same `created` second
    for text in [*WORDS, 'quo"te ', "back\\slash", "new\nline", "tab\t", "\u2028", "\U0001f600"]:
        assert fast.token_event(text) == f"data: {slow.token(text)}\n\n".encode()


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("first", ["first", 'quo"te\n\u00e9', ""])
def test_the_first_token_and_the_finish_are_byte_for_byte_the_dict_built_chunks(
        include_usage: bool, first: str) -> None:
    """A two-token stream's first token and finish are pre-formatted too (its
    set-up cost): they must never drift from the dict-built JSON, with
    `stream_options.include_usage` (`"usage":null` on each) or without."""
    fast = ChunkWriter("r-\u00e9", "m\u00e9", include_usage)
    slow = ChunkWriter("r-\u00e9", "m\u00e9", include_usage)
    slow._head = fast._head  # same `created` second
    assert fast.token_event(first) == f"data: {slow.token(first)}\n\n".encode()
    assert fast.token_event("b") == f"data: {slow.token('b')}\n\n".encode()
    for reason, name in [*FINISH_REASONS.items(), (pb.FINISH_REASON_UNSPECIFIED, "stop")]:
        finish = pb.Finish(reason=reason)
        assert fast.finish(finish) == slow._dump(
            [{"index": 0, "delta": {}, "finish_reason": name}])
