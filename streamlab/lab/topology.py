"""Ports and hops of the lab, defined once (in lab.env) and read here.

The local-process lab, the pytest fixtures and compose.yaml all take their
ports from lab.env, so a port changes in one place. Environment variables of
the same names override it (the tests do, to run on free ports).

Replicas (docs/topology.md). `streamlab up --gateways N --engines M` runs N
gateways and M engines. Replica k (1-based) of a replicated listener is named
`NAME` for k = 1 and `NAME-k` after (`gateway`, `gateway-2`, …) and listens on

    BASE + (k - 1) * replica_port_step

for each of gateway_port, engine_port, upstream_port (the hops `upstream`,
`upstream-2`, … in front of the gateways) and engine_proxy_port (the hops
`engine`, `engine-2`, … in front of the engines). One rule, in `replica_port`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

# REPO_ROOT: re-exported for the modules that name the clone's files.
from streamlab.paths import REPO_ROOT as REPO_ROOT
from streamlab.paths import lab_env

# lab.env: the clone's, or the installed wheel's copy (streamlab/paths.py).
LAB_ENV = lab_env()


class Ports(BaseSettings):
    """Where every listener of the lab lives. No defaults here: lab.env has them."""

    model_config = SettingsConfigDict(
        env_prefix="STREAMLAB_", env_file=LAB_ENV, extra="ignore", frozen=True
    )

    host: str
    edge_port: int
    edge_h2_port: int
    nginx_port: int
    nginx_h2_port: int
    upstream_port: int
    engine_proxy_port: int
    toxiproxy_api_port: int
    # The second Toxiproxy process: the hops behind nginx (see toxiproxy_process).
    toxiproxy_backend_api_port: int
    gateway_port: int
    engine_port: int
    engine_metrics_port: int  # the engine's Prometheus /metrics (plain HTTP)
    # Redis (the shared resume log) and the Toxiproxy hop `store` in front of it.
    redis_port: int
    store_proxy_port: int
    # How far apart replica k and k+1 of a listener are (the rule above). A default
    # here too: tests build Ports from free ports alone.
    replica_port_step: int = 10
    # The lab console (streamlab/console): a client of the lab, not a hop of it.
    console_port: int
    # Jaeger (`streamlab up --tracing`): OTLP/HTTP in, the query API out.
    jaeger_otlp_port: int
    jaeger_query_port: int
    jaeger_query_grpc_port: int

    @classmethod
    def load(cls) -> Ports:
        """Ports from lab.env, overridden by STREAMLAB_* environment variables,
        then every port moved by STREAMLAB_PORT_OFFSET (a second lab beside the
        first, for a before/after run on one machine: lab.env)."""
        ports = cls()
        offset = port_offset(os.environ.get(PORT_OFFSET_VAR, ""))
        if not offset:
            return ports
        moved = {name: value + offset for name, value in ports.model_dump().items()
                 if name.endswith("_port")}
        if max(moved.values()) + ports.replica_port_step * 9 > 65535:
            raise ValueError(f"{PORT_OFFSET_VAR}={offset} moves a port past 65535")
        return ports.model_copy(update=moved)


PORT_OFFSET_VAR = "STREAMLAB_PORT_OFFSET"

# zerolog's level names, which Toxiproxy's LOG_LEVEL takes.
ToxiproxyLogLevel = Literal["trace", "debug", "info", "warn", "error", "fatal", "panic"]


class ToxiproxyRuntime(BaseSettings):
    """How each Toxiproxy process runs (lab.env): the same for the local lab and
    compose.yaml, which passes these keys as the containers' environment."""

    model_config = SettingsConfigDict(
        env_prefix="STREAMLAB_TOXIPROXY_", env_file=LAB_ENV, extra="ignore", frozen=True
    )

    # Go's scheduler threads. One: on these two cores a second one costs more in
    # hand-offs between threads than it runs (docs/cost.md, Toxiproxy on one thread).
    gomaxprocs: int = Field(ge=1)
    # Unset, Toxiproxy logs every level: eight lines a connection.
    log_level: ToxiproxyLogLevel

    def environment(self) -> dict[str, str]:
        """The variables the Go runtime and Toxiproxy read."""
        return {"GOMAXPROCS": str(self.gomaxprocs), "LOG_LEVEL": self.log_level}


def port_offset(text: str) -> int:
    """STREAMLAB_PORT_OFFSET's value: empty is 0; anything else a whole number."""
    if not text.strip():
        return 0
    try:
        offset = int(text)
    except ValueError:
        raise ValueError(f"{PORT_OFFSET_VAR} must be a whole number of ports, not {text!r}") \
            from None
    if offset < 0:
        raise ValueError(f"{PORT_OFFSET_VAR} must not be negative, not {offset}")
    return offset


@dataclass(frozen=True)
class Hop:
    """One Toxiproxy proxy: a named listener in front of the next service."""

    name: str
    listen_port: int
    upstream_port: int
    # The compose service listening on upstream_port (compose.yaml's service names).
    upstream_service: str = ""


