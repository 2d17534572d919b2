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
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from streamlab import nginx, processes, tls
from streamlab.console.settings import ConsoleSettings
from streamlab.endpoints import ORDER, Endpoints, http_ok
from streamlab.processes import Running, ServiceSpec, StartError
from streamlab.topology import REPO_ROOT, Ports, console_url

# The lab console (streamlab/console) starts last, once the chain serves: it is
# a client of the lab, not a hop of it, so no probe of the chain waits for it.
CONSOLE = "console"
STARTED = (*ORDER, CONSOLE)


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
    # Start the console beside the lab (`streamlab up --no-console` leaves it out).
    console: bool = True


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


def service_env(prefix: str, overrides: dict[str, str]) -> dict[str, str]:
    """The settings a service started now gets, for state.json: the ones it
    inherits from this process's environment, then the lab's own overrides;
    never a key or secret (state.json is a plain file in the run dir)."""
    merged = {**{k: v for k, v in os.environ.items() if k.startswith(prefix)}, **overrides}
    return {k: v for k, v in merged.items() if "KEY" not in k and "SECRET" not in k}


class Lab(Endpoints):
    """The local-process lab (a LabTarget, see target.py): this tool starts and
    stops its services, so it knows their pids and log files."""

    def __init__(self, ports: Ports, options: LabOptions | None = None) -> None:
        super().__init__(ports)
        self.options = options or LabOptions()
        self.run_dir = self.options.run_dir
        self.running: dict[str, Running] = {}

    @property
    def pids(self) -> Mapping[str, int]:
        return {name: running.pid for name, running in self.running.items()}

    @property
    def logs(self) -> Mapping[str, Path]:
        logs = {name: running.log for name, running in self.running.items()}
        # nginx's own error log (its stdout log holds nothing).
        logs["nginx"] = self.run_dir / "nginx" / "error.log"
        return logs

    # ---- services ------------------------------------------------------------
    def specs(self) -> dict[str, ServiceSpec]:
        p, host = self.ports, self.ports.host
        probes = self.probes()
        nginx_dir = self.run_dir / "nginx"
        return {
            "engine": ServiceSpec(
                "engine", [self.options.python, "-m", "services.engine"],
                env={"STREAMLAB_ENGINE_HOST": host, "STREAMLAB_ENGINE_PORT": str(p.engine_port),
                     **self.options.engine_env},
                ready=probes["engine"], ready_timeout_s=self.options.engine_ready_timeout_s,
                cwd=REPO_ROOT,
            ),
            "toxiproxy": ServiceSpec(
                "toxiproxy",
                [find_toxiproxy(), "-host", host, "-port", str(p.toxiproxy_api_port),
                 "-config", str(self.run_dir / "toxiproxy.json"), "-proxy-metrics"],
                ready=probes["toxiproxy"],
            ),
            "gateway": ServiceSpec(
                "gateway", [self.options.python, "-m", "services.gateway"],
                env={"STREAMLAB_GATEWAY_HOST": host,
                     "STREAMLAB_GATEWAY_PORT": str(p.gateway_port),
                     "STREAMLAB_GATEWAY_ENGINE_TARGET": self.engine_hop,
                     # A lab: the scenarios' broken modes (off in the gateway itself).
                     "STREAMLAB_GATEWAY_ALLOW_BROKEN_MODES": "true",
                     **self.options.gateway_env},
                ready=probes["gateway"], cwd=REPO_ROOT,
            ),
            "nginx": ServiceSpec(
                "nginx",
                [nginx.find_nginx(), "-p", str(nginx_dir), "-e", str(nginx_dir / "error.log"),
                 "-c", str(nginx_dir / "nginx.conf")],
                ready=probes["nginx"],
            ),
            CONSOLE: ServiceSpec(
                CONSOLE, [self.options.python, "-m", "streamlab", "console"],
                env=ConsoleSettings.for_ports(self.ports).environment(),
                ready=lambda: http_ok(f"{console_url(self.ports)}/healthz"), cwd=REPO_ROOT,
            ),
        }

    @property
    def tls_dir(self) -> Path:
        return self.run_dir / "tls"

    def write_configs(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "toxiproxy.json").write_text(
            json.dumps([s.as_json() for s in self.proxy_specs()], indent=2))
        # The lab CA: made on the first `up`, kept after (docs/http2.md says how
        # to trust it); the server certificate covers this lab's host.
        names = tuple(dict.fromkeys((*tls.LOCAL_NAMES, self.ports.host)))
        tls.write_nginx_snippet(tls.ensure(self.tls_dir, names),
                                f"{self.ports.host}:{self.ports.nginx_h2_port}")
        nginx.write_config(self.ports, self.run_dir / "nginx", self.options.nginx, self.tls_dir)

    # ---- lifecycle -----------------------------------------------------------
    def up(self) -> None:
        """Start every service in order; on any failure stop what was started."""
        self.check_ports_free()
        self.write_configs()
        specs = self.specs()
        try:
            for name in ORDER:
                self._start(specs[name])
            self._wait_for_chain()
            if self.options.console:
                self._start(specs[CONSOLE])
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
        self._wait_for_chain()

    def _wait_for_chain(self) -> None:
        processes.wait_until(self.chain_ready, 15.0, "the chain (edge /readyz)",
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
        for name in reversed(STARTED):
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
        specs = {name: ServiceSpec(name, []) for name in STARTED}
        for name, entry in state["services"].items():
            lab.running[name] = Running(specs[name], int(entry["pid"]), Path(entry["log"]))
        return lab

    def status(self) -> dict[str, dict[str, Any]]:
        """The services, and the console's row when this lab started one."""
        result = super().status()
        console = self.running.get(CONSOLE)
        if console is not None:
            url = console_url(self.ports)
            try:
                healthy = http_ok(f"{url}/healthz")
            except httpx.HTTPError:
                healthy = False
            result[CONSOLE] = {"url": f"{url}/", "port": self.ports.console_port,
                               "pid": console.pid, "running": processes.alive(console),
                               "healthy": healthy}
        return result

    def _running(self, name: str, healthy: bool) -> bool:
        running = self.running.get(name)
        return bool(running and processes.alive(running))
