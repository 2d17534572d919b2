"""Bad input on every surface, in-process: each case is a named 4xx with
OpenAI's error shape, or a WebSocket close with a code and a JSON reason;
never a 5xx, never a dropped connection. (tests/integration/test_bad_input.py
repeats them, and nginx's own refusals, through the edge.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from services.gateway.app import create_app
from services.gateway.errors import EngineError
from services.gateway.settings import GatewaySettings
from tests.unit.gateway.inprocess import chat, running
from tests.unit.gateway.scripted_engine import Script, ScriptedEngine

pytestmark = pytest.mark.anyio
POST_ROUTES = ["/v1/chat/completions", "/v1/jobs", "/v1/streams"]
SURROGATE = "\\ud800"  # as JSON text: the escape of a lone surrogate


def raw_chat(**fields: str) -> bytes:
    """A chat body with some fields given as raw JSON text."""
    parts = {"messages": '[{"role": "user", "content": "hi"}]', "stream": "false", **fields}
    return ("{" + ", ".join(f'"{k}": {v}' for k, v in parts.items()) + "}").encode()


def assert_openai_error(response: Any, status: int, param: str | None = None,
                        code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert error["type"] == ("rate_limit_error" if status == 429 else
                             "server_error" if status >= 500 else "invalid_request_error")
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error


BAD_BODIES = {
    # A lone surrogate decodes from JSON but cannot go on the wire as UTF-8:
    # it was a 500 (protobuf's encoder failed) on all three routes.
    "surrogate-content": (raw_chat(messages=f'[{{"role": "user", "content": "{SURROGATE}"}}]'),
                          "messages.0.content"),
    "surrogate-in-text": (raw_chat(messages=f'[{{"role": "user", "content": "a{SURROGATE}b"}}]'),
                          "messages.0.content"),
    "surrogate-stop": (raw_chat(stop=f'"{SURROGATE}"'), "stop"),
    "surrogate-stop-list": (raw_chat(stop='["ok", "\\udfff"]'), "stop.1"),
    "surrogate-model": (raw_chat(model=f'"m{SURROGATE}"'), "model"),
    "surrogate-part": (raw_chat(messages='[{"role": "user", "content": '
                                f'[{{"type": "text", "text": "{SURROGATE}"}}]}}]'),
                       "messages.0.content.0.text"),
    # OpenAI's types are strict; these were coerced and answered 200.
    "max-tokens-string": (raw_chat(max_tokens='"10"'), "max_tokens"),
    "max-tokens-bool": (raw_chat(max_tokens="true"), "max_tokens"),
    "max-tokens-float": (raw_chat(max_tokens="10.0"), "max_tokens"),
    "stream-string": (raw_chat(stream='"yes"'), "stream"),
    "stream-int": (raw_chat(stream="1"), "stream"),
    "n-2": (raw_chat(n="2"), "n"),
    "n-0": (raw_chat(n="0"), "n"),
    "temperature-string": (raw_chat(temperature='"0.5"'), "temperature"),
    "temperature-too-high": (raw_chat(temperature="2.5"), "temperature"),
    "top-p-bool": (raw_chat(top_p="true"), "top_p"),
    "seed-float": (raw_chat(seed="1.5"), "seed"),
    "image-part": (raw_chat(messages='[{"role": "user", "content": [{"type": "image_url", '
                            '"image_url": {"url": "http://x/y.png"}}]}]'),
                   "messages.0.content.0.type"),
    "part-without-text": (raw_chat(messages='[{"role": "user", "content": [{"type": "text"}]}]'),
                          "messages.0.content"),
    "streamlab-request-id-non-ascii": (raw_chat(streamlab='{"request_id": "caf\\u00e9"}'),
                                       "streamlab.request_id"),
    "streamlab-prefill-string": (raw_chat(streamlab='{"prefill_ms": "10"}'),
                                 "streamlab.prefill_ms"),
}


@pytest.mark.parametrize("route", POST_ROUTES)
@pytest.mark.parametrize("case", list(BAD_BODIES))
async def test_each_bad_body_is_a_400_naming_its_field(route: str, case: str) -> None:
    raw, param = BAD_BODIES[case]
    async with running() as gw:
        response = await gw.http.post(route, content=raw,
                                      headers={"content-type": "application/json"})
        assert_openai_error(response, 400, param=param)
        assert not gw.engine.calls, "refused, yet the engine was called"


@pytest.mark.parametrize("route", POST_ROUTES)
@pytest.mark.parametrize("value", ["café", "caf\u00e9".encode().decode("latin-1"), "a b", "",
                                   "x" * 129, "id\u00a0"])
async def test_a_request_id_header_that_is_not_short_ascii_is_a_400(route: str,
                                                                    value: str) -> None:
    """`X-Request-Id: café` reached gRPC as metadata it refuses: 502 "Invalid metadata"."""
    async with running() as gw:
        response = await gw.http.post(route, json=chat(stream=False),
                                      headers=[(b"x-request-id", value.encode("latin-1"))])
        if route != "/v1/streams":  # the resume surface names its own ids
            assert_openai_error(response, 400, param="X-Request-Id", code="invalid_request_id")
        else:
            assert response.status_code == 201


@pytest.mark.parametrize("route", POST_ROUTES)
async def test_an_unknown_model_is_a_404_and_the_gateway_s_names_are_served(route: str
                                                                           ) -> None:
    async with running(model_name="tiny", model_aliases=["streamlab-fake"]) as gw:
        unknown = await gw.http.post(route, json={**chat(stream=False), "model": "gpt-9"})
        assert_openai_error(unknown, 404, param="model", code="model_not_found")
        assert not gw.engine.calls
        for name in ("tiny", "streamlab-fake", None):
            body = {**chat(stream=False), **({"model": name} if name else {})}
            assert (await gw.http.post(route, json=body)).status_code in (200, 201)


async def test_v1_models_lists_the_gateway_s_model_as_openai_does() -> None:
    async with running(model_name="tiny") as gw:
        listed = (await gw.http.get("/v1/models")).json()
        assert listed["object"] == "list"
        assert [m["id"] for m in listed["data"]] == ["tiny"]
        assert listed["data"][0]["object"] == "model"
        assert (await gw.http.get("/v1/models/tiny")).json()["id"] == "tiny"
        assert_openai_error(await gw.http.get("/v1/models/gpt-9"), 404, code="model_not_found")


async def test_text_content_parts_are_joined_and_sampling_goes_on_the_wire() -> None:
    async with running() as gw:
        body = {**chat(stream=False), "temperature": 0.25, "top_p": 1, "seed": 7,
                "presence_penalty": -0.5, "frequency_penalty": 2, "n": 1,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "one"},
                                                         {"type": "text", "text": "two"}]}]}
        assert (await gw.http.post("/v1/chat/completions", json=body)).status_code == 200
        request = gw.engine.last.request
        assert request.messages[0].content == "one\ntwo"
        sampling = request.sampling
        assert (sampling.temperature, sampling.top_p, sampling.seed) == (0.25, 1.0, 7)
        assert (sampling.presence_penalty, sampling.frequency_penalty) == (-0.5, 2.0)
        # Nothing sent, nothing set: the backend's defaults apply.
        await gw.http.post("/v1/chat/completions", json=chat(stream=False))
        assert not gw.engine.last.request.HasField("sampling")


@pytest.mark.parametrize(("status", "kind"), [
    (grpc.StatusCode.UNAVAILABLE, "server_error"),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "rate_limit_error"),
    (grpc.StatusCode.DEADLINE_EXCEEDED, "server_error"),
])
async def test_engine_refusals_use_openai_s_types_and_name_no_internal_address(
    status: grpc.StatusCode, kind: str,
) -> None:
    """503s said `ipv4:127.0.0.1:8473: Connection refused` to the client."""
    details = ("failed to connect to all addresses; last error: UNKNOWN: "
               "ipv4:127.0.0.1:8473: Connection refused (upstream http://10.1.2.3:8000/v1, "
               "toxiproxy:8473, [::1]:50051)")
    async with running(ScriptedEngine(refusal=EngineError.from_status(status, details))) as gw:
        response = await gw.http.post("/v1/chat/completions", json=chat())
        error = response.json()["error"]
        assert error["type"] == kind
        for internal in ("127.0.0.1", "8473", "10.1.2.3", "toxiproxy", "::1", "50051"):
            assert internal not in error["message"], error["message"]


async def test_an_unexpected_error_is_a_json_500_not_a_text_one() -> None:
    """The safety net for a bug: still OpenAI's shape (no input reaches it here)."""
    class Exploding(ScriptedEngine):
        async def open(self, request: Any) -> Any:
            raise RuntimeError("a bug")

    app = create_app(GatewaySettings(), engine=Exploding())
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.post("/v1/chat/completions", json=chat())
    assert_openai_error(response, 500, code="internal_error")


