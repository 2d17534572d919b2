"""Hundreds of malformed requests: each gets a 4xx whose message names the
problem, never a 5xx or a hang, and the lab stays healthy afterwards."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamlab.lab import Lab

pytestmark = pytest.mark.integration

VALID_MESSAGE = {"role": "user", "content": "hi"}
NOT_A_LIST = st.one_of(st.integers(), st.text(max_size=5), st.dictionaries(st.text(max_size=3),
                                                                           st.integers(),
                                                                           max_size=2))
UNCOERCIBLE = st.one_of(st.lists(st.integers(), min_size=1, max_size=2),
                        st.dictionaries(st.text(min_size=1, max_size=3), st.integers(),
                                        min_size=1, max_size=2))


def _with(**fields: Any) -> dict[str, Any]:
    return {"messages": [VALID_MESSAGE], "stream": False, **fields}


MALFORMED_JSON_BODIES = st.one_of(
    # Missing or wrong `messages`.
    st.just({}),
    st.builds(lambda v: {"messages": v}, NOT_A_LIST),
    st.just({"messages": []}),
    st.builds(lambda r: {"messages": [{"role": r, "content": "x"}]},
              st.text(max_size=8).filter(lambda r: r not in
                                         {"system", "user", "assistant", "tool", "developer"})),
    st.builds(lambda c: {"messages": [{"role": "user", "content": c}]}, UNCOERCIBLE),
    st.just({"messages": [{"content": "no role"}]}),
    # Wrong types and absurd values for the other fields.
    st.builds(lambda v: _with(stream=v), UNCOERCIBLE | st.just("maybe")),
    st.builds(lambda v: _with(max_tokens=v), st.integers(max_value=0) | UNCOERCIBLE
              | st.integers(min_value=10**7, max_value=10**12)),
    st.builds(lambda v: _with(streamlab={"prefill_ms": v}),
              st.integers(max_value=-1) | st.integers(min_value=600_001) | UNCOERCIBLE),
    st.builds(lambda v: _with(streamlab={"pauses": v}), NOT_A_LIST),
    st.builds(lambda k: _with(streamlab={k: 1}),
              st.text(min_size=1, max_size=8).filter(lambda k: k not in {
                  "prefill_ms", "token_gap_ms", "answer_tokens", "pauses", "request_id",
                  "relay"})),
    st.builds(lambda v: _with(streamlab={"relay": v}), st.text(max_size=10).filter(
        lambda v: v not in {"direct", "detached_unbounded"})),
    st.builds(lambda v: _with(streamlab=v), NOT_A_LIST.filter(lambda v: not isinstance(v, dict))),
    # Not an object at all.
    st.one_of(st.lists(st.integers(), max_size=3), st.integers(), st.text(max_size=10),
              st.none(), st.booleans()),
)

RAW_BODIES = st.one_of(
    st.binary(max_size=64).filter(lambda b: not _parses(b)),  # not JSON
    st.builds(lambda junk: b'{"messages": [{"role": "user", "content": "' + junk + b'"}]}',
              st.binary(min_size=1, max_size=8).filter(lambda b: not _utf8(b) or b'"' in b
                                                       or b"\\" in b)),  # not UTF-8
)


def _parses(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except ValueError:
        return False
    return True


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


@pytest.fixture(scope="module")
def client(lab: Lab) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=lab.edge_url, timeout=httpx.Timeout(5.0)) as http:
        yield http


def assert_named_4xx(response: httpx.Response) -> None:
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    error = response.json()["error"]
    assert error["message"]
    assert error["type"] == "invalid_request_error"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=MALFORMED_JSON_BODIES)
def test_malformed_json_bodies_get_a_named_4xx(client: httpx.Client, body: Any) -> None:
    assert_named_4xx(client.post("/v1/chat/completions", json=body))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=RAW_BODIES)
def test_unparseable_bodies_get_a_named_4xx(client: httpx.Client, raw: bytes) -> None:
    assert_named_4xx(client.post("/v1/chat/completions", content=raw,
                                 headers={"Content-Type": "application/json"}))


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
def test_wrong_methods_get_405(client: httpx.Client, method: str) -> None:
    response = client.request(method, "/v1/chat/completions")
    assert response.status_code == 405


def test_lab_is_healthy_after_the_barrage(client: httpx.Client, lab: Lab) -> None:
    assert client.get("/readyz").status_code == 200
    stats = lab.engine_stats()
    assert stats.generations_active == 0
