"""The chat route's fast path (services/gateway/app.py, ChatFastPath) answers
as FastAPI's stack does: every request below is sent twice to one running
gateway, once through the app (the fast path) and once through FastAPI's
stack alone (`app.fastapi`), and the two answers must be the same bytes
(status, headers, body; only the `created` second may differ). A valid body
must be answered without FastAPI's stack (that is the cut), and anything
else must be handed to it."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import httpx
import pytest
from starlette.types import Receive, Scope, Send

from services.gateway.app import GatewayApp, parse_chat
from services.gateway.errors import EngineError
from tests.unit.gateway.inprocess import Running, chat, running
from tests.unit.gateway.scripted_engine import ScriptedEngine
from tests.unit.gateway.test_bad_input import BAD_BODIES

pytestmark = pytest.mark.anyio
CHAT = "/v1/chat/completions"
JSON = {"content-type": "application/json"}
VALID = b'{"messages": [{"role": "user", "content": "hi"}], "stream": true}'
_CREATED = re.compile(rb'"created":\s*\d+')


async def both(gw: Running, content: bytes, headers: dict[str, str]
               ) -> tuple[httpx.Response, httpx.Response]:
    """The same request through the app, then through FastAPI's stack alone."""
    app = gw.app
    assert isinstance(app, GatewayApp)
    headers = {"x-request-id": "same-id", **headers}  # the same ids in both answers
    fast = await gw.http.post(CHAT, content=content, headers=headers)
    transport = httpx.ASGITransport(app=app.fastapi)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as slow:
        plain = await slow.post(CHAT, content=content, headers=headers)
    return fast, plain


def assert_same(fast: httpx.Response, plain: httpx.Response) -> None:
    assert fast.status_code == plain.status_code, (fast.text, plain.text)
    assert fast.headers.multi_items() == plain.headers.multi_items()
    assert _CREATED.sub(b"", fast.content) == _CREATED.sub(b"", plain.content)


def count_handbacks(gw: Running, monkeypatch: pytest.MonkeyPatch) -> list[Scope]:
    """Every request the fast path hands to FastAPI's stack, recorded."""
    app = gw.app
    assert isinstance(app, GatewayApp)
    handed: list[Scope] = []
    original: Callable[[Scope, Receive, Send], Awaitable[None]] = app.fastapi

    async def fastapi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == CHAT:
            handed.append(scope)
        await original(scope, receive, send)

    monkeypatch.setattr(app, "fastapi", fastapi)
    return handed


# Requests the fast path answers itself.
TAKEN: dict[str, tuple[bytes, dict[str, str]]] = {
    "streamed": (VALID, JSON),
    "not streamed": (VALID.replace(b"true", b"false"), JSON),
    "charset and case": (VALID, {"content-type": "Application/JSON; charset=utf-8"}),
    "unknown model (404 from the lease)": (
        b'{"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}', JSON),
    "bad X-Request-Id (400 from the route)": (VALID, {**JSON, "x-request-id": "a b"}),
    "prompt too long (400 from the lease)": (
        b'{"messages": [{"role": "user", "content": "' + b"x" * 200 + b'"}]}', JSON),
}
# Requests it hands to FastAPI: a body FastAPI would not take as it is.
HANDED: dict[str, tuple[bytes, dict[str, str]]] = {
    "no content type": (VALID, {}),
    "text/plain": (VALID, {"content-type": "text/plain"}),
    "+json": (VALID, {"content-type": "application/vnd.streamlab+json"}),
    "empty": (b"", JSON),
    "not JSON": (b'{"messages": [', JSON),
    "not UTF-8": (b'{"messages": "\xff"}', JSON),
    "a JSON list": (b"[1, 2]", JSON),
    "nested past the recursion limit": (b"[" * 100_000, JSON),
    "NaN temperature": (VALID[:-1] + b', "temperature": NaN}', JSON),
    "huge number": (VALID[:-1] + b', "max_tokens": 1e400}', JSON),
    **{f"bad body: {name}": (raw, JSON) for name, (raw, _) in BAD_BODIES.items()},
}


@pytest.mark.parametrize("case", list(TAKEN))
async def test_the_fast_path_answers_a_valid_body_as_fastapi_does(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    content, headers = TAKEN[case]
    async with running(max_prompt_chars=100) as gw:
        handed = count_handbacks(gw, monkeypatch)
        fast, plain = await both(gw, content, headers)
        assert len(handed) == 1, "the fast path handed a valid body to FastAPI"
        assert_same(fast, plain)


@pytest.mark.parametrize("case", list(HANDED))
async def test_anything_else_is_handed_to_fastapi_and_answered_as_before(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    content, headers = HANDED[case]
    async with running() as gw:
        handed = count_handbacks(gw, monkeypatch)
        fast, plain = await both(gw, content, headers)
        assert len(handed) == 2, "the fast path answered a body FastAPI would not take"
        assert_same(fast, plain)
        assert not gw.engine.calls or fast.status_code == 200


async def test_an_engine_refusal_is_the_same_status_and_retry_after() -> None:
    refusal = EngineError.from_status(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full",
                                      retry_after_s=7)
    async with running(ScriptedEngine(refusal=refusal)) as gw:
        fast, plain = await both(gw, VALID, JSON)
        assert fast.status_code == 429
        assert fast.headers["retry-after"] == "7"
        assert_same(fast, plain)


@pytest.mark.parametrize("key", [None, "wrong", "sk-a"])
async def test_auth_and_the_body_limit_still_stand_in_front(key: str | None) -> None:
    headers = {**JSON, **({"authorization": f"Bearer {key}"} if key else {})}
    async with running(api_keys=["sk-a"], max_body_bytes=1024) as gw:
        fast, plain = await both(gw, VALID, headers)
        assert fast.status_code == (200 if key == "sk-a" else 401)
        assert_same(fast, plain)
        big = VALID.replace(b'"hi"', b'"' + b"x" * 2000 + b'"')
        fast, plain = await both(gw, big, headers)
        assert fast.status_code == (413 if key == "sk-a" else 401)
        assert_same(fast, plain)


def test_parse_chat_takes_only_what_fastapi_would_parse_and_accept() -> None:
    def scope(content_type: bytes | None) -> dict[str, Any]:
        return {"headers": [] if content_type is None else [(b"content-type", content_type)]}

    assert parse_chat(scope(b"application/json"), VALID) is not None
    assert parse_chat(scope(b" application/JSON ;charset=utf-8"), VALID) is not None
    for content_type in (None, b"text/plain", b"application/jsonx", b"application/json, a/b"):
        assert parse_chat(scope(content_type), VALID) is None, content_type
    for body in (b"", b"{", b"[]", b'{"messages": []}', b"\xff", b"[" * 100_000):
        assert parse_chat(scope(b"application/json"), body) is None, body
    assert chat()  # the helper's body is one the fast path takes
    assert parse_chat(scope(b"application/json"),
                      b'{"messages": [{"role": "user", "content": "hi"}]}') is not None
