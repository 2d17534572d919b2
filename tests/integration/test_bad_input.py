"""Malformed input through the edge: each case gets a named 4xx with OpenAI's
error JSON, or a WebSocket close with a code; never a 5xx, never a connection
dropped without an answer, and the lab is healthy afterwards.

`test_the_catalogue_is_answered` sends every case of
tests/integration/bad_input_cases.py (surrogates, non-ASCII headers and ids,
strict types, JSON, sizes at and past each limit, nginx's own refusals, every
WebSocket frame kind) and prints its table. The property tests below it
generate only inputs their assertion is about: each generated body is checked
to be malformed before it is sent (a generator once produced `content: "\\r"`,
a valid body that rightly got 200).
"""

from __future__ import annotations

import json
import socket
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.gateway.openai_api import ChatCompletionRequest, StreamlabOptions
from streamlab.lab.target import Capability, LabTarget, require
from tests.integration.bad_input_cases import Case, Outcome, Target, catalogue
from tests.wait import wait_until

pytestmark = [
    pytest.mark.integration,
    # 317 cases and ~200 generated bodies: 30+ s on 2 cores.
    pytest.mark.local_only("the answers to malformed input come from the gateway's "
                           "validation and nginx's template, the same code as the local "
                           "lab's; 30+ s, and the local suite runs it in the same CI run"),
]

ROLES = {"system", "user", "assistant", "tool", "developer"}


@pytest.fixture(scope="module")
def client(lab: LabTarget) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=lab.edge_url, timeout=httpx.Timeout(10.0)) as http:
        yield http


def table(results: list[tuple[Case, Outcome, str | None]]) -> str:
    by_category: dict[str, Counter[str]] = defaultdict(Counter)
    for case, got, _ in results:
        by_category[case.category][got.label] += 1
    width = max(len(c) for c in by_category)
    lines = [f"{'category':<{width}}  cases  outcomes"]
    for category, outcomes in by_category.items():
        shown = ", ".join(f"{label}: {n}" for label, n in sorted(outcomes.items()))
        lines.append(f"{category:<{width}}  {sum(outcomes.values()):>5}  {shown}")
    fives = sum(1 for _, got, _ in results if got.kind == "http" and got.code >= 500)
    dropped = sum(1 for _, got, _ in results if got.kind == "dropped")
    wrong = sum(1 for _, _, problem in results if problem)
    lines.append(f"{'total':<{width}}  {len(results):>5}  5xx: {fives}, dropped: {dropped}, "
                 f"not as expected: {wrong}")
    return "\n".join(lines)


def test_the_catalogue_is_answered(lab: LabTarget, client: httpx.Client,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Each kind of bad input the gateway once mishandled is in the catalogue: lone
    surrogates (were 500), non-ASCII ids (502), /ws frames that dropped the
    connection, types coerced to 200, nginx's HTML and text/plain errors."""
    created = client.post("/v1/streams", json={"messages": [{"role": "user", "content": "x"}],
                                               "streamlab": {"answer_tokens": 1}})
    assert created.status_code == 201, created.text
    target = Target.of(lab.edge_url, created.json()["id"])
    cases = catalogue()
    assert len(cases) >= 300
    results = []
    for case in cases:
        got = case.send(target)
        results.append((case, got, case.problem(got)))
    with capsys.disabled():
        print("\n" + table(results))
    problems = [f"{case.category} / {case.name}: {problem}"
                for case, _, problem in results if problem]
    assert not problems, "\n".join(problems[:40])

    # The lab is healthy afterwards: ready, and nothing left generating.
    assert client.get("/readyz").status_code == 200
    wait_until(lambda: lab.engine_stats().generations_active == 0, timeout_s=15.0,
               interval_s=0.1, what="nothing left generating at the engine")
    ok = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "still there?"}],
        "streamlab": {"prefill_ms": 0, "token_gap_ms": 0, "answer_tokens": 3}})
    assert ok.status_code == 200
    assert ok.json()["usage"]["completion_tokens"] == 3


# ---- property tests: generated, each input checked to be malformed ----------------------
def valid_request(body: Any) -> bool:
    """Would the gateway accept this body? (Its own model says, so the
    generators below can keep only what their assertion is about.)"""
    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValueError:
        return False
    return request.model in (None, "streamlab-fake")


def _with(**fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "hi"}], "stream": False, **fields}


