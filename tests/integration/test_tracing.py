"""Tracing on the real topology (docs/tracing.md): a lab up with --tracing
(Jaeger beside it, built by scripts/build_jaeger.sh), 2 gateways sharing the
resume log in Redis, on each engine wire in turn. A private lab per wire, on
free ports, for this module alone.

What it shows: a chat through the edge is one trace in Jaeger whose spans come
from the gateway and the engine, and nginx's JSON log line carries its trace
id; a resumable stream taken over by the other gateway (its owner killed) is
in the same trace (the re-attach's spans beside the first gateway's);
`streamlab trace` on the buffering scenario's broken run shows the engine's
first token over a second before the client's first byte, and on its fixed
run within a few ms.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.client.openai_stream import chat_body
from services.common.tracing import new_traceparent, trace_id_of
from streamlab.experiments.scenarios import registry
from streamlab.experiments.scenarios.model import Mode
from streamlab.experiments.scenarios.replica_lab import free_ports
from streamlab.experiments.scenarios.runner import run
from streamlab.experiments.timing import Timing
from streamlab.lab import jaeger
from streamlab.lab.local import Lab, LabOptions
from streamlab.lab.trace_timeline import access_log_of, collect, proxy_line
from tests.integration import test_replica_loss as loss
from tests.integration.conftest import TEST_ENGINE_ENV, TEST_GATEWAY_ENV, replica_test_lab

pytestmark = [pytest.mark.integration, pytest.mark.local_only(
    "Jaeger runs beside a local lab (--tracing); the compose lab's profile is separate")]

WIRES = ("multiplexed", "per_request")


def _jaeger_or_skip() -> None:
    try:
        jaeger.find_jaeger()
    except jaeger.JaegerNotFound:
        pytest.skip("no Jaeger binary: scripts/build_jaeger.sh (`make jaeger`) builds it")


# The per-request wire's lab is `make test-tracing`'s (slow): CI runs the
# multiplexed one, the default wire (a lab each, ~14 s to start).
@pytest.fixture(scope="module", params=[WIRES[0], pytest.param(WIRES[1], marks=pytest.mark.slow)])
def traced_lab(request: pytest.FixtureRequest,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    _jaeger_or_skip()
    with replica_test_lab(tmp_path_factory.mktemp(f"tracing-{request.param}"),
                          {"STREAMLAB_GATEWAY_ENGINE_WIRE": request.param},
                          gateways=2, engines=1, tracing=True) as lab:
        yield lab


def _trace(lab: Lab, trace_id: str, want: set[str], deadline_s: float = 10.0) -> dict[str, Any]:
    """The trace once it holds spans of every (service, operation) in `want`."""
    end = time.monotonic() + deadline_s
    seen: set[tuple[str, str]] = set()
    while time.monotonic() < end:
        trace = jaeger.get_trace(lab.ports, trace_id)
        if trace is not None:
            processes = trace["processes"]
            seen = {(processes[s["processID"]]["serviceName"], s["operationName"])
                    for s in trace["spans"]}
            if want <= {f"{service}:{name}" for service, name in seen}:
                return trace
        time.sleep(0.2)
    raise AssertionError(f"trace {trace_id}: wanted {sorted(want)}, Jaeger has {sorted(seen)}")


def _instances(trace: dict[str, Any], operation: str) -> set[str]:
    found = set()
    for span in trace["spans"]:
        if span["operationName"] == operation:
            tags = {t["key"]: t["value"] for t in trace["processes"][span["processID"]]["tags"]}
            found.add(str(tags.get("service.instance.id")))
    return found


def test_a_chat_through_the_edge_is_one_trace_and_nginx_logs_its_id(traced_lab: Lab) -> None:
    lab = traced_lab
    traceparent, request_id = new_traceparent(), uuid.uuid4().hex
    trace_id = trace_id_of(traceparent)
    assert trace_id is not None
    with httpx.Client(timeout=10.0) as http:
        answer = http.post(f"{lab.edge_url}/v1/chat/completions",
                           json=chat_body("hi", prefill_ms=50, token_gap_ms=5,
                                          answer_tokens=5),
                           headers={"traceparent": traceparent, "X-Request-Id": request_id})
    assert answer.status_code == 200
    assert "[DONE]" in answer.text
    # The gateway says which trace it joined: the client's.
    assert trace_id_of(answer.headers["traceresponse"]) == trace_id
    trace = _trace(lab, trace_id, {"streamlab-gateway:gateway sse",
                                   "streamlab-engine:engine generate"})
    spans = {s["operationName"]: s for s in trace["spans"]}
    assert {s["traceID"] for s in trace["spans"]} == {trace_id}
    gateway, engine = spans["gateway sse"], spans["engine generate"]
    # The engine's span is the gateway's child; the gateway's the client's.
    assert [r["spanID"] for r in engine["references"]] == [gateway["spanID"]]
    assert [r["spanID"] for r in gateway["references"]] == [traceparent.split("-")[2]]
    tags = {t["key"]: t["value"] for t in gateway["tags"]}
    assert tags["streamlab.outcome"] == "completed"
    assert tags["streamlab.engine_wire"] == lab.options.gateway_env[
        "STREAMLAB_GATEWAY_ENGINE_WIRE"]
    engine_tags = {t["key"]: t["value"] for t in engine["tags"]}
    assert engine_tags["streamlab.tokens"] == 5
    assert engine_tags["streamlab.state"] == "completed"
    assert engine_tags["streamlab.prefill_s"] >= 0.04
    line = proxy_line(access_log_of(lab), request_id)
    assert line is not None
    assert line["trace_id"] == trace_id
    assert line["status"] == 200
    # `streamlab trace ID --json` draws it: the proxy's line, both spans.
    shown = subprocess.run(
        [sys.executable, "-m", "streamlab", "trace", request_id, "--run-dir",
         str(lab.run_dir), "--json"], capture_output=True, text=True, timeout=60, check=True)
    document = json.loads(shown.stdout)
    assert document["trace_id"] == trace_id
    assert {m["hop"] for m in document["marks"]} == {"proxy", "gateway", "engine"}
    # The services' JSON log lines carry the same ids (one line a stream each;
    # the chat went to either gateway).
    for logs in (("gateway.log", "gateway-2.log"), ("engine.log",)):
        lines = _json_lines(lab, logs, trace_id)
        assert lines, logs
        assert lines[-1]["request_id"] == request_id, logs


def _json_lines(lab: Lab, logs: tuple[str, ...], trace_id: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 5.0
    while True:
        lines = [json.loads(x) for name in logs
                 for x in (lab.run_dir / "logs" / name).read_text().splitlines()
                 if x.startswith("{")]
        ours = [x for x in lines if x.get("trace_id") == trace_id]
        if ours or time.monotonic() > deadline:
            return ours
        time.sleep(0.1)


TAKEN_OVER = 'streamlab_gateway_resume_takeovers_total{outcome="reattached"}'


def _taken_over(http: httpx.Client, base_url: str) -> float:
    lines = [line for line in http.get(f"{base_url}/metrics").text.splitlines()
             if line.startswith(TAKEN_OVER + " ")]
    return float(lines[0].split()[-1]) if lines else 0.0  # counted once it happens


@pytest.mark.parametrize("taken_over_by", ["reader", "sweep"])
def test_a_stream_resumed_on_the_other_gateway_is_in_the_same_trace(
        traced_lab: Lab, taken_over_by: str) -> None:
    """The owner is SIGKILLed mid-stream; the reader comes back to the other
    gateway with Last-Event-ID and its traceparent; that gateway re-attaches to
    the engine's generation: its spans and the engine's attach join the trace.
    `sweep`: the survivor's take-over sweep re-attaches before any reader
    comes (no request, no traceparent: it parents on the stream's own span,
    kept in the stream's metadata in Redis)."""
    lab = traced_lab
    traceparent = new_traceparent()
    trace_id = trace_id_of(traceparent)
    owner, other = lab.url_of("gateway-2"), lab.url_of("gateway")
    with httpx.Client(timeout=httpx.Timeout(10.0, connect=5.0),
                      headers={"traceparent": traceparent}) as http:
        stream_id = loss.create(http, owner)
        first = loss.read(http, owner, stream_id, stop_after=20)
        before = _taken_over(http, other)
        lab.kill_service("gateway-2")
        try:
            if taken_over_by == "sweep":
                deadline = time.monotonic() + 20.0
                while _taken_over(http, other) == before:
                    assert time.monotonic() < deadline, "the sweep took nothing over"
                    time.sleep(0.1)
            after = loss.read(http, other, stream_id, last_event_id=first.last.id)
        finally:
            lab.start_service("gateway-2")
    assert after.status == 200
    assert loss.exactly_once(first, after)
    assert trace_id is not None
    trace = _trace(lab, trace_id, {"streamlab-gateway:gateway resume",
                                   "streamlab-engine:engine generate",
                                   "streamlab-engine:engine attach"})
    assert {s["traceID"] for s in trace["spans"]} == {trace_id}
    # The killed owner's spans never ended (lost with it); the engine's
    # generation it started, the survivor's take-over and reader, and the
    # engine's attach (a child of the take-over) are all in the one trace.
    assert _instances(trace, "gateway resume") == {"gateway"}
    assert "gateway" in _instances(trace, "gateway resume.reader")
    spans = {s["operationName"]: s for s in trace["spans"]}
    assert [r["spanID"] for r in spans["engine attach"]["references"]] == [
        spans["gateway resume"]["spanID"]]
    takeover = {t["key"]: t["value"] for t in spans["gateway resume"]["tags"]}
    assert takeover["streamlab.resume.attach"] == "attach"


@pytest.mark.anyio
async def test_trace_shows_where_buffering_held_the_first_token(traced_lab: Lab) -> None:
    if lab_wire(traced_lab) != WIRES[0]:
        pytest.skip("the timeline is the same on either wire: once is enough")
    scenario = registry.get("buffering")
    timing = Timing(tokens=30)  # 0.3 s prefill + 1.5 s of tokens
    figures = {}
    modes: tuple[Mode, ...] = ("broken", "fixed")
    for mode in modes:
        report = await run(traced_lab, scenario, mode, timing)
        figures[mode] = collect(traced_lab, str(report.figures["request_id"]), wait_s=5.0)
    broken, fixed = (figures[m].figures() for m in ("broken", "fixed"))
    broken_gap, fixed_gap = broken["engine_to_client_s"], fixed["engine_to_client_s"]
    assert broken_gap is not None, broken
    assert broken_gap > 1.0, broken
    assert fixed_gap is not None, fixed
    assert abs(fixed_gap) < 0.05, fixed
    assert "buffered" in (figures["broken"].where_held() or "")
    assert not figures["fixed"].missing
    assert not figures["broken"].missing


def lab_wire(lab: Lab) -> str:
    return lab.options.gateway_env["STREAMLAB_GATEWAY_ENGINE_WIRE"]


@pytest.mark.slow  # a lab per proxy (~13 s each); `make test-tracing` runs it
@pytest.mark.parametrize("proxy", ["nginx", "haproxy", "caddy", "traefik"])
def test_each_edge_proxy_passes_the_trace_and_logs_its_id(
        proxy: str, tmp_path: Path) -> None:
    """Each proxy passes `traceparent` untouched (the gateway's span is the
    client's child) and its JSON access log carries the trace id."""
    _jaeger_or_skip()
    from tests.integration.test_proxies import require_installed

    require_installed(proxy)
    options = LabOptions(run_dir=tmp_path, engine_env=dict(TEST_ENGINE_ENV),
                         gateway_env=dict(TEST_GATEWAY_ENV), console=False, proxy=proxy,
                         tracing=True)
    lab = Lab(free_ports(options), options)
    lab.up()
    try:
        traceparent, request_id = new_traceparent(), uuid.uuid4().hex
        trace_id = trace_id_of(traceparent)
        assert trace_id is not None
        answer = httpx.post(f"{lab.edge_url}/v1/chat/completions", timeout=10.0,
                            json=chat_body("hi", prefill_ms=50, token_gap_ms=5,
                                           answer_tokens=3),
                            headers={"traceparent": traceparent, "X-Request-Id": request_id})
        assert answer.status_code == 200
        trace = _trace(lab, trace_id, {"streamlab-gateway:gateway sse",
                                       "streamlab-engine:engine generate"})
        gateway = next(s for s in trace["spans"] if s["operationName"] == "gateway sse")
        assert [r["spanID"] for r in gateway["references"]] == [traceparent.split("-")[2]]
        deadline = time.monotonic() + 5.0
        while (line := proxy_line(access_log_of(lab), request_id)) is None:
            assert time.monotonic() < deadline, f"no {proxy} log line for {request_id}"
            time.sleep(0.1)
        assert line["trace_id"] == trace_id
        assert line["status"] == 200
        assert line["start"] is not None
    finally:
        lab.down()


def test_chat_then_trace_shows_the_clients_first_byte(traced_lab: Lab) -> None:
    """`streamlab chat` on a traced lab starts the trace and keeps its own
    timings: `streamlab trace ID` draws the stream from the client's first byte
    to the engine's span."""
    if lab_wire(traced_lab) != WIRES[0]:
        pytest.skip("the client's side is the same on either wire: once is enough")
    run_dir = str(traced_lab.run_dir)
    chat = subprocess.run(
        [sys.executable, "-m", "streamlab", "chat", "hi", "--tokens", "5", "--prefill-ms", "50",
         "--gap-ms", "5", "--run-dir", run_dir, "--json"],
        capture_output=True, text=True, timeout=60, check=True)
    said = json.loads(chat.stdout)
    assert said["done"] is True
    request_id, trace_id = said["request_id"], said["trace_id"]
    assert request_id
    assert trace_id
    human = subprocess.run(
        [sys.executable, "-m", "streamlab", "chat", "hi", "--tokens", "3", "--run-dir", run_dir],
        capture_output=True, text=True, timeout=60, check=True)
    assert "its timeline: streamlab trace " in human.stdout
    shown = subprocess.run(
        [sys.executable, "-m", "streamlab", "trace", request_id, "--run-dir", run_dir,
         "--json", "--wait-s", "5"], capture_output=True, text=True, timeout=60, check=True)
    timeline = json.loads(shown.stdout)
    assert timeline["trace_id"] == trace_id
    assert {m["hop"] for m in timeline["marks"]} == {"client", "proxy", "gateway", "engine"}
    figures = timeline["figures"]
    assert figures["client_first_byte_s"] is not None
    # The first byte comes after the engine's first token, and not long after.
    assert figures["engine_to_client_s"] is not None
    assert 0 <= figures["engine_to_client_s"] < 0.5, figures
    assert timeline["missing"] == []


@pytest.mark.anyio
async def test_trace_says_which_hop_cut_the_idle_stream_and_when(traced_lab: Lab) -> None:
    """idle-cut broken: nginx's short proxy_read_timeout cuts a stream silent for
    its think pause. The timeline names the proxy as the hop that cut, at about
    the idle timeout after the last token, and the gateway's side of it."""
    if lab_wire(traced_lab) != WIRES[0]:
        pytest.skip("the cut is the proxy's on either wire: once is enough")
    from streamlab.experiments.scenarios.runner import timing_for

    timing = timing_for(traced_lab, tokens=6)
    report = await run(traced_lab, registry.get("idle-cut"), "broken", timing)
    assert report.as_expected, report.figures
    timeline = collect(traced_lab, str(report.figures["request_id"]), wait_s=5.0)
    cut = timeline.cut()
    assert cut is not None, timeline.render()
    assert cut["hop"] == "proxy", cut
    assert cut["proxy"] == "nginx"
    idle = traced_lab.options.nginx.short_read_timeout_s
    # It cut after its idle timeout of silence: the proxy's request lasted the
    # prefill, the tokens before the pause, and that.
    assert cut["silence_s"] is not None
    assert idle * 0.9 <= cut["silence_s"] <= idle + 1.0, cut
    assert cut["gateway_outcome"] == "client_left", cut
    assert any(line.startswith("cut by the proxy (nginx)") for line in timeline.render())


@pytest.mark.slow  # restarts the lab's gateways and engines per mode (~30 s)
def test_bench_scale_tracing_cell_measures_each_mode_and_puts_the_lab_back(
        traced_lab: Lab) -> None:
    """Cell g on a small load: every mode (the baseline revision's services
    too) completes its set-ups, and the lab traces again afterwards."""
    if lab_wire(traced_lab) != WIRES[0]:
        pytest.skip("the cell restarts the services the same way on either wire")
    from streamlab.experiments.bench.tracing_cost import run_tracing_cost, tracing_report

    runs = run_tracing_cost(traced_lab, ("off", "on", "0.5"), rounds=1, streams=20, rate=50.0,
                            paced=(4, 10, 20), idle_s=0.5, baseline="HEAD")
    assert [r.mode for r in runs] == ["before", "off", "on", "0.5"]
    assert all(r.run.setup.load.completed == 20 for r in runs), [r.run.setup.load for r in runs]
    report = tracing_report(runs)
    assert report.figures["setup_ms_gateway_on"] is not None
    assert "tracing_cost_paced_us_gateway_on" in report.figures
    # Put back: a chat is traced again.
    traceparent = new_traceparent()
    trace_id = trace_id_of(traceparent)
    assert trace_id is not None
    answer = httpx.post(f"{traced_lab.edge_url}/v1/chat/completions", timeout=10.0,
                        json=chat_body("hi", prefill_ms=0, token_gap_ms=1, answer_tokens=2),
                        headers={"traceparent": traceparent})
    assert answer.status_code == 200
    _trace(traced_lab, trace_id, {"streamlab-gateway:gateway sse",
                                  "streamlab-engine:engine generate"})
