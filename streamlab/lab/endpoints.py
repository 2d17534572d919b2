"""ServedLab: the shared implementation of a lab whose services this tool
reaches through their ports. It is the common parent of the two real
LabTargets (target.py has the abstraction, its members and capabilities):

    ServedLab   addresses, health probes, Toxiproxy and GetStats handles, all
      │         derived from the ports and the replica counts
      ├── Lab         local processes this tool starts: adds pids, logs, and
      │               stopping and starting one service           (local.py)
      └── ComposeLab  a compose project: stops and starts services through the
                      compose command; no pids, no logs           (compose.py)

The two differ only in who owns the processes; everything that talks to a
service through a port lives here once. A ServedLab alone (no subclass) is
just the addresses of a lab at some ports: the console uses it that way. The
fake lab for unit tests (fake.py) is a LabTarget too, but dials nothing, so
it borrows only the pure address rules from here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from streamlab.lab.target import Capability
from streamlab.lab.tls import LabTls
from streamlab.lab.topology import (
    TOXIPROXY_PROCESSES,
    Ports,
    Replicas,
    edge_h2_url,
    edge_url,
    hops,
    hops_of,
    replica_names,
    replica_port,
    split_replica,
    toxiproxy_api_port,
    toxiproxy_process,
)
from streamlab.lab.toxiproxy import ProxySpec, Toxiproxy
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.engine.v1 import engine_pb2_grpc as pb_grpc

REDIS = "redis"
# How Redis keeps the gateways' shared resume log (docs/resume.md, "Redis
# restarts"): an append-only file, written before Redis answers and fsynced
# every second, so a Redis process that is killed and started again on the
# same dir loses no acknowledged write (a resume after it has no gap), and a
# machine that crashes loses at most about a second. No RDB snapshots.
REDIS_PERSISTENCE = ("--save", "", "--appendonly", "yes", "--appendfsync", "everysec")
# The broken mode: a scratch store; a Redis restart empties the log (a resume
# then gets a `gap` of every event written before it).
REDIS_NO_PERSISTENCE = ("--save", "", "--appendonly", "no")
PROBE_TIMEOUT_S = 1.0


def engine_stats(target: str, request_id: str = "") -> pb.GetStatsResponse:
    """An engine's counters (GetStats), all or one request's. A channel per call:
    a cached one would sit in gRPC's reconnect backoff after an engine restart."""
    with grpc.insecure_channel(target) as channel:
        response: pb.GetStatsResponse = pb_grpc.EngineServiceStub(channel).GetStats(
            pb.GetStatsRequest(request_id=request_id), timeout=5.0)
    return response


def merge_stats(each: list[pb.GetStatsResponse]) -> pb.GetStatsResponse:
    """Several engines' GetStats as one: numbers summed (counters, and the load's
    slots and queues), records one after another, a string (backend, device)
    from the first engine."""
    merged = pb.GetStatsResponse()
    for stats in each:
        _add_into(merged, stats)
    return merged


def _add_into(total: Any, one: Any) -> None:
    for field, value in one.ListFields():
        if field.is_repeated:
            getattr(total, field.name).extend(value)
        elif field.message_type is not None:
            _add_into(getattr(total, field.name), value)
        elif isinstance(value, str):
            if not getattr(total, field.name):
                setattr(total, field.name, value)
        else:
            setattr(total, field.name, getattr(total, field.name) + value)


def http_ok(url: str) -> bool:
    return httpx.get(url, timeout=PROBE_TIMEOUT_S).status_code == 200


