"""The gateway's /metrics, read into the few figures the console's panel shows."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

# What the panel shows → the gateway's sample name (services/gateway/metrics.py,
# streams.py, jobs.py). A labelled counter is summed over its labels.
GATEWAY_FIGURES = {
    "live_streams": "streamlab_gateway_streams_active",
    "heartbeats": "streamlab_gateway_heartbeats_total",
    "tokens_relayed": "streamlab_gateway_tokens_relayed_total",
    "engine_errors": "streamlab_gateway_engine_errors_total",
    "resume_streams_held": "streamlab_gateway_resume_streams_held",
    "jobs_held": "streamlab_gateway_jobs",
    "jobs_expired": "streamlab_gateway_jobs_expired_total",
}


def gateway_figures(text: str) -> dict[str, float | None]:
    """Each figure of GATEWAY_FIGURES from Prometheus text; None when the gateway
    does not export it (an older gateway, or a renamed metric): never a made-up 0."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return {figure: totals.get(name) for figure, name in GATEWAY_FIGURES.items()}
