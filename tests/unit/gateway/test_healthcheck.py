"""The gateway's compose health check: exit 0 only for a 200 from /healthz."""

from __future__ import annotations

import httpx
import pytest

from services.gateway.healthcheck import main


def answering(status: int, seen: list[str]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(status)
    return httpx.MockTransport(handle)


def test_a_200_is_healthy() -> None:
    seen: list[str] = []
    assert main(["http://gateway:8090/healthz"], answering(200, seen)) == 0
    assert seen == ["http://gateway:8090/healthz"]


def test_a_draining_gateways_503_is_unhealthy() -> None:
    assert main(["http://gateway:8090/healthz"], answering(503, [])) == 1


def test_no_answer_is_unhealthy_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)
    assert main(["http://gateway:8090/healthz"], httpx.MockTransport(refuse)) == 1
    assert "connection refused" in capsys.readouterr().err


def test_without_a_url_it_asks_the_gateways_own_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMLAB_GATEWAY_PORT", "9123")
    seen: list[str] = []
    assert main([], answering(200, seen)) == 0
    assert seen == ["http://127.0.0.1:9123/healthz"]
