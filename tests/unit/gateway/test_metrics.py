"""The gateway's lock-free histograms expose what prometheus_client's own
Histogram would for the same observations (bucket edges included)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from services.gateway.metrics import (
    GAP_BUCKETS,
    GatewayMetrics,
    LoopHistograms,
    StreamTimings,
    SurfaceTimings,
)


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