# ---- /ws ---------------------------------------------------------------------------
@pytest.fixture
def ws_client() -> Iterator[TestClient]:
    app = create_app(GatewaySettings(max_body_bytes=4096, max_prompt_chars=1000),
                     engine=ScriptedEngine(Script(tokens=2)))
    with TestClient(app) as client:
        yield client


def ws_refusal(client: TestClient, send: dict[str, Any]) -> tuple[int, dict[str, Any],
                                                                   dict[str, Any] | None]:
    """Send one message; return the close code, its JSON reason, and the error
    message sent before it (None for none)."""
    with client.websocket_connect("/ws") as ws:
        ws.send(send)
        first = ws.receive()
        error = None
        if first["type"] == "websocket.send":
            error = json.loads(first["text"])
            first = ws.receive()
        assert first["type"] == "websocket.close", first
        return first["code"], json.loads(first["reason"]), error


WS_CASES: dict[str, tuple[dict[str, Any], int, str]] = {
    # Each used to end the connection without a close frame.
    "empty-text": ({"type": "websocket.receive", "text": ""}, 1007, "invalid_prompt"),
    "binary": ({"type": "websocket.receive", "bytes": b"\x00\x01"}, 1003, "unsupported_data"),
    "empty-binary": ({"type": "websocket.receive", "bytes": b""}, 1003, "unsupported_data"),
    "huge-max-tokens": ({"type": "websocket.receive",
                         "text": '{"prompt": "hi", "max_tokens": 1000000000000}'}, 1007,
                        "invalid_prompt"),
    "max-tokens-string": ({"type": "websocket.receive",
                           "text": '{"prompt": "hi", "max_tokens": "10"}'}, 1007,
                          "invalid_prompt"),
    "deep-json": ({"type": "websocket.receive", "text": "{" * 3000}, 1007, "invalid_json"),
    "json-not-object": ({"type": "websocket.receive", "text": '{"prompt": "x"'}, 1007,
                        "invalid_json"),
    "surrogate": ({"type": "websocket.receive", "text": '{"prompt": "\\ud800"}'}, 1007,
                  "invalid_prompt"),
    "request-id-non-ascii": ({"type": "websocket.receive",
                              "text": '{"prompt": "x", "streamlab": {"request_id": "caf\u00e9"}}'},
                             1007, "invalid_prompt"),
    "over-the-size-limit": ({"type": "websocket.receive", "text": "x" * 5000}, 1009,
                            "message_too_big"),
    "over-the-prompt-limit": ({"type": "websocket.receive", "text": "x" * 1001}, 1009,
                              "prompt_too_long"),
    "broken-mode": ({"type": "websocket.receive",
                     "text": '{"prompt": "x", "streamlab": {"relay": "detached_unbounded"}}'},
                    1008, "broken_mode_disabled"),
}


