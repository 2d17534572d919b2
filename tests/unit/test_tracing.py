"""Trace context, the JSON log lines, the proxies' access-log lines and the
timeline, without a lab (tests/integration/test_tracing.py has the real one)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

from services.common import tracing
from streamlab.lab.trace_timeline import Mark, Timeline, normalise_proxy_line

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = f"00-{TRACE}-b7ad6b7169203331-01"


def test_traceparent_is_parsed_as_w3c_says() -> None:
    assert tracing.parse_traceparent(PARENT) == (TRACE, "b7ad6b7169203331", 1)
    assert tracing.trace_id_of(PARENT.upper()) == TRACE
    for bad in ("", "00-xyz", f"ff-{TRACE}-b7ad6b7169203331-01",
                f"00-{'0' * 32}-b7ad6b7169203331-01", f"00-{TRACE}-{'0' * 16}-01"):
        assert tracing.parse_traceparent(bad) is None
    fresh = tracing.new_traceparent()
    assert tracing.parse_traceparent(fresh) is not None


def test_tracing_is_off_unless_an_otlp_endpoint_is_named() -> None:
    assert not tracing.tracing_configured({})
    on = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert tracing.tracing_configured(on)
    assert not tracing.tracing_configured({**on, "OTEL_SDK_DISABLED": "true"})
    assert not tracing.tracing_configured({**on, "OTEL_TRACES_EXPORTER": "none"})


def test_off_the_services_never_import_the_sdk() -> None:
    # (FastAPI itself imports opentelemetry's API when it is installed; the SDK
    # and the exporter are ours, and only with tracing on.)
    code = ("import sys; import services.gateway.app, services.engine.servicer; "
            "from services.common import tracing; assert tracing.setup('x') is None; "
            "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk', "
            "'opentelemetry.exporter'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"PATH": ""}).stdout
    assert out.strip() == "[]"


def test_json_log_lines_carry_the_request_and_trace_ids() -> None:
    record = logging.LogRecord("streamlab.gateway", logging.INFO, __file__, 1,
                               "stream %s", ("completed",), None)
    token = tracing.log_context.set(("req-1", TRACE))
    try:
        doc = json.loads(tracing.JsonFormatter().format(record))
    finally:
        tracing.log_context.reset(token)
    assert doc["message"] == "stream completed"
    assert (doc["request_id"], doc["trace_id"], doc["level"]) == ("req-1", TRACE, "INFO")


def test_each_proxys_access_log_line_reads_alike() -> None:
    nginx = normalise_proxy_line({
        "proxy": "nginx", "msec": 100.5, "request_id": "r", "trace_id": TRACE, "status": 200,
        "bytes_sent": 10, "request_time": 0.5, "upstream_header_time": "0.010",
        "upstream_response_time": "0.490"})
    haproxy = normalise_proxy_line({
        "proxy": "haproxy", "accept_unix_ms": 100000, "request_id": "-",
        "upstream_request_id": "r", "traceparent": PARENT, "traceresponse": "-",
        "status": 200, "bytes": 10, "upstream_header_ms": 10, "total_ms": 500})
    traefik = normalise_proxy_line({
        "DownstreamStatus": 200, "StartUTC": "1970-01-01T00:01:40.000000001Z",
        "Duration": 500_000_000, "request_X-Request-Id": "r",
        "request_Traceparent": PARENT, "DownstreamContentSize": 10})
    caddy = normalise_proxy_line({
        "logger": "http.log.access.log0", "ts": 100.5, "duration": 0.5, "status": 200,
        "size": 10, "request": {"headers": {"X-Request-Id": ["r"], "Traceparent": [PARENT]}}})
    for line in (nginx, haproxy, traefik, caddy):
        assert line is not None
        assert (line["request_id"], line["trace_id"], line["status"]) == ("r", TRACE, 200)
        assert abs(line["request_time_s"] - 0.5) < 1e-6
    assert nginx is not None
    assert nginx["start"] == 100.0
    assert haproxy is not None
    assert haproxy["start"] == 100.0
    assert normalise_proxy_line({"something": "else"}) is None


def test_the_timeline_says_where_the_first_token_waited() -> None:
    def timeline(client_first_byte: float, proxy_end: float) -> Timeline:
        return Timeline("r", TRACE, [
            Mark(0.0, "client", "request sent"), Mark(0.30, "engine", "first_token"),
            Mark(0.301, "gateway", "first_token"), Mark(proxy_end, "proxy", "end"),
            Mark(client_first_byte, "client", "first_byte")])

    buffered = timeline(1.8, 1.799)
    assert buffered.figures()["engine_to_client_s"] == 1.5
    assert "buffered" in (buffered.where_held() or "")
    streamed = timeline(0.303, 1.8)
    assert streamed.where_held() is None
    assert any("first_token" in line for line in streamed.render())


def test_the_timeline_says_which_hop_cut_a_stream_and_when() -> None:
    """idle-cut's broken run as the lab records it: the gateway sees its client
    (nginx) leave as nginx's idle timeout ends the response, 2 s after the last
    token; a stream that ended whole has no cut."""
    def timeline(client_end: float, proxy_end: float, done: bool = False) -> Timeline:
        spans = [{"service": "streamlab-gateway", "attributes": {
                     "streamlab.outcome": "completed" if done else "client_left"}},
                 {"service": "streamlab-engine", "attributes": {
                     "streamlab.state": "completed" if done else "cancelled"}}]
        return Timeline("r", TRACE, [
            Mark(0.0, "client", "request sent"), Mark(0.46, "client", "last_token"),
            Mark(2.3598, "gateway", "client_left"), Mark(proxy_end, "proxy", "end"),
            Mark(client_end, "client", "end")], spans=spans,
            proxy={"proxy": "nginx", "status": 200, "request_time_s": 2.36},
            client={"done": done, "error": "" if done else "transport"})

    cut = timeline(2.3603, 2.3608).cut()
    assert cut is not None
    assert (cut["hop"], cut["proxy"], cut["gateway_outcome"]) == ("proxy", "nginx", "client_left")
    assert abs(cut["silence_s"] - 1.9008) < 1e-6
    assert any(line.startswith("cut by the proxy (nginx) at 2360.8 ms, 1.901 s after")
               for line in timeline(2.3603, 2.3608).render())
    # The client cut in front of the proxy (a toxic on the edge hop): its end first.
    edge = timeline(1.0, 2.3608).cut()
    assert edge is not None
    assert edge["hop"] == "edge"
    assert timeline(2.3603, 2.3608, done=True).cut() is None
