"""FakeLab: a LabTarget with no processes, so the lab tool's own logic (the
scenario runner, the soak's judge, an experiment's capability checks) can be
unit-tested without starting a lab.

    FakeLab
      ├── addresses      the real rules (ServedLab's) on host `fake-lab.invalid`:
      │                  a name that never resolves, so nothing can dial it
      ├── toxiproxy()    FakeToxiproxy: the lab's hops in memory, every call
      │                  recorded (`calls`), Toxiproxy's refusals (404, 409) kept
      ├── engine_stats   what the test put in `lab.engine` (a GetStatsResponse),
      │                  records filtered by request id as the engine does
      ├── stop/kill/start_service  recorded in `service_calls`; `status()` shows
      │                  a stopped service as not running
      └── capabilities   settable; a member whose capability is off raises
                         MissingCapability (pids, logs: None), as a real lab would

It is typed as a LabTarget wherever it is used, so mypy holds it to the same
protocol as the local and compose labs (target.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from streamlab.lab.endpoints import ServedLab
from streamlab.lab.local import LabOptions
from streamlab.lab.target import Capability, require
from streamlab.lab.tls import LabTls
from streamlab.lab.topology import Ports, hops_of
from streamlab.lab.toxiproxy import ProxySpec, Toxic, ToxiproxyError
from streamlab_protocol.engine.v1 import engine_pb2 as pb

# RFC 6761: `.invalid` never resolves, so an address of the fake lab that some
# code dials by mistake fails at once instead of reaching a real lab.
FAKE_HOST = "fake-lab.invalid"
# Nothing of the fake lab is written to disk; a write by mistake fails here.
FAKE_RUN_DIR = Path("/nonexistent/streamlab-fake-lab")

# What a fake lab offers unless the test says otherwise: what a lab reached
# through its ports has, plus restarts (the fake's are only recorded). No pids
# and no logs: it has no processes and writes no logs.
DEFAULT_CAPABILITIES = frozenset({Capability.TOGGLE_HOPS, Capability.ENGINE_RECORD,
                                  Capability.RESTART_SERVICE})

ToxiproxyOp = Literal["reset", "set_enabled", "set_upstream", "add_toxic", "update_toxic",
                      "remove_toxic"]


@dataclass(frozen=True)
class ToxiproxyCall:
    """One change a client asked of the fake Toxiproxy."""

    op: ToxiproxyOp
    hop: str = ""  # empty for reset, which is every hop's
    toxic: str = ""  # the toxic's name; for set_enabled "on" or "off"; set_upstream: host:port


@dataclass
class _Proxy:
    spec: ProxySpec
    enabled: bool = True
    toxics: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {**self.spec.as_json(), "enabled": self.enabled,
                "toxics": list(self.toxics.values())}


class FakeToxiproxy:
    """Toxiproxy's API (the ToxiproxyClient protocol) held in memory: one state
    for the whole fake lab, as the real server's is, whichever client asks.
    Every change is appended to `calls`, so a test can assert what was applied
    and that it was taken off again on every exit path."""

    def __init__(self, specs: Iterable[ProxySpec]) -> None:
        self._proxies = {spec.name: _Proxy(spec) for spec in specs}
        self.calls: list[ToxiproxyCall] = []
        self.closes = 0
        # False: the API does not answer at all (the lab is down), as a refused
        # connection looks to the real client.
        self.answers = True

    # ---- what a test reads ------------------------------------------------------
    def active(self) -> dict[str, tuple[str, ...]]:
        """Each hop that has toxics now → their names, in the order added."""
        return {name: tuple(proxy.toxics) for name, proxy in self._proxies.items()
                if proxy.toxics}

    def disabled(self) -> tuple[str, ...]:
        return tuple(name for name, proxy in self._proxies.items() if not proxy.enabled)

    def ops(self) -> list[ToxiproxyOp]:
        return [call.op for call in self.calls]

    # ---- the ToxiproxyClient protocol ------------------------------------------
    def close(self) -> None:
        self.closes += 1

    def __enter__(self) -> FakeToxiproxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _answer(self) -> None:
        if not self.answers:
            raise ToxiproxyError(0, "connection refused")

    def _proxy(self, name: str) -> _Proxy:
        self._answer()
        proxy = self._proxies.get(name)
        if proxy is None:  # what the real API answers for a hop the lab has not
            raise ToxiproxyError(404, "proxy not found")
        return proxy

    def proxies(self) -> dict[str, dict[str, Any]]:
        self._answer()
        return {name: proxy.as_json() for name, proxy in self._proxies.items()}

    def reset(self) -> None:
        self._answer()
        for proxy in self._proxies.values():
            proxy.enabled = True
            proxy.toxics.clear()
        self.calls.append(ToxiproxyCall("reset"))

    def proxy(self, name: str) -> dict[str, Any]:
        return self._proxy(name).as_json()

    def set_enabled(self, proxy: str, enabled: bool) -> None:
        self._proxy(proxy).enabled = enabled
        self.calls.append(ToxiproxyCall("set_enabled", proxy, "on" if enabled else "off"))

    def set_upstream(self, proxy: str, upstream: str) -> None:
        held = self._proxy(proxy)
        held.spec = replace(held.spec, upstream=upstream)
        self.calls.append(ToxiproxyCall("set_upstream", proxy, upstream))

    def toxics(self, proxy: str) -> list[dict[str, Any]]:
        return list(self._proxy(proxy).toxics.values())

    def add_toxic(self, proxy: str, toxic: Toxic) -> dict[str, Any]:
        held = self._proxy(proxy).toxics
        body = toxic.as_json()
        if body["name"] in held:  # Toxiproxy refuses a second toxic of one name
            raise ToxiproxyError(409, "toxic already exists")
        held[body["name"]] = body
        self.calls.append(ToxiproxyCall("add_toxic", proxy, body["name"]))
        return dict(body)

    def update_toxic(self, proxy: str, name: str, attributes: dict[str, int | float],
                     toxicity: float | None = None) -> dict[str, Any]:
        body = self._toxic(proxy, name)
        body["attributes"] = {**body["attributes"], **attributes}
        if toxicity is not None:
            body["toxicity"] = toxicity
        self.calls.append(ToxiproxyCall("update_toxic", proxy, name))
        return dict(body)

    def remove_toxic(self, proxy: str, name: str) -> None:
        self._toxic(proxy, name)
        del self._proxy(proxy).toxics[name]
        self.calls.append(ToxiproxyCall("remove_toxic", proxy, name))

    def _toxic(self, proxy: str, name: str) -> dict[str, Any]:
        body = self._proxy(proxy).toxics.get(name)
        if body is None:
            raise ToxiproxyError(404, "toxic not found")
        return body

    def metrics(self) -> str:
        return ""  # no bytes pass through a fake hop


class FakeLab:
    """A LabTarget without processes (module docstring). Replicas and the
    services' settings come from `options`, as for the local lab."""

    def __init__(self, options: LabOptions | None = None, *,
                 capabilities: Iterable[Capability] | None = None,
                 ports: Ports | None = None, edge_proxy: str = "nginx") -> None:
        self.options = options or LabOptions(run_dir=FAKE_RUN_DIR)
        self.ports = ports or Ports.load().model_copy(update={"host": FAKE_HOST})
        self.edge_proxy = edge_proxy
        # The real address rules, used only for their arithmetic: a ServedLab
        # dials only in its probes and handles, which this class never calls.
        self._addresses = ServedLab(self.ports, self.options.replicas)
        several = len(self.engine_names) > 1 or len(self.gateway_names) > 1
        self.capabilities: frozenset[Capability] = frozenset(
            capabilities if capabilities is not None
            else DEFAULT_CAPABILITIES | ({Capability.REPLICAS} if several else set()))
        self.fake_toxiproxy = FakeToxiproxy(self._addresses.proxy_specs())
        # What the engine's GetStats answers: counters and per-request records.
        self.engine = pb.GetStatsResponse(backend="fake")
        # Service name → pid or log file, returned when the capability is on.
        self.fake_pids: dict[str, int] = {}
        self.fake_logs: dict[str, Path] = {}
        self.service_calls: list[tuple[str, str]] = []  # ("stop" | "kill" | "start", name)
        self.stopped: set[str] = set()

    @property
    def run_dir(self) -> Path:
        return self.options.run_dir

    # ---- addresses: the real rules, never dialled ---------------------------------
    @property
    def edge_url(self) -> str:
        return self._addresses.edge_url

    @property
    def edge_h2_url(self) -> str:
        return self._addresses.edge_h2_url

    @property
    def tls(self) -> LabTls:
        return LabTls(self.run_dir / "tls")  # never written: there is no TLS edge

    def h2_ready(self) -> bool:
        return False  # no edge answers, over HTTP/2 or otherwise

    @property
    def nginx_url(self) -> str:
        return self._addresses.nginx_url

    @property
    def gateway_url(self) -> str:
        return self._addresses.gateway_url

    @property
    def toxiproxy_url(self) -> str:
        return self._addresses.toxiproxy_url

    @property
    def engine_target(self) -> str:
        return self._addresses.engine_target

    @property
    def engine_hop(self) -> str:
        return self._addresses.engine_hop

    @property
    def engine_names(self) -> tuple[str, ...]:
        return self._addresses.engine_names

    @property
    def gateway_names(self) -> tuple[str, ...]:
        return self._addresses.gateway_names

    def url_of(self, name: str) -> str:
        return self._addresses.url_of(name)

    def engine_metrics_url_of(self, name: str) -> str:
        return self._addresses.engine_metrics_url_of(name)

    def hops_of(self, kind: str) -> tuple[str, ...]:
        return hops_of(self.options.replicas, kind)

    def status(self) -> dict[str, dict[str, Any]]:
        """Each service as `streamlab status` shows it: a stopped one is down."""
        pids = self.pids or {}
        result: dict[str, dict[str, Any]] = {}
        for name in self._addresses.order():
            up = name not in self.stopped
            result[name] = {"url": self.url_of(name), "port": self._addresses.port_of(name),
                            "pid": pids.get(name), "running": up, "healthy": up}
        return result

    # ---- capabilities -----------------------------------------------------------
    def toxiproxy(self, timeout_s: float = 5.0) -> FakeToxiproxy:
        require(self, (Capability.TOGGLE_HOPS,), "toxics on the lab's hops")
        return self.fake_toxiproxy

    def engine_stats(self, request_id: str = "") -> pb.GetStatsResponse:
        """`self.engine`, with only the request's records when one is named."""
        require(self, (Capability.ENGINE_RECORD,), "reading the engine's records")
        stats = pb.GetStatsResponse()
        stats.CopyFrom(self.engine)
        if request_id:
            kept = [g for g in stats.generations if g.request_id == request_id]
            del stats.generations[:]
            stats.generations.extend(kept)
        return stats

    def start_service(self, name: str) -> None:
        self._service("start", name)
        self.stopped.discard(name)

    def stop_service(self, name: str, grace_s: float = 10.0) -> None:
        self._service("stop", name)
        self.stopped.add(name)

    def kill_service(self, name: str) -> None:
        self._service("kill", name)
        self.stopped.add(name)

    def _service(self, action: str, name: str) -> None:
        require(self, (Capability.RESTART_SERVICE,), f"{action} {name}")
        if name not in self._addresses.order():
            raise KeyError(f"no service {name!r} in this lab; one of: "
                           f"{', '.join(self._addresses.order())}")
        self.service_calls.append((action, name))

    @property
    def pids(self) -> Mapping[str, int] | None:
        if Capability.PIDS not in self.capabilities:
            return None
        return {name: pid for name, pid in self.fake_pids.items() if name not in self.stopped}

    @property
    def logs(self) -> Mapping[str, Path] | None:
        return dict(self.fake_logs) if Capability.LOGS in self.capabilities else None
