"""The gateway's lock-free histograms expose what prometheus_client's own
Histogram would for the same observations (bucket edges included)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from services.gateway.metrics import (
    ENGINE_ERROR_CODES,
    GAP_BUCKETS,
    STREAM_OUTCOMES,
    GatewayMetrics,
    LoopHistograms,
    StreamTimings,
    SurfaceTimings,
)
from tests.unit.gateway.inprocess import chat, leave_midway, running, until
from tests.unit.gateway.scripted_engine import Script, ScriptedEngine


def samples(registry: CollectorRegistry) -> list[str]:
    return sorted(line for line in generate_latest(registry).decode().splitlines()
                  if line.startswith("gap_seconds_") and "_created" not in line)


@given(st.lists(st.one_of(st.sampled_from(GAP_BUCKETS),
                          st.floats(min_value=0, max_value=100, allow_nan=False)),
                max_size=40))
def test_a_loop_histogram_reads_as_a_prometheus_histogram(values: list[float]) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    mine = LoopHistograms("gap_seconds", "gaps", "surface", GAP_BUCKETS, ours).labels("sse")
    reference = Histogram("gap_seconds", "gaps", ["surface"], buckets=GAP_BUCKETS,
                          registry=theirs).labels("sse")
    for value in values:
        mine.observe(value)
        reference.observe(value)
    assert samples(ours) == samples(theirs)


def test_the_first_token_is_the_ttft_and_a_batch_counts_zero_gaps() -> None:
    metrics = GatewayMetrics()
    timings = StreamTimings(SurfaceTimings(metrics, "sse"), opened_at=10.0)
    timings.tokens(10.3, 1)
    timings.tokens(10.35, 3)
    ttft, gap = metrics.ttft.labels("sse"), metrics.token_gap.labels("sse")
    assert (sum(ttft.counts), round(ttft.sum, 6)) == (1, 0.3)
    assert (sum(gap.counts), round(gap.sum, 6), gap.counts[0]) == (3, 0.05, 2)


def exposition(metrics: GatewayMetrics) -> list[str]:
    return [line for line in generate_latest(metrics.registry).decode().splitlines()
            if not line.startswith("#")]


def test_no_created_series_even_after_counting_and_observing() -> None:
    metrics = GatewayMetrics()
    metrics.streams.labels("completed").inc()
    metrics.engine_errors.labels("unavailable").inc()
    metrics.tokens.inc()
    metrics.surface("sse").ttft.observe(0.1)
    lines = exposition(metrics)
    assert any(line.startswith("streamlab_gateway_streams_total") for line in lines)
    assert [line for line in lines if "_created" in line] == []


def test_labelled_counters_start_at_zero_for_every_known_label() -> None:
    lines = set(exposition(GatewayMetrics()))
    for outcome in STREAM_OUTCOMES:
        assert f'streamlab_gateway_streams_total{{outcome="{outcome}"}} 0.0' in lines
    for code in ("unavailable", "resource_exhausted", "deadline_exceeded", "truncated",
                 "engine_idle_timeout", "stream_deadline", "server_draining"):
        assert code in ENGINE_ERROR_CODES
        assert f'streamlab_gateway_engine_errors_total{{code="{code}"}} 0.0' in lines


def test_the_registry_carries_the_process_metrics() -> None:
    names = {line.split("{")[0].split(" ")[0] for line in exposition(GatewayMetrics())}
    assert "python_info" in names
    if Path("/proc/self/stat").exists():  # ProcessCollector reads Linux's /proc
        assert {"process_cpu_seconds_total", "process_resident_memory_bytes",
                "process_open_fds"} <= names


@pytest.mark.anyio
async def test_every_outcome_the_openai_route_counts_was_pre_initialised() -> None:
    """A stream that completes, one the engine fails and one the client leaves
    add no series: each was there, at 0, before it happened."""
    async with running(ScriptedEngine(Script(tokens=2))) as gw:
        metrics = gw.gateway.metrics
        before = stream_outcomes(metrics)
        assert (await gw.http.post("/v1/chat/completions", json=chat())).status_code == 200
        gw.engine.script = Script(tokens=2, end="error")
        await gw.http.post("/v1/chat/completions", json=chat())
        gw.engine.script = Script(tokens=5, hold_after=1)
        await leave_midway(gw.app, "/v1/chat/completions", chat(),
                           lambda exchange: b"t0" in exchange.body)
        await until(lambda: stream_outcomes(metrics)["client_disconnect"] == 1)
        after = stream_outcomes(metrics)
    assert set(after) == set(before) == set(STREAM_OUTCOMES)
    assert (after["completed"], after["engine_error"]) == (1, 1)


def stream_outcomes(metrics: GatewayMetrics) -> dict[str, float]:
    return {sample.labels["outcome"]: sample.value
            for family in metrics.registry.collect()
            if family.name == "streamlab_gateway_streams"
            for sample in family.samples if sample.name.endswith("_total")}
