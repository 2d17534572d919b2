"""The engine's /metrics: Prometheus text on a port of its own (the gRPC port
speaks only HTTP/2 gRPC), served by prometheus_client's thread.

    streamlab_engine_decode_step_seconds    between consecutive steps of the batched
                                            decode clock while it is busy (its step,
                                            or the requests' own gap when the step is 0)
    streamlab_engine_decode_batch_size      sequences that made a token in one step
    streamlab_engine_queue_wait_seconds     a generation's wait for a running slot
    streamlab_engine_generations_total      by outcome: started, completed, cancelled,
                                            failed (read from EngineStats at scrape)
    streamlab_engine_tokens_generated_total
    streamlab_engine_tokens_after_cancel_total  tokens made after a cancel arrived
    streamlab_engine_running, _queued       generations holding a slot / waiting now

Conventions, as the gateway's: no `*_created` series, and the registry carries
the process_* and python_info series a default registry would.

Nothing here is on the per-token path: the step histograms are observed once
per step (for the whole batch), the counters are read from EngineStats when
scraped.
"""

from __future__ import annotations

from collections.abc import Iterator
from threading import Thread
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.engine.admission import Admission
from services.engine.stats import EngineStats

STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.05, 0.075, 0.1,
                0.25, 0.5, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                 300.0)

# A process-wide switch in prometheus_client (read at scrape): no `*_created`
# sample on any histogram or counter (creation timestamps nobody here reads).
disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped upstream


class _StatsCollector(Collector):
    def __init__(self, stats: EngineStats, admission: Admission) -> None:
        self._stats = stats
        self._admission = admission

    def collect(self) -> Iterator[Metric]:
        stats = self._stats
        outcomes = CounterMetricFamily("streamlab_engine_generations",
                                       "Generations by outcome", labels=["outcome"])
        for outcome, count in (("started", stats.started), ("completed", stats.completed),
                               ("cancelled", stats.cancelled), ("failed", stats.failed)):
            outcomes.add_metric([outcome], count)
        yield outcomes
        yield CounterMetricFamily("streamlab_engine_tokens_generated",
                                  "Tokens the model made", value=stats.tokens_generated)
        yield CounterMetricFamily("streamlab_engine_tokens_after_cancel",
                                  "Tokens made after the generation's cancel arrived",
                                  value=stats.tokens_after_cancel)
        yield GaugeMetricFamily("streamlab_engine_sessions",
                                "Multiplexed Session calls open now (engine_wire = multiplexed)",
                                value=stats.sessions_open)
        yield GaugeMetricFamily("streamlab_engine_running", "Generations holding a slot now",
                                value=self._admission.running)
        yield GaugeMetricFamily("streamlab_engine_queued", "Generations waiting for a slot now",
                                value=self._admission.waiting)


class EngineMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.decode_step = Histogram(
            "streamlab_engine_decode_step_seconds",
            "Between consecutive decode steps while the clock is busy",
            buckets=STEP_BUCKETS, registry=self.registry)
        self.batch_size = Histogram(
            "streamlab_engine_decode_batch_size", "Sequences that made a token in one step",
            buckets=BATCH_BUCKETS, registry=self.registry)
        self.queue_wait = Histogram(
            "streamlab_engine_queue_wait_seconds", "A generation's wait for a running slot",
            buckets=QUEUE_BUCKETS, registry=self.registry)
        self._server: WSGIServer | None = None
        self._thread: Thread | None = None

    def watch(self, stats: EngineStats, admission: Admission) -> None:
        self.registry.register(_StatsCollector(stats, admission))

    def step(self, interval_s: float | None, batch: int) -> None:
        if interval_s is not None:
            self.decode_step.observe(interval_s)
        self.batch_size.observe(batch)

    def serve(self, host: str, port: int) -> int:
        """Listen on host:port (0: a free port); the port it got."""
        self._server, self._thread = start_http_server(port, host, self.registry)
        return int(self._server.server_port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
