"""The pure parts of `streamlab check`: verdicts, lines, exit status, the JUnit
writer, the metrics reader and the stream record's arithmetic."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from services.client.openai_stream import StreamResult
from streamlab.exit_codes import EXIT_AS_EXPECTED, EXIT_UNEXPECTED
from streamlab.experiments.check.framing import error_shape
from streamlab.experiments.check.junit import junit_xml
from streamlab.experiments.check.target import CheckTarget
from streamlab.experiments.check.verdict import (
    SCHEMA,
    document,
    errored,
    exit_status,
    judged,
    line,
    not_applicable,
    table,
    verdict,
)
from streamlab.experiments.report import Check, Report

HOLDS = judged("framing", "events parse", {"not_json": 0}, (Check("not_json", "==", 0),))
FAILS = judged("heartbeat", "bytes in silence", {"longest_silence_s": 3.0},
               (Check("longest_silence_s", "<", 1.5, "send `: ping`"),))
NA = not_applicable("cancel", "leaves stop", "not observable: no metrics")
ERR = errored("concurrency", "", "ConnectError: refused")


def run(*parts: Report) -> Report:
    return Report("check", "http://x/v1", parts=parts, tables=(table(parts),))


def test_verdicts_and_lines() -> None:
    assert [verdict(p) for p in (HOLDS, FAILS, NA, ERR)] == ["pass", "fail", "n/a", "error"]
    assert line(HOLDS) == "pass  framing"
    assert line(FAILS) == ("fail  heartbeat: longest_silence_s < 1.5 (measured 3) "
                           "— send `: ping`")
    assert line(NA) == "n/a   cancel: not observable: no metrics"


@pytest.mark.parametrize(("parts", "status"), [
    ((HOLDS, NA), EXIT_AS_EXPECTED), ((HOLDS, FAILS), EXIT_UNEXPECTED),
    ((HOLDS, ERR), EXIT_UNEXPECTED), ((), EXIT_AS_EXPECTED)])
def test_exit_status(parts: tuple[Report, ...], status: int) -> None:
    assert exit_status(run(*parts)) == status


def test_junit_has_one_testcase_per_check_with_the_evidence() -> None:
    root = ET.fromstring(junit_xml(run(HOLDS, FAILS, NA, ERR)))
    suite = root.find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped"),
            suite.get("errors")) == ("4", "1", "1", "1")
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    assert list(cases) == ["framing", "heartbeat", "cancel", "concurrency"]
    assert len(cases["framing"]) == 1
    assert cases["framing"][0].tag == "system-out"
    failure = cases["heartbeat"].find("failure")
    assert failure is not None
    assert failure.get("message") == "longest_silence_s < 1.5 (measured 3)"
    assert "send `: ping`" in (failure.text or "")
    skipped = cases["cancel"].find("skipped")
    assert skipped is not None
    assert skipped.get("message") == "not observable: no metrics"


def test_junit_escapes_what_the_server_sent() -> None:
    nasty = judged("framing", "", {"first": "<&\"'>"}, (Check("first", "==", "ok"),))
    root = ET.fromstring(junit_xml(run(nasty)))
    failure = root.find("testsuite/testcase/failure")
    assert failure is not None
    assert "<&\"'>" in failure.get("message", "")


@pytest.mark.parametrize(("body", "ok"), [
    (b'{"error": {"message": "bad", "type": "invalid_request_error"}}', True),
    (b'{"error": {"message": "bad", "type": null}}', True),
    (b'{"error": "bad"}', False), (b'{"detail": "bad"}', False), (b"Bad Request", False),
    (b"[]", False)])
def test_error_shape(body: bytes, ok: bool) -> None:
    assert error_shape(body) is ok


def test_the_target_reached_through_a_hop_keeps_its_path() -> None:
    target = CheckTarget("https://api.example.com/openai/v1", "m")
    assert not target.plain_http
    assert target.port == 443
    hopped = target.via("127.0.0.1", 9000)
    assert hopped.chat_url == "http://127.0.0.1:9000/openai/v1/chat/completions"
    assert "streamlab" not in target.body("hi", max_tokens=1, lab={"prefill_ms": 1})
    with pytest.raises(ValueError, match="not an http"):
        CheckTarget("ftp://x/v1", "m")


def test_silence_is_judged_wherever_it_falls_in_the_answer() -> None:
    # Tokens at 0.2 .. 0.4 s, then 4 s with no byte, then the rest.
    record = StreamResult(headers_s=0.05, token_reads=[0.2, 0.3, 0.4, 4.4, 4.5],
                          reads=[(0.2, 9), (0.3, 9), (0.4, 9), (4.4, 9), (4.5, 9)], total_s=4.5)
    assert record.longest_byte_gap == pytest.approx((4.0, 0.4))
    assert record.longest_wait_for_token == pytest.approx((4.0, 0.4))
    # The same pause with a ping every second: the wait stays, the silence goes.
    pinged = StreamResult(headers_s=0.05, token_reads=[0.2, 4.4],
                          reads=[(0.2, 9), (1.4, 8), (2.4, 8), (3.4, 8), (4.4, 9)], total_s=4.4)
    assert pinged.longest_wait_for_token == pytest.approx((4.2, 0.2))
    assert pinged.longest_byte_gap == pytest.approx((1.2, 0.2))
    # Headers held until the first token: the silence starts at the request.
    held = StreamResult(headers_s=4.0, token_reads=[4.0], reads=[(4.0, 100)], total_s=4.0)
    assert held.longest_byte_gap == pytest.approx((4.0, 0.0))
    assert StreamResult().longest_byte_gap is None


def test_the_json_document_speaks_the_texts_verdicts() -> None:
    report = Report("check", "http://x/v1", parts=(HOLDS, FAILS, NA))
    doc = json.loads(json.dumps(document(report, url="http://x/v1", model="m")))
    assert doc["schema"] == SCHEMA
    assert [(c["name"], c["verdict"]) for c in doc["checks"]] == [
        ("framing", "pass"), ("heartbeat", "fail"), ("cancel", "n/a")]
    assert doc["exit_status"] == EXIT_UNEXPECTED
    assert doc["summary"] == {"pass": 1, "fail": 1, "n/a": 1, "error": 0}
    unreachable = document(None, url="http://x/v1", error=("unreachable", "nothing answers"))
    assert unreachable["exit_status"] == 3
    assert unreachable["checks"] == []
    assert unreachable["error"] == {"kind": "unreachable", "message": "nothing answers"}


def test_extra_body_reaches_every_request_and_a_lab_gateway_keeps_its_streamlab_keys() -> None:
    target = CheckTarget("http://127.0.0.1:1/v1", "m", lab_knobs=True, extra_body={
        "ignore_eos": True, "streamlab": {"heartbeat_s": 0, "prefill_ms": 1}})
    body = target.body("hi", max_tokens=4, lab={"prefill_ms": 500})
    assert body["ignore_eos"] is True
    assert body["streamlab"] == {"heartbeat_s": 0, "prefill_ms": 500}  # the check's timing wins
    other = CheckTarget("http://127.0.0.1:1/v1", "m", extra_body={"min_tokens": 3})
    assert "streamlab" not in other.body("hi", max_tokens=4, lab={"prefill_ms": 500})
