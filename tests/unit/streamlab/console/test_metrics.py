"""The console reads the gateway's /metrics into its panel's figures."""

from __future__ import annotations

from prometheus_client import generate_latest

from services.gateway.metrics import GatewayMetrics
from streamlab.console.metrics import GATEWAY_FIGURES, gateway_figures


def test_figures_from_the_gateways_own_registry() -> None:
    metrics = GatewayMetrics()
    metrics.streams_active.set(3)
    metrics.heartbeats.inc(7)
    metrics.engine_errors.labels("UNAVAILABLE").inc()
    metrics.engine_errors.labels("CANCELLED").inc(2)
    figures = gateway_figures(generate_latest(metrics.registry).decode())
    assert figures["live_streams"] == 3
    assert figures["heartbeats"] == 7
    assert figures["engine_errors"] == 3  # summed over the labels


def test_a_metric_the_gateway_does_not_export_is_none_not_zero() -> None:
    figures = gateway_figures("")
    assert set(figures) == set(GATEWAY_FIGURES)
    assert all(value is None for value in figures.values())
