"""The console's guard (streamlab/console/guard.py) as a pure decision: which
Host, Origin and token may read the console and change the lab."""

from __future__ import annotations

import pytest
from starlette.types import Scope

from streamlab.console.guard import ConsoleGuard, console_hosts

TOKEN = "t0ken"


def guard(host: str = "127.0.0.1", extra: list[str] | None = None) -> ConsoleGuard:
    async def app(scope: Scope, receive: object, send: object) -> None:
        raise AssertionError("not called")
    return ConsoleGuard(app, console_hosts(host, 8475, extra or []), TOKEN)


def scope(method: str = "POST", path: str = "/api/reset", **headers: str) -> Scope:
    return {"type": "http", "method": method, "path": path, "headers": [
        (name.replace("_", "-").encode(), value.encode()) for name, value in headers.items()]}


def test_the_console_s_own_page_may_change_the_lab() -> None:
    for host in ("127.0.0.1:8475", "localhost:8475", "[::1]:8475", "LOCALHOST:8475"):
        assert guard().problem(scope(host=host, origin=f"http://{host}",
                                     x_streamlab_console_token=TOKEN)) is None
    # A client that is not a browser sends no Origin; the token is enough.
    assert guard().problem(scope(host="127.0.0.1:8475", x_streamlab_console_token=TOKEN)) is None


@pytest.mark.parametrize("headers", [
    {"host": "evil.example"}, {"host": "evil.example:8475"}, {"host": "127.0.0.1:8476"},
    {"host": "127.0.0.1"}, {},
])
def test_another_host_is_refused_even_a_read(headers: dict[str, str]) -> None:
    assert "Host" in (guard().problem(scope("GET", "/api/lab", **headers)) or "")
    assert guard().problem(scope("GET", "/healthz", **headers)) is None  # probes


@pytest.mark.parametrize("origin", ["https://evil.example", "null", "http://127.0.0.1:8476",
                                    "https://127.0.0.1:8475", "http://127.0.0.1:8475.evil"])
def test_another_origin_is_refused_token_or_not(origin: str) -> None:
    assert guard().problem(scope(host="127.0.0.1:8475", origin=origin,
                                 x_streamlab_console_token=TOKEN)) is not None


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_a_change_without_the_token_is_refused(method: str) -> None:
    for token in ({}, {"x_streamlab_console_token": "wrong"},
                  {"x_streamlab_console_token": ""}):
        assert "token" in (guard().problem(scope(method, host="127.0.0.1:8475",
                                                 origin="http://127.0.0.1:8475",
                                                 **token)) or "")
    assert guard().problem(scope("GET", "/api/hops", host="127.0.0.1:8475")) is None


def test_the_listen_host_and_configured_hosts_are_the_console_s_too() -> None:
    assert console_hosts("0.0.0.0", 8475, []) == {"127.0.0.1:8475", "localhost:8475",
                                                  "[::1]:8475"}
    named = guard("lab.internal", ["console.example:443"])
    for host in ("lab.internal:8475", "console.example:443"):
        assert named.problem(scope(host=host, origin=f"http://{host}",
                                   x_streamlab_console_token=TOKEN)) is None
