"""The gateway's exceptions: one root, a tree its docstring draws, and the
statuses and codes clients were told before the root existed."""

from __future__ import annotations

import grpc
import pytest

from services.gateway import errors
from services.gateway.errors import BadRequest, EngineError, GatewayError, GatewayException
from services.gateway.jobs import JobNotFound
from services.gateway.limits import TooManyConnections, TooManyStreams
from services.gateway.resume.redis_tail import ReaderMustMove
from services.gateway.resume.replay_log import BadEventId, parse_event_id
from tests.unit.exception_roots import exception_classes, strays


def test_every_gateway_exception_derives_from_the_one_root() -> None:
    assert strays("services.gateway", GatewayException) == []


def test_the_docstring_draws_every_gateway_exception() -> None:
    found, _ = exception_classes("services.gateway")
    assert {c.__name__ for c in found} >= {"GatewayError", "BadEventId", "ReaderMustMove"}
    assert errors.__doc__ is not None
    undrawn = [c.__name__ for c in found if c.__name__ not in errors.__doc__]
    assert undrawn == []


@pytest.mark.parametrize(("error", "status", "code"), [
    (BadRequest("prompt_too_long", "too long"), 400, "prompt_too_long"),
    (JobNotFound("abc"), 404, "job_not_found"),
    (TooManyStreams("full", 2), 429, "too_many_streams"),
    (TooManyConnections("busy", 2), 429, "too_many_connections"),
    (EngineError.from_status(grpc.StatusCode.UNAVAILABLE, "down", 3), 503, "unavailable"),
    (EngineError.from_status(grpc.StatusCode.INTERNAL, "boom"), 502, "internal"),
], ids=lambda v: getattr(v, "code", None) if isinstance(v, GatewayError) else None)
def test_what_a_client_is_told_is_unchanged(error: GatewayError, status: int, code: str) -> None:
    assert isinstance(error, GatewayException)
    assert (error.status_code, error.code, error.body()["error"]["code"]) == (status, code, code)


def test_the_retry_after_of_a_refusal_is_kept() -> None:
    assert TooManyStreams("full", 2).headers == {"Retry-After": "2"}
    assert EngineError.from_status(grpc.StatusCode.UNAVAILABLE, "down", 3).headers == {
        "Retry-After": "3"}


def test_the_control_flow_exceptions_stay_outside_what_clients_are_told() -> None:
    # An `except GatewayError` (app.py's handler, the SSE bodies) must not catch
    # them: that would turn a reader's quiet move into an error event.
    for internal in (BadEventId, ReaderMustMove):
        assert issubclass(internal, GatewayException)
        assert not issubclass(internal, GatewayError)
    with pytest.raises(ValueError, match="is not"):  # as before: still a ValueError
        parse_event_id("nonsense")
