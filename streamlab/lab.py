"""The lab as local processes: engine, Toxiproxy, gateway and nginx.

    client ─▶ edge ─▶ nginx ─▶ upstream ─▶ gateway ─gRPC─▶ engine-proxy ─▶ engine

`Lab.up()` starts them in dependency order, waits for each to answer within a
deadline, checks the whole chain end to end through the edge, and stops what
it started if any step fails. Pids and ports go to `<run_dir>/state.json`, so
`streamlab down` and `streamlab status` work from another process.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from streamlab import nginx, processes
from streamlab.processes import Running, ServiceSpec, StartError
from streamlab.topology import REPO_ROOT, Ports, edge_url, hops
from streamlab.toxiproxy import ProxySpec, Toxiproxy
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.engine.v1 import engine_pb2_grpc as pb_grpc

ORDER = ("engine", "toxiproxy", "gateway", "nginx")
PROBE_TIMEOUT_S = 1.0


@dataclass
class LabOptions:
    run_dir: Path = REPO_ROOT / ".run"
    nginx: nginx.NginxOptions = field(default_factory=nginx.NginxOptions)
    # Extra settings for the services (their own env prefixes).
    gateway_env: dict[str, str] = field(default_factory=dict)
    engine_env: dict[str, str] = field(default_factory=dict)
    # How long the engine may take to answer its health check (a real model loads first).
    engine_ready_timeout_s: float = 20.0
    python: str = sys.executable


def find_toxiproxy(binary: str = "toxiproxy-server") -> str:
    local = REPO_ROOT / ".tools" / "bin" / binary
    if local.exists():
        return str(local)
    found = shutil.which(binary)
    if found is None:
        raise FileNotFoundError(
            f"{binary} is not installed. Run `make up` (builds it), or: go install "
            "github.com/Shopify/toxiproxy/v2/cmd/server@v2.12.0 and put it on PATH as "
            f"{binary}"
        )
    return found


def engine_stats(target: str, request_id: str = "") -> pb.GetStatsResponse:
    """An engine's counters (GetStats), all or one request's. A channel per call:
    a cached one would sit in gRPC's reconnect backoff after an engine restart."""
    with grpc.insecure_channel(target) as channel:
        response: pb.GetStatsResponse = pb_grpc.EngineServiceStub(channel).GetStats(
            pb.GetStatsRequest(request_id=request_id), timeout=5.0)
    return response


def service_env(prefix: str, overrides: dict[str, str]) -> dict[str, str]:
    """The settings a service started now gets, for state.json: the ones it
    inherits from this process's environment, then the lab's own overrides;
    never a key or secret (state.json is a plain file in the run dir)."""
    merged = {**{k: v for k, v in os.environ.items() if k.startswith(prefix)}, **overrides}
    return {k: v for k, v in merged.items() if "KEY" not in k and "SECRET" not in k}