@dataclass(frozen=True)
class Replicas:
    """How many of each replicated service a lab runs, and whether Redis runs."""

    gateways: int = 1
    engines: int = 1
    # Redis behind the `store` hop: started for several gateways (they share the
    # resume log) or on request (`--store redis`).
    redis: bool = False

    def __post_init__(self) -> None:
        if self.gateways < 1 or self.engines < 1:
            raise ValueError("a lab needs at least one gateway and one engine")


def replica_name(base: str, k: int) -> str:
    """`gateway` for k = 1, `gateway-2` for k = 2, …"""
    return base if k == 1 else f"{base}-{k}"


def replica_names(base: str, count: int) -> tuple[str, ...]:
    return tuple(replica_name(base, k) for k in range(1, count + 1))


def replica_port(ports: Ports, base_port: int, k: int) -> int:
    """The one port rule for replicas (module docstring): k is 1-based."""
    return base_port + (k - 1) * ports.replica_port_step


_REPLICA = re.compile(r"^(?P<base>[a-z][a-z0-9]*)(?:-(?P<k>[2-9]|[1-9][0-9]+))?$")


def split_replica(name: str) -> tuple[str, int]:
    """`gateway-2` → ("gateway", 2); `gateway` → ("gateway", 1); `edge-h2` → itself, 1."""
    match = _REPLICA.match(name)
    if match is None:
        return name, 1
    return match["base"], int(match["k"] or 1)


# The faultable hops of a one-gateway, one-engine lab, client side first (as
# hops() builds them). Replicas add `upstream-2`, `engine-2`, …; Redis adds one
# store hop per gateway (`store`, `store-2`, …: one replica can be cut from Redis
# alone, the split-brain case of the `store-partition` scenario).
HOP_NAMES = ("edge", "edge-h2", "upstream", "engine")
STORE_HOP = "store"


def is_hop_name(name: str) -> bool:
    """A name a hop of some lab can have (whether this lab runs it is Toxiproxy's to say)."""
    base, k = split_replica(name)
    return (name in HOP_NAMES or name == STORE_HOP
            or (k > 1 and base in ("upstream", "engine", STORE_HOP)))


def hops(ports: Ports, replicas: Replicas | None = None) -> tuple[Hop, ...]:
    """The faultable hops, client side first. Two edges into nginx: the plain
    HTTP/1.1 listener and the TLS + HTTP/2 one (a TCP proxy passes TLS through
    unchanged, so its toxics act on the encrypted bytes). Each gateway and each
    engine has its own hop, so one replica can be faulted alone."""
    replicas = replicas or Replicas()
    result = [
        Hop("edge", ports.edge_port, ports.nginx_port, "nginx"),
        Hop("edge-h2", ports.edge_h2_port, ports.nginx_h2_port, "nginx"),
    ]
    for k in range(1, replicas.gateways + 1):
        result.append(Hop(replica_name("upstream", k), replica_port(ports, ports.upstream_port, k),
                          replica_port(ports, ports.gateway_port, k), replica_name("gateway", k)))
    for k in range(1, replicas.engines + 1):
        result.append(Hop(replica_name("engine", k),
                          replica_port(ports, ports.engine_proxy_port, k),
                          replica_port(ports, ports.engine_port, k), replica_name("engine", k)))
    if replicas.redis:
        # Each gateway reaches Redis through a hop of its own (store_url_of).
        for k in range(1, replicas.gateways + 1):
            result.append(Hop(replica_name(STORE_HOP, k),
                              replica_port(ports, ports.store_proxy_port, k),
                              ports.redis_port, "redis"))
    return tuple(result)


def hops_of(replicas: Replicas, kind: str) -> tuple[str, ...]:
    """Every hop of one kind: `engine` → ("engine", "engine-2", …), `upstream`
    and `store` (one per gateway) likewise; any other hop is the only one of its
    kind. A test that faults "the engine hop" (or "the store") faults them all,
    or traffic through another replica's hop would bypass the fault."""
    count = {"upstream": replicas.gateways, "engine": replicas.engines,
             STORE_HOP: replicas.gateways if replicas.redis else 1}.get(kind)
    return replica_names(kind, count) if count else (kind,)


# Toxiproxy runs as two processes (each stream holds two sockets per HTTP hop in
# Toxiproxy, and a process may hold 20,000 files here): "toxiproxy" holds the
# client-side hops, "toxiproxy-backend" every hop behind nginx.
TOXIPROXY_PROCESSES = ("toxiproxy", "toxiproxy-backend")
CLIENT_SIDE_HOPS = ("edge", "edge-h2")


def toxiproxy_process(hop: str) -> str:
    """The Toxiproxy process that serves a hop (a name of TOXIPROXY_PROCESSES)."""
    return "toxiproxy" if hop in CLIENT_SIDE_HOPS else "toxiproxy-backend"


def toxiproxy_api_port(ports: Ports, process: str) -> int:
    return (ports.toxiproxy_api_port if process == "toxiproxy"
            else ports.toxiproxy_backend_api_port)


def edge_url(ports: Ports) -> str:
    return f"http://{ports.host}:{ports.edge_port}"


def edge_h2_url(ports: Ports) -> str:
    """The HTTP/2 edge: TLS with the lab CA's certificate (streamlab/lab/tls.py)."""
    return f"https://{ports.host}:{ports.edge_h2_port}"


def console_url(ports: Ports) -> str:
    return f"http://{ports.host}:{ports.console_port}"
