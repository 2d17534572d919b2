from __future__ import annotations

import pytest

from services.gateway.errors import BadRequest
from services.gateway.ws_routes import WsPrompt


def test_plain_text_is_the_prompt() -> None:
    assert WsPrompt.parse("hello there").prompt == "hello there"
    # JSON that is not an object is still just text.
    assert WsPrompt.parse('"quoted"').prompt == '"quoted"'


def test_json_object_carries_timing_through_to_the_engine_request() -> None:
    prompt = WsPrompt.parse('{"prompt": "hi", "max_tokens": 7, '
                            '"streamlab": {"token_gap_ms": 20, "answer_tokens": 3}}')
    request = prompt.to_chat().to_engine_request("rid")
    assert request.messages[0].content == "hi"
    assert request.max_tokens == 7
    assert request.timing.token_gap_ms == 20
    assert request.timing.answer_tokens == 3


def test_bad_fields_name_themselves() -> None:
    with pytest.raises(BadRequest, match=r"streamlab\.token_gap_ms"):
        WsPrompt.parse('{"prompt": "x", "streamlab": {"token_gap_ms": -1}}')
    with pytest.raises(BadRequest, match="prompt"):
        WsPrompt.parse('{"streamlab": {}}')
