"""Prometheus metrics for the gateway (one registry per app, no globals).

Latency histograms, all in seconds, by surface (sse, json, resume, polling,
websocket: the surface that opened the engine call):

    streamlab_gateway_ttft_seconds            lease open (admission) to the first token
                                              read from the engine
    streamlab_gateway_token_gap_seconds       between tokens read from the engine; the
                                              tokens of one batch message after the
                                              first count as 0 (they arrived together)
    streamlab_gateway_stream_duration_seconds lease open to lease close (the last byte
                                              sent, or the client gone)
    streamlab_gateway_cancel_latency_seconds  the client leaving (its http.disconnect)
                                              to the engine call cancelled

Conventions: no `*_created` series (prometheus_client's per-series creation
timestamps double the series count and no dashboard here reads them); the
labelled counters start at 0 for every label value the gateway knows
(`STREAM_OUTCOMES`, `ENGINE_ERROR_CODES`), so `rate()` and `increase()` see a
series before its first event instead of missing the first increment; and
the registry carries the process_* and python_info series a default registry
would (CPU, memory, open files), since it is a registry of its own.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

import grpc
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

# Token streaming spans five orders of magnitude: sub-millisecond gaps of a
# batched step or a cancel, tens of milliseconds between tokens, seconds of
# prefill or a think pause, minutes of a long answer.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0,
               2.5, 5.0, 10.0, 30.0)
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                    600.0, 1800.0)
CANCEL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)

# A process-wide switch in prometheus_client (read when a registry is scraped):
# no `*_created` sample on any counter or histogram of this process.
disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped upstream

# How an OpenAI-route stream ends (services/gateway/openai_routes.py).
STREAM_OUTCOMES = ("completed", "client_disconnect", "engine_error", "drained")
# The engine failures the gateway can name: every gRPC status the engine (or
# the hop) can end a call with, and the gateway's own (a stream with no finish,
# its deadlines, the drain). An engine's mid-stream error event may name a
# backend's own code besides (those series appear when first seen).
ENGINE_ERROR_CODES = (
    *(status.name.lower() for status in grpc.StatusCode if status is not grpc.StatusCode.OK),
    "truncated", "engine_timeout", "engine_idle_timeout", "stream_deadline", "server_draining",
)


class LoopHistogram:
    """One labelled child: `observe()` is a bisect and two additions, no lock.

    prometheus_client's Histogram takes a lock for the sum and one for the
    bucket (measured ~4.7 µs an observation here, against ~0.5 µs), and a token
    is observed on the hot path. No lock is safe because the gateway observes
    and scrapes (its async /metrics route) on its one event-loop thread."""

    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = tuple(bounds)
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self._bounds, value)] += 1  # le: a bound is its own bucket
        self.sum += value

    def observe_zeros(self, times: int) -> None:
        self.counts[0] += times

    def cumulative(self) -> list[tuple[str, float]]:
        total, out = 0, []
        for bound, count in zip((*self._bounds, float("inf")), self.counts, strict=True):
            total += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(total)))
        return out


class LoopHistograms(Collector):
    """A histogram family with one label, registered as a collector."""

    def __init__(self, name: str, documentation: str, label: str, bounds: Sequence[float],
                 registry: CollectorRegistry) -> None:
        self._name, self._doc, self._label, self._bounds = name, documentation, label, bounds
        self._children: dict[str, LoopHistogram] = {}
        registry.register(self)

    def labels(self, value: str) -> LoopHistogram:
        child = self._children.get(value)
        if child is None:
            child = self._children[value] = LoopHistogram(self._bounds)
        return child

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self._name, self._doc, labels=[self._label])

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._doc, labels=[self._label])
        for value, child in list(self._children.items()):
            family.add_metric([value], child.cumulative(), child.sum)
        yield family


class SurfaceTimings:
    """The histograms' children for one surface, looked up once per surface."""

    __slots__ = ("cancel", "duration", "gap", "ttft")

    def __init__(self, metrics: GatewayMetrics, surface: str) -> None:
        self.ttft = metrics.ttft.labels(surface)
        self.gap = metrics.token_gap.labels(surface)
        self.duration = metrics.stream_duration.labels(surface)
        self.cancel = metrics.cancel_latency.labels(surface)


class StreamTimings:
    """One engine call's clock (time.monotonic): `EngineStream` reports each message
    of tokens as it is read, the lease the close."""

    __slots__ = ("_last", "_surface", "opened_at")

    def __init__(self, surface: SurfaceTimings, opened_at: float) -> None:
        self._surface = surface
        self.opened_at = opened_at
        self._last = 0.0  # 0: no token yet

    def tokens(self, at: float, count: int) -> None:
        last, self._last = self._last, at
        if last == 0.0:
            self._surface.ttft.observe(at - self.opened_at)
        else:
            self._surface.gap.observe(at - last)
        if count > 1:
            self._surface.gap.observe_zeros(count - 1)

    def closed(self, at: float) -> None:
        self._surface.duration.observe(at - self.opened_at)

    def cancelled(self, client_left_at: float, at: float) -> None:
        self._surface.cancel.observe(at - client_left_at)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.streams_active = Gauge(
            "streamlab_gateway_streams_active", "SSE streams open now", registry=self.registry
        )
        self.streams = Counter(
            "streamlab_gateway_streams", "SSE streams by how they ended",
            ["outcome"], registry=self.registry,
        )
        self.tokens = Counter(
            "streamlab_gateway_tokens_relayed", "Engine tokens sent to clients",
            registry=self.registry,
        )
        self.heartbeats = Counter(
            "streamlab_gateway_heartbeats", "`: ping` comments sent", registry=self.registry
        )
        self.engine_errors = Counter(
            "streamlab_gateway_engine_errors", "Engine failures by code",
            ["code"], registry=self.registry,
        )
        self.ws_origin_refused = Counter(
            "streamlab_gateway_ws_origin_refused", "/ws handshakes refused for their Origin",
            registry=self.registry,
        )
        self.ttft = LoopHistograms(
            "streamlab_gateway_ttft_seconds",
            "Lease open (admission) to the first token read from the engine",
            "surface", TTFT_BUCKETS, self.registry)
        self.token_gap = LoopHistograms(
            "streamlab_gateway_token_gap_seconds",
            "Between tokens read from the engine (a batch's later tokens count 0)",
            "surface", GAP_BUCKETS, self.registry)
        self.stream_duration = LoopHistograms(
            "streamlab_gateway_stream_duration_seconds",
            "Lease open to lease close (last byte sent or client gone)",
            "surface", DURATION_BUCKETS, self.registry)
        self.cancel_latency = LoopHistograms(
            "streamlab_gateway_cancel_latency_seconds",
            "The client leaving to the engine call cancelled",
            "surface", CANCEL_BUCKETS, self.registry)
        self._surfaces: dict[str, SurfaceTimings] = {}
        # Each outcome's child, looked up once: `labels()` builds a key and
        # takes a lock on every call, and every stream ends in one of these.
        self.stream_outcomes = {outcome: self.streams.labels(outcome)
                                for outcome in STREAM_OUTCOMES}
        for code in ENGINE_ERROR_CODES:
            self.engine_errors.labels(code)

    def surface(self, name: str) -> SurfaceTimings:
        found = self._surfaces.get(name)
        if found is None:
            found = self._surfaces[name] = SurfaceTimings(self, name)
        return found
