"""The real llama.cpp server (tests/integration/llama_server.py) starts on the
tiny model the tests write and streams a chat completion: words, one a delta,
the role first, `finish_reason` last, then `data: [DONE]`. Skips, saying how to
install it, where llama-cpp-python is not installed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.llama_server import (
    MODEL_ALIAS,
    llama_server,
    require_llama_server,
    write_tiny_gguf,
)

pytestmark = pytest.mark.integration

ANSWER_TOKENS = 200


@pytest.fixture(scope="module")
def llama_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_llama_server()
    model = write_tiny_gguf(tmp_path_factory.mktemp("llama") / "tiny.gguf")
    with llama_server(model, n_ctx=2048, log_dir=tmp_path_factory.mktemp("llama-logs")) as url:
        yield url


def test_the_tiny_model_streams_words_until_max_tokens(llama_url: str) -> None:
    models = httpx.get(llama_url + "/models", timeout=10.0).json()
    assert [m["id"] for m in models["data"]] == [MODEL_ALIAS]
    events: list[str] = []
    body = {"model": MODEL_ALIAS, "stream": True, "max_tokens": ANSWER_TOKENS,
            "messages": [{"role": "user", "content": "Say something long."}]}
    with httpx.stream("POST", llama_url + "/chat/completions", json=body,
                      timeout=60.0) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
    assert events[-1] == "[DONE]", events[-3:]
    chunks: list[dict[str, Any]] = [json.loads(event) for event in events[:-1]]
    choices = [chunk["choices"][0] for chunk in chunks]
    assert choices[0]["delta"] == {"role": "assistant"}
    contents = [c["delta"]["content"] for c in choices[1:-1]]
    # Never the end of sequence: every token up to max_tokens, each a printable word.
    assert len(contents) == ANSWER_TOKENS
    assert all(text.strip() and text.isprintable() for text in contents), contents[:20]
    assert choices[-1]["finish_reason"] == "length"
    assert all(c["finish_reason"] is None for c in choices[:-1])
    assert {chunk["model"] for chunk in chunks} == {MODEL_ALIAS}
