"""The official `openai` Python package through the edge, as a user would drop
it in: list the models, stream, leave early, ask without streaming, and see an
engine failure mid-stream become the SDK's own exception."""

from __future__ import annotations

import uuid
from typing import Any

import openai
import pytest

from streamlab.lab.local import Lab
from streamlab.lab.toxiproxy import Toxiproxy
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from tests.integration.engine_probe import wait_for_generation_end, wait_for_generation_start

pytestmark = pytest.mark.integration
MODEL = "streamlab-fake"


def timing(**fields: Any) -> dict[str, Any]:
    return {"streamlab": {"prefill_ms": 0, "token_gap_ms": 5, "answer_tokens": 8, **fields}}


def rid(name: str) -> str:
    return f"sdk-{name}-{uuid.uuid4().hex[:8]}"


def test_models_list_names_the_gateway_s_model(sdk: openai.OpenAI) -> None:
    """`models.list()` got a 404: there was no GET /v1/models."""
    assert [model.id for model in sdk.models.list()] == [MODEL]
    assert sdk.models.retrieve(MODEL).id == MODEL


def test_a_stream_reads_to_the_end(sdk: openai.OpenAI, lab: Lab) -> None:
    request_id = rid("stream")
    stream = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        stream=True, stream_options={"include_usage": True}, temperature=0.2, top_p=0.9,
        seed=3, extra_body=timing(), extra_headers={"X-Request-Id": request_id})
    texts, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            texts.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert finish == "stop"
    assert usage is not None
    assert usage.completion_tokens == 8
    assert len([t for t in texts if t]) == 8
    record = wait_for_generation_end(lab, request_id)
    assert record.state == pb.GENERATION_STATE_COMPLETED
    # The sampling options reached the engine (they were dropped at the gateway).
    sampling = record.sampling
    assert (sampling.temperature, sampling.top_p, sampling.seed) == (0.2, 0.9, 3)
    assert not sampling.HasField("presence_penalty")


def test_closing_a_stream_early_cancels_the_generation(sdk: openai.OpenAI, lab: Lab) -> None:
    request_id = rid("early-close")
    stream = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "a long one"}], stream=True,
        extra_body=timing(token_gap_ms=50, answer_tokens=400),
        extra_headers={"X-Request-Id": request_id})
    seen = 0
    for chunk in stream:
        seen += sum(1 for choice in chunk.choices if choice.delta.content)
        if seen >= 3:
            break
    stream.close()
    record = wait_for_generation_end(lab, request_id)
    assert record.state == pb.GENERATION_STATE_CANCELLED
    assert record.tokens_generated < 400


def test_a_non_streaming_call_gets_one_completion(sdk: openai.OpenAI, lab: Lab) -> None:
    request_id = rid("whole")
    completion = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": "be brief"},
                               {"role": "user", "content": "hi"}],
        max_tokens=5, extra_body=timing(answer_tokens=20),
        extra_headers={"X-Request-Id": request_id})
    assert completion.object == "chat.completion"
    assert completion.choices[0].finish_reason == "length"
    assert completion.choices[0].message.content
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 5
    # No sampling options sent, none recorded: the backend's defaults apply.
    assert not wait_for_generation_end(lab, request_id).HasField("sampling")


def test_refusals_are_the_sdk_s_typed_errors(sdk: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.NotFoundError) as unknown:
        sdk.chat.completions.create(model="gpt-9", messages=messages)
    assert unknown.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as two:
        sdk.chat.completions.create(model=MODEL, messages=messages, n=2)
    assert (two.value.code, two.value.param) == ("invalid_request", "n")
    with pytest.raises(openai.BadRequestError) as image:
        sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.invalid/a.png"}}]}])
    assert image.value.param == "messages.0.content.0.type"


def test_an_engine_failure_mid_stream_raises_in_the_sdk(sdk: openai.OpenAI, lab: Lab,
                                                        toxiproxy: Toxiproxy) -> None:
    """After the first byte the status is sent: the failure is an error event,
    which the SDK raises as APIError instead of ending the stream quietly."""
    request_id = rid("mid-stream")
    stream = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True,
        extra_body=timing(token_gap_ms=50, answer_tokens=200),
        extra_headers={"X-Request-Id": request_id})
    seen = 0
    with pytest.raises(openai.APIError) as failed:  # noqa: PT012 - the fault is mid-iteration
        for chunk in stream:
            seen += sum(1 for choice in chunk.choices if choice.delta.content)
            if seen == 3:
                wait_for_generation_start(lab, request_id)
                for hop in lab.hops_of("engine"):  # the autouse reset re-enables them
                    toxiproxy.set_enabled(hop, False)
    assert seen >= 3
    assert "engine" in failed.value.message
    assert "127.0.0.1" not in failed.value.message
