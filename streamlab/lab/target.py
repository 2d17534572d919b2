"""LabTarget: what every running lab is to the tools that measure it.

    LabTarget (a Protocol)
      ├── Lab         local processes that `streamlab up` started   (lab.py)
      └── ComposeLab  a compose project, through its published ports (compose.py)

Scenarios, the soak, the benches and the integration tests take a LabTarget
and reach the services through its addresses and handles (endpoints.py has
the code both labs share). What only one kind of lab can give is a
*capability*, None where it is absent, so a caller asks for it by name
instead of guessing from which services it happens to know:

    pids   service name -> host pid: CPU and RSS readings, signals (local only;
           a compose service's process lives in a container)
    logs   service name -> its log file on this host (local only; compose
           services log to their containers' output)

Lifecycle is not part of it: the local lab is brought up and down by this
tool (`Lab.up`/`Lab.down`), the compose lab by compose; both can stop, kill
and start one service, which fault tests and the soak need.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from streamlab.errors import StreamlabError

if TYPE_CHECKING:
    from streamlab.lab.local import LabOptions
    from streamlab.lab.tls import LabTls
    from streamlab.lab.topology import Ports
    from streamlab.lab.toxiproxy import Toxiproxy
    from streamlab_protocol.engine.v1 import engine_pb2 as pb


class LabTarget(Protocol):
    @property
    def ports(self) -> Ports: ...

    @property
    def options(self) -> LabOptions:
        """The services' settings as the lab gave them (idle timeouts, keepalives)."""
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

    # ---- handles ----------------------------------------------------------------
    def toxiproxy(self, timeout_s: float = 5.0) -> Toxiproxy: ...

    def engine_stats(self, request_id: str = "") -> pb.GetStatsResponse:
        """Every engine's counters, summed, and their records (endpoints.py)."""
        ...

    # ---- replicas (docs/topology.md): one of each unless the lab runs more -----------
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

    # ---- one service at a time (fault tests, the soak) ----------------------------
    def start_service(self, name: str) -> None:
        """Start it and wait until the whole chain serves again."""
        ...

    def stop_service(self, name: str, grace_s: float = 10.0) -> None: ...

    def kill_service(self, name: str) -> None:
        """SIGKILL, no grace: a crash."""
        ...

    # ---- capabilities: None where this lab cannot give them -----------------------
    @property
    def pids(self) -> Mapping[str, int] | None: ...

    @property
    def logs(self) -> Mapping[str, Path] | None: ...


class MissingCapability(StreamlabError, RuntimeError):
    """A measurement needs something this lab cannot give (pids, logs)."""

    def __init__(self, capability: str, why: str) -> None:
        super().__init__(f"{why}: needs the lab's {capability}, which only a local-process "
                         f"lab has (this one is a compose project; STREAMLAB_TARGET=local)")
        self.capability = capability


def pid_or_none(lab: LabTarget, service: str) -> int | None:
    """The service's host pid, if the lab has pids and the service runs."""
    pids = lab.pids
    return pids.get(service) if pids is not None else None


def pids_of(lab: LabTarget, why: str) -> Mapping[str, int]:
    """The lab's pids, or MissingCapability saying who needed them and why."""
    pids = lab.pids
    if pids is None:
        raise MissingCapability("pids", why)
    return pids