NOT_A_LIST = st.one_of(st.integers(), st.text(max_size=5),
                       st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
UNCOERCIBLE = st.one_of(st.lists(st.integers(), min_size=1, max_size=2),
                        st.dictionaries(st.text(min_size=1, max_size=3), st.integers(),
                                        min_size=1, max_size=2))
STREAMLAB_FIELDS = set(StreamlabOptions.model_fields)

MALFORMED_JSON_BODIES = st.one_of(
    st.just({}),
    st.builds(lambda v: {"messages": v}, NOT_A_LIST),
    st.just({"messages": []}),
    st.builds(lambda r: {"messages": [{"role": r, "content": "x"}]},
              st.text(max_size=8).filter(lambda r: r not in ROLES)),
    st.builds(lambda c: {"messages": [{"role": "user", "content": c}]}, UNCOERCIBLE),
    st.just({"messages": [{"content": "no role"}]}),
    st.builds(lambda v: _with(stream=v), UNCOERCIBLE | st.just("maybe") | st.integers()),
    st.builds(lambda v: _with(max_tokens=v), st.integers(max_value=0) | UNCOERCIBLE
              | st.text(max_size=3) | st.booleans() | st.integers(min_value=2**32)),
    st.builds(lambda v: _with(n=v), st.integers().filter(lambda n: n != 1)),
    st.builds(lambda v: _with(temperature=v), st.floats(min_value=2.001) | st.text(max_size=3)),
    st.builds(lambda v: _with(streamlab={"prefill_ms": v}),
              st.integers(max_value=-1) | st.integers(min_value=600_001) | UNCOERCIBLE),
    st.builds(lambda v: _with(streamlab={"pauses": v}), NOT_A_LIST),
    st.builds(lambda k: _with(streamlab={k: 1}),
              st.text(min_size=1, max_size=8).filter(lambda k: k not in STREAMLAB_FIELDS)),
    st.builds(lambda v: _with(streamlab={"relay": v}),
              st.text(max_size=10).filter(lambda v: v not in {"direct", "detached_unbounded"})),
    st.builds(lambda v: _with(streamlab=v), NOT_A_LIST.filter(lambda v: not isinstance(v, dict))),
    st.one_of(st.lists(st.integers(), max_size=3), st.integers(), st.text(max_size=10),
              st.none(), st.booleans()),
).filter(lambda body: not valid_request(body))


def _parses(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except ValueError:
        return False
    return True


RAW_BODIES = st.one_of(
    st.binary(max_size=64),  # mostly not JSON
    # A valid body with junk spliced into its content: valid only by luck
    # (a `\r` escape), and those are filtered out below.
    st.builds(lambda junk: b'{"messages": [{"role": "user", "content": "' + junk + b'"}]}',
              st.binary(min_size=1, max_size=8)),
).filter(lambda raw: not _parses(raw))


def assert_named_4xx(response: httpx.Response) -> None:
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    error = response.json()["error"]
    assert error["message"]
    assert error["type"] == "invalid_request_error"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.filter_too_much])
@given(body=MALFORMED_JSON_BODIES)
def test_malformed_json_bodies_get_a_named_4xx(client: httpx.Client, body: Any) -> None:
    assert_named_4xx(client.post("/v1/chat/completions", json=body))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=RAW_BODIES)
def test_unparseable_bodies_get_a_named_4xx(client: httpx.Client, raw: bytes) -> None:
    assert_named_4xx(client.post("/v1/chat/completions", content=raw,
                                 headers={"Content-Type": "application/json"}))


def test_the_unparseable_generator_keeps_no_valid_body() -> None:
    """The draw that failed a fresh `make test`: a `\\r` escape is valid JSON."""
    assert _parses(b'{"messages": [{"role": "user", "content": "\\r"}]}')
    assert not valid_request({"messages": [{"role": "user", "content": "hi"}], "n": 2})
    assert valid_request({"messages": [{"role": "user", "content": "\r"}]})


def raw_exchange(lab: LabTarget, request: bytes) -> tuple[bytes, bytes]:
    """One request as bytes to the edge; (head, body) of the answer."""
    target = Target.of(lab.edge_url, "")
    with socket.create_connection((target.host, target.port), timeout=10.0) as sock:
        sock.sendall(request.replace(b"HOST", target.host.encode()))
        wire = b""
        while chunk := sock.recv(65536):  # Connection: close: read to the end
            wire += chunk
    head, _, body = wire.partition(b"\r\n\r\n")
    return head, body


def test_nginx_names_no_version_and_answers_json(lab: LabTarget) -> None:
    """An unknown Transfer-Encoding got nginx's 501 HTML page, `nginx/1.22.1`
    in its Server header and its body: a version to match against CVE lists."""
    head, body = raw_exchange(lab, b"POST /v1/chat/completions HTTP/1.1\r\nHost: HOST\r\n"
                              b"Connection: close\r\nTransfer-Encoding: identity\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), head
    assert json.loads(body)["error"]["code"] == "unsupported_transfer_encoding"
    assert b"nginx/" not in head + body


def test_a_duplicate_authorization_keeps_the_key_out_of_nginx_s_log(lab: LabTarget) -> None:
    """nginx refused it (400) and wrote the header line, key and all, to its
    error log: "client sent duplicate header line: Authorization: Bearer ..."."""
    require(lab, [Capability.LOGS], "reads nginx's error log")
    assert lab.logs is not None
    log = lab.logs["nginx"]
    key = f"sk-never-logged-{uuid.uuid4().hex}"
    head, body = raw_exchange(lab, (
        "GET /v1/models HTTP/1.1\r\nHost: HOST\r\nConnection: close\r\n"
        f"Authorization: Bearer {key}\r\nAuthorization: Bearer {key}-2\r\n\r\n").encode())
    assert head.startswith(b"HTTP/1.1 400 "), head
    assert json.loads(body)["error"]["type"] == "invalid_request_error"
    # nginx writes its log line before it answers, so it is there by now if at all.
    assert log.is_file(), log
    assert key not in log.read_text(errors="replace")


@pytest.mark.parametrize("path", ["/openapi.json", "/docs", "/redoc"])
def test_the_api_description_is_not_served_through_the_edge(client: httpx.Client,
                                                            path: str) -> None:
    """The gateway's OpenAPI schema and its docs pages answered anyone, key or not."""
    answer = client.get(path)
    assert answer.status_code == 404
    assert "paths" not in answer.text


def test_lab_is_healthy_after_the_barrage(client: httpx.Client, lab: LabTarget) -> None:
    assert client.get("/readyz").status_code == 200
    wait_until(lambda: lab.engine_stats().generations_active == 0, timeout_s=15.0,
               interval_s=0.1, what="nothing left generating at the engine")
