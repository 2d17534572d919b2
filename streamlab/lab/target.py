"""LabTarget: the one abstraction of a lab that this tool measures and breaks.

    LabTarget (a Protocol: what the experiments may ask of any lab)
      ├── ServedLab   the shared implementation of a lab whose services this tool
      │   │           reaches through their ports (endpoints.py)
      │   ├── Lab         local processes that `streamlab up` started  (local.py)
      │   └── ComposeLab  a compose project, through its published ports (compose.py)
      └── FakeLab     no processes at all: addresses never dialled, a recording
                      Toxiproxy, scripted engine records, for unit tests (fake.py)

Scenarios, the soak, the benches and the integration tests take a LabTarget
and reach the services through its addresses and handles. Every target has the
addresses, the hop names (`hops_of`), the services' settings (`options`, a
LabSettings: what an experiment may read of them, whatever the kind of lab) and
a Toxiproxy client. What not every target can give is a *capability*, declared in
`target.capabilities`, so an experiment names what it needs and is skipped with
that reason (`missing`, `require`) instead of guessing from the class:

    pids             service name -> host pid: CPU, RSS, signals (`pids`; local only,
                     a compose service's process lives in a container)
    logs             service name -> its log file on this host (`logs`; local only)
    toggle_hops      Toxiproxy hops to add toxics to and turn off and on (`toxiproxy()`)
    restart_service  stop, kill and start one service (`stop_service`, ...)
    engine_record    the engine's counters and per-request records (`engine_stats`)
    replicas         more than one gateway or engine (`gateway_names`, `engine_names`)

A member a capability guards raises MissingCapability (or, for `pids` and
`logs`, is None) on a target without it. Which proxy sits at the edge is a
fact, not a capability: `target.edge_proxy` ("nginx", or the proxy a local lab
was started with: `streamlab up --proxy haproxy`, docs/proxies.md).

Lifecycle is not part of it: the local lab is brought up and down by this tool
(`Lab.up`/`Lab.down`), the compose lab by compose, the fake lab by the test.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from streamlab.errors import StreamlabError

if TYPE_CHECKING:
    from services.engine.settings import EngineSettings
    from services.gateway.settings import GatewaySettings
    from streamlab.lab.nginx import NginxOptions
    from streamlab.lab.tls import LabTls
    from streamlab.lab.topology import Ports
    from streamlab.lab.toxiproxy import ToxiproxyClient
    from streamlab_protocol.engine.v1 import engine_pb2 as pb


class Capability(StrEnum):
    """What a target may or may not offer (module docstring). A StrEnum: a
    capability prints, compares and serialises as its name."""

    PIDS = "pids"
    LOGS = "logs"
    TOGGLE_HOPS = "toggle_hops"
    RESTART_SERVICE = "restart_service"
    ENGINE_RECORD = "engine_record"
    REPLICAS = "replicas"


# Who has each capability, for the message of a run that lacks one (keyed by
# the capability, found by its name too: a Capability is its name).
WHERE_TO_GET: dict[str, str] = {
    Capability.PIDS: "a local-process lab has it (STREAMLAB_TARGET=local)",
    Capability.LOGS: "a local-process lab has it (STREAMLAB_TARGET=local)",
    Capability.TOGGLE_HOPS: "a lab with Toxiproxy in front of each hop has it",
    Capability.RESTART_SERVICE: "the local and compose labs have it",
    Capability.ENGINE_RECORD: "a lab whose engine answers GetStats has it",
    Capability.REPLICAS: "a lab started with several gateways or engines has it "
                         "(`streamlab up --gateways 2 --engines 2`)",
}


class LabSettings(Protocol):
    """How a lab set its services up, as far as an experiment may read it (the
    local lab's LabOptions is one; the compose and fake labs hand one too). The
    env overrides are the lab's own: a bench that restarts a service on other
    settings changes them there, and puts them back."""

    @property
    def nginx(self) -> NginxOptions:
        """The edge proxy's timeouts (idle, send) as the lab rendered them."""
        ...

    @property
    def gateway_env(self) -> dict[str, str]: ...

    @property
    def engine_env(self) -> dict[str, str]: ...

    @property
    def proxy_config(self) -> Path | None:
        """The user's own edge proxy config (`streamlab up --proxy-config`), if any."""
        ...

    def gateway_settings(self) -> GatewaySettings:
        """Typed: the gateways' settings, the lab's overrides on the defaults."""
        ...

    def engine_settings(self) -> EngineSettings: ...


class LabTarget(Protocol):
    # ---- what this target is ----------------------------------------------------
    @property
    def capabilities(self) -> frozenset[Capability]:
        """What this target offers beyond the members every target has."""
        ...

    @property
    def edge_proxy(self) -> str:
        """The proxy at the edge, between the edge hop and the gateways: "nginx",
        "haproxy", "caddy" or "traefik" (streamlab/lab/proxies)."""
        ...

    @property
    def ports(self) -> Ports: ...

    @property
    def options(self) -> LabSettings:
        """The services' settings as the lab gave them (idle timeouts, keepalives);
        typed: `options.gateway_settings()`, `options.engine_settings()`."""
        ...

    @property
    def run_dir(self) -> Path:
        """Where `streamlab ... --run-dir` finds this lab from another process."""
        ...

    # ---- addresses --------------------------------------------------------------
    @property
    def edge_url(self) -> str:
        """Where clients connect: the whole chain, every hop's toxics on the way."""
        ...

    @property
    def edge_h2_url(self) -> str:
        """The HTTP/2 edge: https, through Toxiproxy "edge-h2" to nginx's TLS listener."""
        ...

    @property
    def tls(self) -> LabTls:
        """The lab CA a client trusts for edge_h2_url (docs/http2.md)."""
        ...

    def h2_ready(self) -> bool:
        """The HTTP/2 edge answers and negotiates h2."""
        ...

    @property
    def nginx_url(self) -> str:
        """nginx itself, past the edge hop."""
        ...

    @property
    def gateway_url(self) -> str:
        """The gateway itself, past nginx and both HTTP hops."""
        ...

    @property
    def toxiproxy_url(self) -> str:
        """Toxiproxy's API (toxics, hops on and off, wire byte counters)."""
        ...

    @property
    def engine_target(self) -> str:
        """host:port of the engine itself, past every proxy."""
        ...

    @property
    def engine_hop(self) -> str:
        """host:port of Toxiproxy's engine proxy (what the gateway dials)."""
        ...

    # ---- replicas (docs/topology.md): one of each unless the lab runs more -------
    @property
    def engine_names(self) -> tuple[str, ...]:
        """`engine`, `engine-2`, …: the names to stop, kill or start them by."""
        ...

    @property
    def gateway_names(self) -> tuple[str, ...]: ...

    def url_of(self, name: str) -> str:
        """A service or replica straight (`gateway-2` → http://host:port)."""
        ...

    def engine_metrics_url_of(self, name: str) -> str: ...

    def hops_of(self, kind: str) -> tuple[str, ...]:
        """Every hop of a kind (`engine` → `engine`, `engine-2`, …), to fault them all."""
        ...

    def status(self) -> dict[str, dict[str, Any]]: ...

    # ---- toggle_hops ------------------------------------------------------------
    def toxiproxy(self, timeout_s: float = 5.0) -> ToxiproxyClient: ...

    # ---- engine_record ----------------------------------------------------------
    def engine_stats(self, request_id: str = "") -> pb.GetStatsResponse:
        """Every engine's counters, summed, and their records (endpoints.py)."""
        ...

    # ---- restart_service: one service at a time (fault tests, the soak) -----------
    def start_service(self, name: str) -> None:
        """Start it and wait until the whole chain serves again."""
        ...

    def stop_service(self, name: str, grace_s: float = 10.0) -> None: ...

    def kill_service(self, name: str) -> None:
        """SIGKILL, no grace: a crash."""
        ...

    # ---- pids and logs: None where this lab cannot give them ----------------------
    @property
    def pids(self) -> Mapping[str, int] | None: ...

    @property
    def logs(self) -> Mapping[str, Path] | None: ...


class TargetUnreachable(StreamlabError, RuntimeError):
    """The target is not there: a lab whose Toxiproxy API does not answer, a
    server that does not answer HTTP. Nothing after it could run either, so an
    experiment stops and its command exits 3."""


class MissingCapability(StreamlabError, RuntimeError):
    """A measurement needs something this lab cannot give (pids, logs, ...)."""

    def __init__(self, capability: str, why: str) -> None:
        hint = WHERE_TO_GET.get(capability)
        super().__init__(f"{why}: needs the lab's {capability}, which this lab does not have"
                         + (f"; {hint}" if hint else ""))
        self.capability = capability


def missing(target: LabTarget, needs: Iterable[Capability]) -> frozenset[Capability]:
    """What of `needs` this target lacks: empty when it can run the experiment."""
    return frozenset(needs) - target.capabilities


def require(target: LabTarget, needs: Iterable[Capability], why: str) -> None:
    """MissingCapability naming the first capability (in declaration order) that
    `target` lacks, with who needed it and why; nothing when it has them all."""
    lacking = missing(target, needs)
    for capability in Capability:
        if capability in lacking:
            raise MissingCapability(capability, why)


def pid_or_none(lab: LabTarget, service: str) -> int | None:
    """The service's host pid, if the lab has pids and the service runs."""
    pids = lab.pids
    return pids.get(service) if pids is not None else None


def pids_of(lab: LabTarget, why: str) -> Mapping[str, int]:
    """The lab's pids, or MissingCapability saying who needed them and why."""
    pids = lab.pids
    if pids is None:
        raise MissingCapability(Capability.PIDS, why)
    return pids