class ServedLab:
    """A lab seen through its ports. Subclasses say who owns the processes, and
    add the capabilities that owning them gives (`OWN_CAPABILITIES`)."""

    # Both labs put nginx at the edge (proxies/nginx); a lab with another edge
    # proxy says so here, and scenarios about nginx's settings check it.
    edge_proxy: str = "nginx"
    # What a lab reached only through its ports can do: fault its hops through
    # Toxiproxy and read the engine's records over gRPC.
    OWN_CAPABILITIES: frozenset[Capability] = frozenset(
        {Capability.TOGGLE_HOPS, Capability.ENGINE_RECORD})

    def __init__(self, ports: Ports, replicas: Replicas | None = None) -> None:
        self.ports = ports
        self.replicas = replicas or Replicas()

    @property
    def capabilities(self) -> frozenset[Capability]:
        several = self.replicas.gateways > 1 or self.replicas.engines > 1
        return self.OWN_CAPABILITIES | ({Capability.REPLICAS} if several else set())

    # ---- replicas ------------------------------------------------------------
    @property
    def gateway_names(self) -> tuple[str, ...]:
        return replica_names("gateway", self.replicas.gateways)

    @property
    def engine_names(self) -> tuple[str, ...]:
        return replica_names("engine", self.replicas.engines)

    def order(self) -> tuple[str, ...]:
        """Every service of this lab in start order: engines (and Redis) before
        Toxiproxy, Toxiproxy before the gateways, nginx last."""
        redis = (REDIS,) if self.replicas.redis else ()
        return (*self.engine_names, *redis, *TOXIPROXY_PROCESSES, *self.gateway_names, "nginx")

    def port_of(self, name: str) -> int:
        """The port a service (or replica: `gateway-2`) listens on."""
        base, k = split_replica(name)
        base_ports = {"engine": self.ports.engine_port, "gateway": self.ports.gateway_port}
        if base in base_ports:
            return replica_port(self.ports, base_ports[base], k)
        return {"toxiproxy": self.ports.toxiproxy_api_port,
                "toxiproxy-backend": self.ports.toxiproxy_backend_api_port,
                "nginx": self.ports.nginx_port,
                REDIS: self.ports.redis_port}[name]

    def url_of(self, name: str) -> str:
        base, _ = split_replica(name)
        address = f"{self.ports.host}:{self.port_of(name)}"
        scheme = {"engine": "grpc", "gateway": "http", "toxiproxy": "http",
                  "toxiproxy-backend": "http", "nginx": "http",
                  REDIS: "redis"}[base]
        return f"{scheme}://{address}"

    def engine_target_of(self, name: str) -> str:
        """One engine, straight (not through its hop): for probes and GetStats."""
        return f"{self.ports.host}:{self.port_of(name)}"

    def engine_stats_of(self, name: str, request_id: str = "") -> pb.GetStatsResponse:
        return engine_stats(self.engine_target_of(name), request_id)

    def engine_metrics_url_of(self, name: str) -> str:
        """One engine's Prometheus /metrics (its port by the replica rule)."""
        _, k = split_replica(name)
        port = replica_port(self.ports, self.ports.engine_metrics_port, k)
        return f"http://{self.ports.host}:{port}/metrics"

    def hops_of(self, kind: str) -> tuple[str, ...]:
        """Every hop of one kind (topology.hops_of): faulting "the engine hop"
        faults every engine's."""
        return hops_of(self.replicas, kind)

    @property
    def redis_url(self) -> str:
        """Redis straight (not through the `store` hop)."""
        return f"redis://{self.ports.host}:{self.ports.redis_port}/0"

    @property
    def store_url(self) -> str:
        """Redis through the `store` hop: what the first gateway uses."""
        return self.store_url_of("gateway")

    def store_url_of(self, gateway: str) -> str:
        """Redis through this gateway's own store hop (`store` for `gateway`,
        `store-2` for `gateway-2`, …): one replica can be cut from it alone."""
        _, k = split_replica(gateway)
        port = replica_port(self.ports, self.ports.store_proxy_port, k)
        return f"redis://{self.ports.host}:{port}/0"

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
        """The API of the Toxiproxy process with the client-side hops (Toxiproxy's
        default port); `toxiproxy()` reaches every hop by name."""
        return self.toxiproxy_process_url("toxiproxy")

    def toxiproxy_process_url(self, process: str) -> str:
        return f"http://{self.ports.host}:{toxiproxy_api_port(self.ports, process)}"

    def toxiproxy_routes(self) -> dict[str, str]:
        """Each hop's name → the API of the Toxiproxy process serving it."""
        return {h.name: self.toxiproxy_process_url(toxiproxy_process(h.name))
                for h in hops(self.ports, self.replicas)}

    @property
    def engine_target(self) -> str:
        return f"{self.ports.host}:{self.ports.engine_port}"

    @property
    def engine_hop(self) -> str:
        """The gateways' engine target: the engine hop, or with several engines
        every engine hop as one gRPC target (`ipv4:a:p1,a:p2`), balanced by the
        gateway's channel (round_robin with health checks, docs/topology.md)."""
        host = self.ports.host
        if self.replicas.engines == 1:
            return f"{host}:{self.ports.engine_proxy_port}"
        addresses = ",".join(
            f"{host}:{replica_port(self.ports, self.ports.engine_proxy_port, k)}"
            for k in range(1, self.replicas.engines + 1))
        return f"ipv4:{addresses}"

    def urls(self) -> dict[str, str]:
        return {
            "edge": self.edge_url,
            "edge-h2": self.edge_h2_url,
            "nginx": self.nginx_url,
            "gateway": self.gateway_url,
            "toxiproxy": self.toxiproxy_url,
            "toxiproxy-backend": self.toxiproxy_process_url("toxiproxy-backend"),
            "engine": f"grpc://{self.engine_target}",
        }

    def proxy_specs(self, process: str | None = None) -> list[ProxySpec]:
        """The hops as Toxiproxy proxies: all, or those one Toxiproxy process serves."""
        host = self.ports.host
        return [ProxySpec(h.name, f"{host}:{h.listen_port}", f"{host}:{h.upstream_port}")
                for h in hops(self.ports, self.replicas)
                if process is None or toxiproxy_process(h.name) == process]

    # ---- pids and logs: none here (Lab has them; see target.py) -------------------
    @property
    def pids(self) -> Mapping[str, int] | None:
        return None

    @property
    def logs(self) -> Mapping[str, Path] | None:
        return None

    # ---- probes and handles ------------------------------------------------------
    def probes(self) -> dict[str, Callable[[], bool]]:
        """Each service's own readiness check, by name (`order()`'s names)."""
        probes: dict[str, Callable[[], bool]] = {
            **{process: functools.partial(self.toxiproxy_ready, process)
               for process in TOXIPROXY_PROCESSES},
            "nginx": lambda: http_ok(f"{self.nginx_url}/nginx-health"),
        }
        for name in self.engine_names:
            probes[name] = functools.partial(self.engine_healthy, name)
        for name in self.gateway_names:
            probes[name] = functools.partial(http_ok, f"{self.url_of(name)}/healthz")
        if self.replicas.redis:
            probes[REDIS] = self.redis_ready
        return probes

    def redis_ready(self) -> bool:
        """Redis answers PING (straight, not through the `store` hop)."""
        import redis

        client = redis.Redis(host=self.ports.host, port=self.ports.redis_port,
                             socket_timeout=PROBE_TIMEOUT_S,
                             socket_connect_timeout=PROBE_TIMEOUT_S)
        try:
            return bool(client.ping())
        finally:
            client.close()

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

    def engine_healthy(self, name: str = "engine") -> bool:
        with grpc.insecure_channel(self.engine_target_of(name)) as channel:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=PROBE_TIMEOUT_S)
        return bool(response.status == health_pb2.HealthCheckResponse.SERVING)

    def engine_stats(self, request_id: str = "") -> pb.GetStatsResponse:
        """Counters read straight from the engine (not through any proxy); with
        several engines, every engine's, summed (and their generations' records
        together): a request may have gone to any of them, and a count of
        generations must see them all. `engine_stats_of` reads one."""
        if self.replicas.engines == 1:
            return engine_stats(self.engine_target, request_id)
        return merge_stats([self.engine_stats_of(name, request_id)
                            for name in self.engine_names])

    def toxiproxy(self, timeout_s: float = 5.0) -> Toxiproxy:
        """Every hop by name, whichever Toxiproxy process serves it."""
        return Toxiproxy(self.toxiproxy_url, timeout_s=timeout_s,
                         routes=self.toxiproxy_routes())

    def toxiproxy_ready(self, process: str | None = None) -> bool:
        """The hops of one Toxiproxy process (or of all) exist."""
        with (Toxiproxy(self.toxiproxy_process_url(process)) if process
              else self.toxiproxy()) as client:
            return {s.name for s in self.proxy_specs(process)} <= set(client.proxies())

    def status(self) -> dict[str, dict[str, Any]]:
        """Each service: address, port, pid (where the lab has pids), running, healthy."""
        probes, pids = self.probes(), self.pids or {}
        result: dict[str, dict[str, Any]] = {}
        for name in self.order():
            healthy = _answers(probes[name])
            result[name] = {"url": self.url_of(name), "port": self.port_of(name),
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