class Lab:
    def __init__(self, ports: Ports, options: LabOptions | None = None) -> None:
        self.ports = ports
        self.options = options or LabOptions()
        self.run_dir = self.options.run_dir
        self.running: dict[str, Running] = {}

    # ---- addresses -----------------------------------------------------------
    @property
    def edge_url(self) -> str:
        return edge_url(self.ports)

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

    def urls(self) -> dict[str, str]:
        return {
            "edge": self.edge_url,
            "nginx": self.nginx_url,
            "gateway": self.gateway_url,
            "toxiproxy": self.toxiproxy_url,
            "engine": f"grpc://{self.engine_target}",
        }

    # ---- services ------------------------------------------------------------
    def specs(self) -> dict[str, ServiceSpec]:
        p, host = self.ports, self.ports.host
        nginx_dir = self.run_dir / "nginx"
        return {
            "engine": ServiceSpec(
                "engine", [self.options.python, "-m", "services.engine"],
                env={"STREAMLAB_ENGINE_HOST": host, "STREAMLAB_ENGINE_PORT": str(p.engine_port),
                     **self.options.engine_env},
                ready=self.engine_healthy, ready_timeout_s=self.options.engine_ready_timeout_s,
                cwd=REPO_ROOT,
            ),
            "toxiproxy": ServiceSpec(
                "toxiproxy",
                [find_toxiproxy(), "-host", host, "-port", str(p.toxiproxy_api_port),
                 "-config", str(self.run_dir / "toxiproxy.json"), "-proxy-metrics"],
                ready=self._toxiproxy_ready,
            ),
            "gateway": ServiceSpec(
                "gateway", [self.options.python, "-m", "services.gateway"],
                env={"STREAMLAB_GATEWAY_HOST": host,
                     "STREAMLAB_GATEWAY_PORT": str(p.gateway_port),
                     "STREAMLAB_GATEWAY_ENGINE_TARGET": f"{host}:{p.engine_proxy_port}",
                     # A lab: the scenarios' broken modes (off in the gateway itself).
                     "STREAMLAB_GATEWAY_ALLOW_BROKEN_MODES": "true",
                     **self.options.gateway_env},
                ready=lambda: _http_ok(f"{self.gateway_url}/healthz"), cwd=REPO_ROOT,
            ),
            "nginx": ServiceSpec(
                "nginx",
                [nginx.find_nginx(), "-p", str(nginx_dir), "-e", str(nginx_dir / "error.log"),
                 "-c", str(nginx_dir / "nginx.conf")],
                ready=lambda: _http_ok(f"{self.nginx_url}/nginx-health"),
            ),
        }

    def proxy_specs(self) -> list[ProxySpec]:
        host = self.ports.host
        return [ProxySpec(h.name, f"{host}:{h.listen_port}", f"{host}:{h.upstream_port}")
                for h in hops(self.ports)]

    def write_configs(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "toxiproxy.json").write_text(
            json.dumps([s.as_json() for s in self.proxy_specs()], indent=2))
        nginx.write_config(self.ports, self.run_dir / "nginx", self.options.nginx)

    # ---- lifecycle -----------------------------------------------------------
    def up(self) -> None:
        """Start every service in order; on any failure stop what was started."""
        self.check_ports_free()
        self.write_configs()
        specs = self.specs()
        try:
            for name in ORDER:
                self._start(specs[name])
            # The whole chain, through every hop: edge → nginx → gateway → engine.
            processes.wait_until(lambda: _http_ok(f"{self.edge_url}/readyz"), 15.0,
                                 "the chain (edge /readyz)",
                                 log_hint=lambda: f"see logs in {self.run_dir / 'logs'}")
        except BaseException:
            self.down()
            raise
        self.save_state()

    def _start(self, spec: ServiceSpec) -> None:
        running = processes.start(spec, self.run_dir / "logs")
        self.running[spec.name] = running
        processes.wait_ready(running)

    def start_service(self, name: str) -> None:
        """(Re)start one service and wait until the whole chain serves again:
        its own probe is not enough (nginx may still hold keep-alive
        connections to a gateway that is gone; the probe through the edge
        flushes them)."""
        self._start(self.specs()[name])
        self.save_state()
        processes.wait_until(lambda: _http_ok(f"{self.edge_url}/readyz"), 15.0,
                             "the chain (edge /readyz)",
                             log_hint=lambda: f"see logs in {self.run_dir / 'logs'}")

    def stop_service(self, name: str, grace_s: float = 10.0) -> None:
        running = self.running.pop(name, None)
        if running is not None:
            processes.stop(running, grace_s)
        self.save_state()

    def kill_service(self, name: str) -> None:
        """SIGKILL, no grace: a crash, for fault tests."""
        self.stop_service(name, grace_s=0.0)

    def down(self, grace_s: float = 10.0) -> None:
        for name in reversed(ORDER):
            running = self.running.pop(name, None)
            if running is not None:
                processes.stop(running, grace_s)
        (self.run_dir / "state.json").unlink(missing_ok=True)

    def check_ports_free(self) -> None:
        import socket

        for name, port in self.ports.model_dump().items():
            if not name.endswith("_port"):
                continue
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind((self.ports.host, port))
                except OSError as exc:
                    env = f"STREAMLAB_{name.upper()}"
                    raise StartError(
                        f"port {port} ({name}) is in use: is a lab already up? Run "
                        f"`streamlab down`, or choose another port with {env}=..."
                    ) from exc

    # ---- state shared with other processes ------------------------------------
    def save_state(self) -> None:
        state = {
            "ports": self.ports.model_dump(),
            "services": {n: {"pid": r.pid, "log": str(r.log)} for n, r in self.running.items()},
            # Scenarios attached from another process read the idle timeouts and
            # the services' settings (keepalives, ...) here.
            "nginx": asdict(self.options.nginx),
            "gateway_env": service_env("STREAMLAB_GATEWAY_", self.options.gateway_env),
            "engine_env": service_env("STREAMLAB_ENGINE_", self.options.engine_env),
        }
        (self.run_dir / "state.json").write_text(json.dumps(state, indent=2))

    @classmethod
    def attach(cls, run_dir: Path) -> Lab:
        """The lab that `streamlab up` left running in run_dir."""
        state = json.loads((run_dir / "state.json").read_text())
        nginx_options = nginx.NginxOptions(**state.get("nginx", {}))
        lab = cls(Ports(**state["ports"]), LabOptions(
            run_dir=run_dir, nginx=nginx_options, gateway_env=state.get("gateway_env", {}),
            engine_env=state.get("engine_env", {})))
        specs = {name: ServiceSpec(name, []) for name in ORDER}
        for name, entry in state["services"].items():
            lab.running[name] = Running(specs[name], int(entry["pid"]), Path(entry["log"]))
        return lab

    def status(self) -> dict[str, dict[str, Any]]:
        probes: dict[str, Callable[[], bool]] = {
            "engine": self.engine_healthy,
            "toxiproxy": self._toxiproxy_ready,
            "gateway": lambda: _http_ok(f"{self.gateway_url}/healthz"),
            "nginx": lambda: _http_ok(f"{self.nginx_url}/nginx-health"),
        }
        ports = {"engine": self.ports.engine_port, "toxiproxy": self.ports.toxiproxy_api_port,
                 "gateway": self.ports.gateway_port, "nginx": self.ports.nginx_port}
        urls = self.urls()
        result: dict[str, dict[str, Any]] = {}
        for name in ORDER:
            running = self.running.get(name)
            try:
                healthy = bool(probes[name]())
            except Exception:
                healthy = False
            result[name] = {"url": urls[name], "port": ports[name],
                            "pid": running.pid if running else None,
                            "running": bool(running and processes.alive(running)),
                            "healthy": healthy}
        try:
            chain = _http_ok(f"{self.edge_url}/readyz")
        except Exception:
            chain = False
        result["edge"] = {"url": self.edge_url, "port": self.ports.edge_port, "pid": None,
                          "running": chain, "healthy": chain}
        return result

    # ---- probes and handles ------------------------------------------------------
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

    def _toxiproxy_ready(self) -> bool:
        client = self.toxiproxy()
        try:
            return {s.name for s in self.proxy_specs()} <= set(client.proxies())
        finally:
            client.close()


def _http_ok(url: str) -> bool:
    return httpx.get(url, timeout=PROBE_TIMEOUT_S).status_code == 200
