"""Prometheus metrics for the gateway (one registry per app, no globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
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
