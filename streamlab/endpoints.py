"""What both labs share: the services' addresses, health probes and handles,
all derived from the ports. The local lab (lab.py) and the compose lab
(compose.py) differ only in who owns the processes; everything that talks to
a service through a port lives here once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from streamlab.tls import LabTls
from streamlab.topology import Ports, edge_h2_url, edge_url, hops
from streamlab.toxiproxy import ProxySpec, Toxiproxy
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.engine.v1 import engine_pb2_grpc as pb_grpc

# The services, in the order they start (each needs the one before it).
ORDER = ("engine", "toxiproxy", "gateway", "nginx")
PROBE_TIMEOUT_S = 1.0


def engine_stats(target: str, request_id: str = "") -> pb.GetStatsResponse:
    """An engine's counters (GetStats), all or one request's. A channel per call:
    a cached one would sit in gRPC's reconnect backoff after an engine restart."""
    with grpc.insecure_channel(target) as channel:
        response: pb.GetStatsResponse = pb_grpc.EngineServiceStub(channel).GetStats(
            pb.GetStatsRequest(request_id=request_id), timeout=5.0)
    return response


def http_ok(url: str) -> bool:
    return httpx.get(url, timeout=PROBE_TIMEOUT_S).status_code == 200


class Endpoints:
    """A lab seen through its ports. Subclasses say who owns the processes."""

    def __init__(self, ports: Ports) -> None:
        self.ports = ports

    # ---- addresses -----------------------------------------------------------
    @property
    def edge_url(self) -> str:
        return edge_url(self.ports)

    @property
    def edge_h2_url(self) -> str:
        return edge_h2_url(self.ports)

    @property
    def tls(self) -> LabTls:
        """The lab CA and nginx's certificate (local lab: `<run_dir>/tls`)."""
        return LabTls(self.tls_dir)

    @property
    def tls_dir(self) -> Path:
        raise NotImplementedError  # each lab says where its certificates are

    @property
    def nginx_url(self) -> str:
        return f"http://{self.ports.host}:{self.ports.nginx_port}"

    @property
    def gateway_url(self) -> str:
        return f"http://{self.ports.host}:{self.ports.gateway_port}"

    @property
    def toxiproxy_url(self) -> str:
        return f"http://{self.ports.host}:{self.ports.toxiproxy_api_port}"

    @property
    def engine_target(self) -> str:
        return f"{self.ports.host}:{self.ports.engine_port}"

    @property
    def engine_hop(self) -> str:
        return f"{self.ports.host}:{self.ports.engine_proxy_port}"

    def urls(self) -> dict[str, str]:
        return {
            "edge": self.edge_url,
            "edge-h2": self.edge_h2_url,
            "nginx": self.nginx_url,
            "gateway": self.gateway_url,
            "toxiproxy": self.toxiproxy_url,
            "engine": f"grpc://{self.engine_target}",
        }

    def proxy_specs(self) -> list[ProxySpec]:
        host = self.ports.host
        return [ProxySpec(h.name, f"{host}:{h.listen_port}", f"{host}:{h.upstream_port}")
                for h in hops(self.ports)]

    # ---- capabilities (none by default; see target.py) --------------------------
    @property
    def pids(self) -> Mapping[str, int] | None:
        return None

    @property
    def logs(self) -> Mapping[str, Path] | None:
        return None

    # ---- probes and handles ------------------------------------------------------
    def probes(self) -> dict[str, Callable[[], bool]]:
        """Each service's own readiness check, by name (ORDER's names)."""
        return {
            "engine": self.engine_healthy,
            "toxiproxy": self.toxiproxy_ready,
            "gateway": lambda: http_ok(f"{self.gateway_url}/healthz"),
            "nginx": lambda: http_ok(f"{self.nginx_url}/nginx-health"),
        }

    def chain_ready(self) -> bool:
        """The whole chain, through every hop: edge → nginx → gateway → engine."""
        return http_ok(f"{self.edge_url}/readyz")

    def h2_ready(self) -> bool:
        """The HTTP/2 edge answers over TLS with the lab CA's certificate and
        negotiates h2 (a compose lab started without certificates has none)."""
        if not self.tls.exists():
            return False
        with httpx.Client(http2=True, verify=self.tls.ssl_context(),
                          timeout=PROBE_TIMEOUT_S) as client:
            response = client.get(f"{self.edge_h2_url}/nginx-health")
        return response.status_code == 200 and response.http_version == "HTTP/2"

    def engine_healthy(self) -> bool:
        with grpc.insecure_channel(self.engine_target) as channel:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=PROBE_TIMEOUT_S)
        return bool(response.status == health_pb2.HealthCheckResponse.SERVING)

    def engine_stats(self, request_id: str = "") -> pb.GetStatsResponse:
        """Counters read straight from the engine (not through any proxy)."""
        return engine_stats(self.engine_target, request_id)

    def toxiproxy(self) -> Toxiproxy:
        return Toxiproxy(self.toxiproxy_url)

    def toxiproxy_ready(self) -> bool:
        client = self.toxiproxy()
        try:
            return {s.name for s in self.proxy_specs()} <= set(client.proxies())
        finally:
            client.close()

    def status(self) -> dict[str, dict[str, Any]]:
        """Each service: address, port, pid (where the lab has pids), running, healthy."""
        ports = {"engine": self.ports.engine_port, "toxiproxy": self.ports.toxiproxy_api_port,
                 "gateway": self.ports.gateway_port, "nginx": self.ports.nginx_port}
        urls, probes, pids = self.urls(), self.probes(), self.pids or {}
        result: dict[str, dict[str, Any]] = {}
        for name in ORDER:
            healthy = _answers(probes[name])
            result[name] = {"url": urls[name], "port": ports[name],
                            "pid": pids.get(name),
                            "running": self._running(name, healthy), "healthy": healthy}
        chain = _answers(self.chain_ready)
        result["edge"] = {"url": self.edge_url, "port": self.ports.edge_port, "pid": None,
                          "running": chain, "healthy": chain}
        h2 = _answers(self.h2_ready)
        result["edge-h2"] = {"url": self.edge_h2_url, "port": self.ports.edge_h2_port,
                             "pid": None, "running": h2, "healthy": h2}
        return result

    def _running(self, name: str, healthy: bool) -> bool:
        """Without pids of its own, a service counts as running when it answers."""
        return healthy


def _answers(probe: Callable[[], bool]) -> bool:
    try:
        return bool(probe())
    except Exception:
        return False
