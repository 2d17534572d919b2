from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.gateway.ws_routes import parse_prompt


def test_plain_text_is_the_prompt() -> None:
    body = parse_prompt("hello there")
    assert [(m.role, m.content) for m in body.messages] == [("user", "hello there")]


def test_a_json_object_is_a_chat_request_with_timing() -> None:
    body = parse_prompt('{"messages": [{"role": "user", "content": "hi"}], '
                        '"streamlab": {"prefill_ms": 5, "answer_tokens": 3}}')
    request = body.to_engine_request("r")
    assert (request.timing.prefill_ms, request.timing.answer_tokens) == (5, 3)


def test_a_bad_json_request_is_refused() -> None:
    with pytest.raises(ValidationError):
        parse_prompt('{"messages": []}')
