"""Jaeger beside the lab (`streamlab up --tracing`, docs/tracing.md): where its
binary is, the process that runs it, the services' OTEL_* environment that
points them at it, and a small client of its query API.

Jaeger (v2, built by scripts/build_jaeger.sh from the Go module proxy) takes
OTLP over HTTP on `jaeger_otlp_port` and answers its query API
(`/api/traces?service=...&tags=...`, `/api/traces/{id}`) on
`jaeger_query_port`, keeping spans in memory.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import httpx

from streamlab import paths
from streamlab.errors import StreamlabError
from streamlab.lab.topology import Ports

JAEGER = "jaeger"
CONFIG = "proxies/jaeger/jaeger.yaml"
# The services export a batch every this many ms (the SDK's default is 5 s):
# a test or `streamlab trace` finds a stream's spans within a second of its end.
BATCH_DELAY_MS = 200


class JaegerNotFound(StreamlabError, FileNotFoundError):
    """No Jaeger binary where `streamlab up --tracing` looks (`make jaeger` builds one)."""


VERSION = "v1.75.0"  # scripts/build_jaeger.sh's


def find_jaeger() -> str:
    """The clone's .tools/bin/jaeger, the user cache's (the build script keeps
    jaeger-VERSION there), then PATH."""
    places = [d for _, d in paths.toxiproxy_places()]
    for directory in places:
        for name in (JAEGER, f"{JAEGER}-{VERSION}"):
            candidate = directory / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    found = shutil.which(JAEGER)
    if found:
        return found
    raise JaegerNotFound(
        "jaeger is not installed (looked in " + ", ".join(map(str, places)) + ", PATH). "
        "scripts/build_jaeger.sh builds it into .tools/bin (`make jaeger`; Go >= 1.24, "
        "minutes the first time)")


def command(binary: str) -> list[str]:
    return [binary, "--config", f"file:{paths.data_file(CONFIG)}"]


def environment(ports: Ports) -> dict[str, str]:
    return {"STREAMLAB_HOST": ports.host,
            "STREAMLAB_JAEGER_OTLP_PORT": str(ports.jaeger_otlp_port),
            "STREAMLAB_JAEGER_QUERY_PORT": str(ports.jaeger_query_port),
            "STREAMLAB_JAEGER_QUERY_GRPC_PORT": str(ports.jaeger_query_grpc_port)}


def query_url(ports: Ports) -> str:
    return f"http://{ports.host}:{ports.jaeger_query_port}"


def service_env(ports: Ports, instance: str) -> dict[str, str]:
    """What a traced service is started with: the standard OTEL_* variables
    (services/common/tracing.py reads them), and JSON logs."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{ports.host}:{ports.jaeger_otlp_port}",
        "OTEL_BSP_SCHEDULE_DELAY": str(BATCH_DELAY_MS),
        "OTEL_RESOURCE_ATTRIBUTES": f"service.instance.id={instance}",
        "STREAMLAB_LOG_FORMAT": "json",
    }


def ready(ports: Ports) -> bool:
    try:
        return httpx.get(f"{query_url(ports)}/api/services", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def find_traces(ports: Ports, request_id: str, service: str = "streamlab-gateway",
                timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """The traces holding a span tagged with this request id (Jaeger's JSON)."""
    tags = json.dumps({"streamlab.request_id": request_id})
    answer = httpx.get(f"{query_url(ports)}/api/traces",
                       params={"service": service, "tags": tags, "lookback": "1h",
                               "limit": 20}, timeout=timeout_s)
    answer.raise_for_status()
    data: list[dict[str, Any]] = answer.json().get("data") or []
    return data


def get_trace(ports: Ports, trace_id: str, timeout_s: float = 5.0) -> dict[str, Any] | None:
    answer = httpx.get(f"{query_url(ports)}/api/traces/{trace_id}", timeout=timeout_s)
    if answer.status_code == 404:
        return None
    answer.raise_for_status()
    data = answer.json().get("data") or []
    return data[0] if data else None
