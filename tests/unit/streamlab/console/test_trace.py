"""The console's `/api/trace` without a lab (streamlab/console/trace.py): the
waterfall's rows from a timeline, and the 409 a console gets without a traced
local lab to read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from streamlab.console.app import create_app
from streamlab.console.trace import (
    TraceUnavailable,
    page_record,
    traced_lab,
    waterfall,
    with_client,
)
from streamlab.lab.console_settings import ConsoleSettings
from streamlab.lab.trace_timeline import build

T0 = 1_700_000_000.0


def _trace() -> dict[str, Any]:
    def span(sid: str, process: str, name: str, start: float, end: float,
             events: list[tuple[str, float]], **tags: Any) -> dict[str, Any]:
        return {"spanID": sid, "processID": process, "operationName": name,
                "startTime": int((T0 + start) * 1e6), "duration": int((end - start) * 1e6),
                "tags": [{"key": "streamlab.request_id", "value": "r1"},
                         *({"key": f"streamlab.{k}", "value": v} for k, v in tags.items())],
                "logs": [{"timestamp": int((T0 + at) * 1e6),
                          "fields": [{"key": "event", "value": what}]} for what, at in events]}
    return {"traceID": "ab" * 16, "processes": {
        "p1": {"serviceName": "streamlab-gateway", "tags": []},
        "p2": {"serviceName": "streamlab-engine", "tags": []}},
        "spans": [
            span("g", "p1", "gateway sse", 0.010, 0.600,
                 [("engine.accepted", 0.012), ("first_token", 0.300), ("heartbeat", 0.400),
                  ("closed", 0.599)], outcome="completed"),
            span("e", "p2", "engine generate", 0.011, 0.590,
                 [("accepted", 0.011), ("admitted", 0.050), ("first_token", 0.298),
                  ("end", 0.590)], state="completed")]}


def _timeline_doc() -> dict[str, Any]:
    client = {"request_id": "r1", "trace_id": "ab" * 16, "started_unix": T0,
              "headers_s": 0.02, "first_byte_s": 0.302, "ttft_s": 0.303, "total_s": 0.61,
              "last_token_s": 0.58, "pings_s": [0.401], "done": True, "error": ""}
    proxy = {"proxy": "nginx", "request_id": "r1", "trace_id": "ab" * 16, "status": 200,
             "bytes": 900, "start": T0 + 0.005, "end": T0 + 0.605, "request_time_s": 0.6,
             "upstream_header_s": 0.012, "upstream_response_s": 0.6}
    return build("r1", _trace(), proxy, client).as_json()


def test_the_waterfall_has_a_row_per_hop_on_one_axis() -> None:
    rows = {row["hop"]: row for row in waterfall(_timeline_doc())["rows"]}
    assert list(rows) == ["client", "proxy", "gateway", "engine"]
    client, proxy, gateway, engine = (rows[h] for h in ("client", "proxy", "gateway", "engine"))
    assert (client["start_s"], client["end_s"]) == (0.0, pytest.approx(0.61))
    assert {m["what"] for m in client["marks"]} >= {"headers", "first_byte", "first_token",
                                                   "heartbeat"}
    assert (proxy["start_s"], proxy["end_s"]) == (pytest.approx(0.005), pytest.approx(0.605))
    assert gateway["marks"][0] == {"what": "engine.accepted", "t_s": pytest.approx(0.012)}
    assert {m["what"] for m in gateway["marks"]} >= {"first_token", "heartbeat", "closed"}
    segments = {s["what"]: (s["start_s"], s["end_s"]) for s in engine["segments"]}
    assert segments["queue"] == (pytest.approx(0.011), pytest.approx(0.05))
    assert segments["prefill"] == (pytest.approx(0.05), pytest.approx(0.298))
    assert {m["what"] for m in engine["marks"]} == {"first_token", "end"}


def test_a_cut_is_a_mark_across_the_rows() -> None:
    doc = _timeline_doc()
    doc["cut"] = {"hop": "proxy", "at_s": 0.605}
    assert waterfall(doc)["cut"] == {"hop": "proxy", "t_s": 0.605}
    assert waterfall(_timeline_doc())["cut"] is None


def _settings(run_dir: str) -> ConsoleSettings:
    return ConsoleSettings(host="127.0.0.1", port=8475, edge_url="http://127.0.0.1:1",
                           toxiproxy_url="http://127.0.0.1:2", engine_target="127.0.0.1:3",
                           gateway_url="http://127.0.0.1:4", run_dir=run_dir)


def test_without_a_traced_local_lab_the_trace_is_a_409(tmp_path: Path) -> None:
    with pytest.raises(TraceUnavailable, match="no local lab"):
        traced_lab(_settings(""))
    with pytest.raises(TraceUnavailable, match="no lab is running"):
        traced_lab(_settings(str(tmp_path)))
    (tmp_path / "state.json").write_text(json.dumps({"tracing": False}))
    with pytest.raises(TraceUnavailable, match="without tracing"):
        traced_lab(_settings(str(tmp_path)))
    app = create_app(_settings(str(tmp_path)))
    with TestClient(app, base_url="http://127.0.0.1:8475") as api:
        answer = api.get("/api/trace/abc123")
        assert answer.status_code == 409
        assert "without tracing" in answer.json()["error"]
        assert api.get("/api/trace").json() == {
            "tracing": False, "reason": answer.json()["error"]}
        assert api.get("/api/trace/a%20b").status_code == 404


def test_the_page_s_own_timings_make_the_client_row_and_judge_the_cut() -> None:
    proxy = {"proxy": "nginx", "request_id": "r1", "trace_id": "ab" * 16, "status": 200,
             "bytes": 500, "start": T0 + 0.005, "end": T0 + 2.5, "request_time_s": 2.495,
             "upstream_header_s": 0.012, "upstream_response_s": 2.49}
    timeline = build("r1", _trace(), proxy, None)
    assert timeline.cut() is None  # nothing says how the client's stream ended
    record = page_record(json.dumps({"started_unix": T0, "headers_s": 0.02, "ttft_s": 0.3,
                                     "first_byte_s": 0.3, "last_token_s": 0.4,
                                     "total_s": 2.5, "done": False, "error": "error"}))
    assert record is not None
    with_client(timeline, record)
    assert timeline.missing == []
    doc = timeline.as_json()
    assert doc["cut"]["hop"] == "proxy"
    shown = waterfall(doc)
    assert shown["cut"]["hop"] == "proxy"
    assert shown["rows"][0]["label"] == "page"
    # A Stop is the page's own cut, not a hop's.
    stopped = page_record(json.dumps({**record, "error": "stopped"}))
    assert stopped is not None
    timeline = build("r1", _trace(), proxy, None)
    with_client(timeline, stopped)
    assert waterfall(timeline.as_json())["cut"] == {"hop": "client (Stop)", "t_s": 2.5}


@pytest.mark.parametrize("text", ["", "[]", "{}", '{"started_unix": "x", "total_s": 1}',
                                  '{"started_unix": NaN, "total_s": 1}',
                                  '{"started_unix": 1, "total_s": 1, "pings_s": [Infinity]}'])
def test_a_bad_page_record_is_ignored(text: str) -> None:
    assert page_record(text) is None