@pytest.mark.parametrize("case", list(WS_CASES))
def test_each_bad_websocket_prompt_closes_with_a_code_and_a_json_reason(
    ws_client: TestClient, case: str,
) -> None:
    send, code, error_code = WS_CASES[case]
    closed, reason, error = ws_refusal(ws_client, send)
    assert (closed, reason["code"]) == (code, error_code)
    assert reason["type"] == "invalid_request_error"
    assert error is not None
    assert error["error"]["code"] == error_code


@pytest.mark.parametrize("prompt", ["[" * 1000, "x" * 1000, "\u00e9t\u00e9", '"quoted"'])
def test_text_that_is_not_a_json_object_is_the_prompt_itself(ws_client: TestClient,
                                                            prompt: str) -> None:
    """`"[" * 100_000` used to recurse in json.loads and drop the connection."""
    with ws_client.websocket_connect("/ws") as ws:
        ws.send_text(prompt)
        messages = [ws.receive_text(), ws.receive_text(), ws.receive_text()]
        assert messages[-1] == "[DONE]"
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
        assert closed.value.code == 1000


def test_an_engine_limit_on_the_websocket_is_1007_not_1011() -> None:
    """`max_tokens: 5000` is the engine's INVALID_ARGUMENT: the client's error."""
    refusal = EngineError.from_status(grpc.StatusCode.INVALID_ARGUMENT,
                                      "max_tokens 5000 exceeds the limit 4096")
    app = create_app(GatewaySettings(), engine=ScriptedEngine(refusal=refusal))
    with TestClient(app) as client:
        code, reason, error = ws_refusal(
            client, {"type": "websocket.receive", "text": '{"prompt": "x", "max_tokens": 5000}'})
    assert (code, reason["code"]) == (1007, "invalid_argument")
    assert error is not None
    assert "4096" in error["error"]["message"]


async def test_a_bad_query_parameter_names_itself_as_param() -> None:
    async with running() as gw:
        job = (await gw.http.post("/v1/jobs", json=chat())).json()["id"]
        for query, param in [({"since": "abc"}, "since"), ({"wait_s": "-1"}, "wait_s")]:
            response = await gw.http.get(f"/v1/jobs/{job}", params=query)
            assert_openai_error(response, 400, param=param)
