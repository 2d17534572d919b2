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
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from services.engine.settings import EngineSettings
from services.gateway.settings import GatewaySettings
from streamlab import paths
from streamlab.lab import jaeger, nginx, processes, proxies, tls
from streamlab.lab.console_settings import ConsoleSettings
from streamlab.lab.endpoints import (
    REDIS,
    REDIS_NO_PERSISTENCE,
    REDIS_PERSISTENCE,
    ServedLab,
    http_ok,
)
from streamlab.lab.processes import Running, ServiceSpec, StartError
from streamlab.lab.target import Capability
from streamlab.lab.topology import (
    REPO_ROOT,
    TOXIPROXY_PROCESSES,
    Ports,
    Replicas,
    ToxiproxyRuntime,
    console_url,
    hops,
    replica_port,
    split_replica,
    toxiproxy_api_port,
)

# The lab console (streamlab/console) starts last, once the chain serves: it is
# a client of the lab, not a hop of it, so no probe of the chain waits for it.
CONSOLE = "console"


def find_redis() -> str:
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None)
    if found is None:
        raise FileNotFoundError(
            "redis-server is not installed. Run `make up` (installs it), or: "
            "sudo apt-get install -y redis-server")
    return found


@dataclass
class LabOptions:
    # One default for every entry point (streamlab/paths.py).
    run_dir: Path = field(default_factory=paths.run_dir)
    nginx: nginx.NginxOptions = field(default_factory=nginx.NginxOptions)
    # Extra settings for the services (their own env prefixes).
    gateway_env: dict[str, str] = field(default_factory=dict)
    engine_env: dict[str, str] = field(default_factory=dict)
    # How long the engine may take to answer its health check (a real model loads first).
    engine_ready_timeout_s: float = 20.0
    python: str = sys.executable
    # Start the console beside the lab (`streamlab up --no-console` leaves it out).
    console: bool = True
    # Replicas (`streamlab up --gateways N --engines M`) and Redis (docs/topology.md).
    gateways: int = 1
    engines: int = 1
    # The gateways' resume store: "memory" (each gateway its own) or "redis"
    # (shared, through the `store` hop). None: redis with several gateways.
    store: str | None = None
    # The proxy where nginx stands (`streamlab up --proxy`, docs/proxies.md),
    # and the user's own config for it (`--proxy-config`); None: the lab's.
    proxy: str = "nginx"
    proxy_config: Path | None = None
    # Redis's append-only file (endpoints.REDIS_PERSISTENCE); False: no
    # persistence, the broken mode the `store-restart` scenario contrasts.
    redis_aof: bool = True
    # `streamlab up --tracing`: Jaeger beside the lab, the services export their
    # spans to it and log JSON (streamlab/lab/jaeger.py, docs/tracing.md).
    tracing: bool = False

    def gateway_settings(self) -> GatewaySettings:
        """The gateways' settings as this lab gives them: its own overrides on top
        of this shell's STREAMLAB_GATEWAY_* (which services started from it
        inherit), on top of the defaults. Typed: a bound computed from it (a
        keepalive, a send timeout) cannot misread a string."""
        return GatewaySettings(**_settings_fields(self.gateway_env, "STREAMLAB_GATEWAY_"))

    def engine_settings(self) -> EngineSettings:
        """The engines' settings, as `gateway_settings` for the gateways."""
        return EngineSettings(**_settings_fields(self.engine_env, "STREAMLAB_ENGINE_"))

    @property
    def replicas(self) -> Replicas:
        store = self.store or ("redis" if self.gateways > 1 else "memory")
        if store not in ("memory", "redis"):
            raise ValueError(f"unknown resume store {store!r}; one of: memory, redis")
        return Replicas(self.gateways, self.engines, redis=store == "redis")


def _settings_fields(env: Mapping[str, str], prefix: str) -> dict[str, Any]:
    """`STREAMLAB_GATEWAY_HEARTBEAT_S=1` → `heartbeat_s="1"`: a service's env
    overrides as its settings' field names (pydantic parses the values)."""
    return {k.removeprefix(prefix).lower(): v for k, v in env.items() if k.startswith(prefix)}


def find_toxiproxy(binary: str = "toxiproxy-server") -> str:
    """The lab's Toxiproxy binary: streamlab/paths.py says where it is looked for
    (ToxiproxyNotFound, a FileNotFoundError, says how to get one)."""
    return paths.find_toxiproxy(binary)


def service_env(prefix: str, overrides: dict[str, str]) -> dict[str, str]:
    """The settings a service started now gets, for state.json: the ones it
    inherits from this process's environment, then the lab's own overrides;
    never a key or secret (state.json is a plain file in the run dir)."""
    merged = {**{k: v for k, v in os.environ.items() if k.startswith(prefix)}, **overrides}
    return {k: v for k, v in merged.items() if "KEY" not in k and "SECRET" not in k}


class Lab(ServedLab):
    """The local-process lab (a LabTarget, see target.py): this tool starts and
    stops its services, so it knows their pids and log files."""

    OWN_CAPABILITIES = ServedLab.OWN_CAPABILITIES | {
        Capability.PIDS, Capability.LOGS, Capability.RESTART_SERVICE}

    def __init__(self, ports: Ports, options: LabOptions | None = None) -> None:
        options = options or LabOptions()
        super().__init__(ports, options.replicas)
        self.options = options
        self.run_dir = self.options.run_dir
        self.running: dict[str, Running] = {}
        self.edge_proxy = options.proxy
        self.proxy = proxies.edge_proxy(options.proxy, options.nginx, self.tls_dir,
                                        options.replicas.gateways)

    @property
    def pids(self) -> Mapping[str, int]:
        self._follow_saved_pids()
        return {name: running.pid for name, running in self.running.items()}

    @property
    def logs(self) -> Mapping[str, Path]:
        logs = {name: running.log for name, running in self.running.items()}
        # nginx's own error log (its stdout log holds nothing); the other
        # proxies log to their stdout.
        if self.edge_proxy == "nginx":
            logs["nginx"] = self.run_dir / "nginx" / "error.log"
        return logs

    # ---- the edge proxy (nginx's slot: the service keeps the name "nginx") ------
    @property
    def proxy_setup(self) -> proxies.ProxySetup:
        return proxies.ProxySetup(
            self.ports, self.run_dir / self.edge_proxy,
            read_timeout_s=self.options.nginx.read_timeout_s,
            short_read_timeout_s=self.options.nginx.short_read_timeout_s,
            user_config=self.options.proxy_config)

    @property
    def proxy_config_path(self) -> Path:
        return self.proxy_setup.run_dir / self.proxy.config_name

    def probes(self) -> dict[str, Callable[[], bool]]:
        probes = super().probes()
        path = self.proxy.health_path(self.proxy_setup)
        probes["nginx"] = lambda: http_ok(f"{self.nginx_url}{path}")
        return probes

    # ---- services ------------------------------------------------------------
    def specs(self) -> dict[str, ServiceSpec]:
        p, host = self.ports, self.ports.host
        probes = self.probes()
        setup = self.proxy_setup
        specs: dict[str, ServiceSpec] = {}
        def traced(name: str) -> dict[str, str]:
            return jaeger.service_env(p, name) if self.options.tracing else {}
        if self.options.tracing:
            specs[jaeger.JAEGER] = ServiceSpec(
                jaeger.JAEGER, jaeger.command(jaeger.find_jaeger()),
                env=jaeger.environment(p), ready=lambda: jaeger.ready(p), cwd=self.run_dir)
        for name in self.engine_names:
            _, k = split_replica(name)
            specs[name] = ServiceSpec(
                name, [self.options.python, "-m", "services.engine"],
                env={"STREAMLAB_ENGINE_HOST": host,
                     "STREAMLAB_ENGINE_PORT": str(self.port_of(name)),
                     # Each engine's /metrics by the same replica rule as its port.
                     "STREAMLAB_ENGINE_METRICS_PORT": str(
                         replica_port(p, p.engine_metrics_port, k)),
                     **traced(name), **self.options.engine_env},
                ready=probes[name], ready_timeout_s=self.options.engine_ready_timeout_s,
                cwd=REPO_ROOT,
            )
        if self.replicas.redis:
            # The append-only file in the run dir: a Redis killed and started
            # again (`streamlab` restarts it on the same dir) keeps the log.
            persistence = REDIS_PERSISTENCE if self.options.redis_aof else REDIS_NO_PERSISTENCE
            specs[REDIS] = ServiceSpec(
                REDIS, [find_redis(), "--bind", host, "--port", str(p.redis_port),
                        *persistence, "--dir", str(self.run_dir)],
                ready=probes[REDIS])
        # Several gateways share the resume log in Redis, each through its own
        # store hop (`store`, `store-2`, …).
        def store_env(gateway: str) -> dict[str, str]:
            return ({"STREAMLAB_GATEWAY_RESUME_STORE": "redis",
                     "STREAMLAB_GATEWAY_REDIS_URL": self.store_url_of(gateway)}
                    if self.replicas.redis else {})
        specs.update({
            **{process: ServiceSpec(
                process,
                [find_toxiproxy(), "-host", host, "-port", str(toxiproxy_api_port(p, process)),
                 "-config", str(self.run_dir / f"{process}.json"), "-proxy-metrics"],
                env=ToxiproxyRuntime().environment(), ready=probes[process],
            ) for process in TOXIPROXY_PROCESSES},
            **{name: ServiceSpec(
                name, [self.options.python, "-m", "services.gateway"],
                env={"STREAMLAB_GATEWAY_HOST": host,
                     "STREAMLAB_GATEWAY_PORT": str(self.port_of(name)),
                     "STREAMLAB_GATEWAY_ENGINE_TARGET": self.engine_hop,
                     # A lab: the scenarios' broken modes (off in the gateway itself).
                     "STREAMLAB_GATEWAY_ALLOW_BROKEN_MODES": "true",
                     # The console's page may open /ws (its origin's port).
                     "STREAMLAB_GATEWAY_CONSOLE_PORT": str(self.ports.console_port),
                     "STREAMLAB_GATEWAY_JOB_ROUTE": nginx.job_route(
                         name, self.replicas.gateways),
                     **store_env(name), **traced(name), **self.options.gateway_env},
                ready=probes[name], cwd=REPO_ROOT,
            ) for name in self.gateway_names},
            "nginx": ServiceSpec(
                "nginx", self.proxy.command(self.proxy.find(), self.proxy_config_path, setup),
                env=self.proxy.environment(setup), ready=probes["nginx"], cwd=setup.run_dir,
            ),
            CONSOLE: ServiceSpec(
                CONSOLE, [self.options.python, "-m", "streamlab", "console"],
                env=ConsoleSettings.for_ports(self.ports, self.run_dir).environment(),
                ready=lambda: http_ok(f"{console_url(self.ports)}/healthz"), cwd=REPO_ROOT,
            ),
        })
        return specs

    @property
    def tls_dir(self) -> Path:
        return self.run_dir / "tls"

    def write_configs(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for process in TOXIPROXY_PROCESSES:
            (self.run_dir / f"{process}.json").write_text(
                json.dumps([s.as_json() for s in self.proxy_specs(process)], indent=2))
        # The lab CA: made on the first `up`, kept after (docs/http2.md says how
        # to trust it); the server certificate covers this lab's host.
        names = tuple(dict.fromkeys((*tls.LOCAL_NAMES, self.ports.host)))
        tls.write_nginx_snippet(tls.ensure(self.tls_dir, names),
                                f"{self.ports.host}:{self.ports.nginx_h2_port}")
        # The edge proxy's config; a config it refuses fails here, quoting it.
        setup = self.proxy_setup
        config = self.proxy.write_config(setup)
        self.proxy.check(self.proxy.find(), config, setup)

    # ---- lifecycle -----------------------------------------------------------
    def up(self) -> None:
        """Start every service in order; on any failure stop what was started."""
        self.check_ports_free()
        self.write_configs()
        specs = self.specs()
        try:
            if self.options.tracing:  # first: the services export to it from their start
                self._start(specs[jaeger.JAEGER])
            for name in self.order():
                self._start(specs[name])
            self._wait_for_chain()
            if self.options.console:
                self._start(specs[CONSOLE])
        except BaseException:
            self.down()
            raise
        self.save_state()

    def _start(self, spec: ServiceSpec) -> None:
        log = self.run_dir / "logs" / f"{spec.name}.log"
        logged_before = log.stat().st_size if log.exists() else 0
        running = processes.start(spec, self.run_dir / "logs")
        self.running[spec.name] = running
        if spec.name != "nginx":
            processes.wait_ready(running)
            return

        # A proxy that keeps running on a config it could not use (Traefik)
        # says so only in its log: its errors end the wait, quoted.
        def refused() -> str | None:
            if not processes.alive(running):
                return (f"{self.edge_proxy} exited during start-up; last lines of "
                        f"{running.log}:\n{processes.tail(running.log)}")
            with running.log.open("rb") as out:
                out.seek(logged_before)
                errors = self.proxy.startup_errors(out.read().decode(errors="replace"))
            if errors:
                config = self.options.proxy_config or self.proxy_config_path
                return (f"{self.edge_proxy} did not take its config {config}:\n"
                        + "\n".join(errors[-5:]))
            return None

        processes.wait_until(spec.ready, spec.ready_timeout_s, self.edge_proxy, died=refused,
                             log_hint=lambda: f"last lines of {running.log}:\n"
                                              f"{processes.tail(running.log)}")

    def start_service(self, name: str) -> None:
        """(Re)start one service (or replica: `gateway-2`) and wait until the
        whole chain serves again: its own probe is not enough (nginx may still
        hold keep-alive connections to a gateway that is gone; the probe
        through the edge flushes them)."""
        specs = self.specs()
        if name not in specs:
            raise KeyError(f"no service {name!r} in this lab; one of: {', '.join(specs)}")
        self._start(specs[name])
        self.save_state()
        self._wait_for_chain()

    def reload_proxy(self) -> None:
        """The edge proxy takes its config again (its source as it is now: the
        user's edited file), in place, and the chain serves through it."""
        self.proxy.reload(self.proxy_setup, self.pids["nginx"])
        self._wait_for_chain()

    def _wait_for_chain(self) -> None:
        processes.wait_until(self.chain_ready, 15.0, "the chain (edge /readyz)",
                             log_hint=lambda: f"see logs in {self.run_dir / 'logs'}")

    def stop_service(self, name: str, grace_s: float = 10.0) -> None:
        self._follow_saved_pids()
        running = self.running.pop(name, None)
        if running is not None:
            processes.stop(running, grace_s)
        self.save_state()

    def kill_service(self, name: str) -> None:
        """SIGKILL, no grace: a crash, for fault tests."""
        self.stop_service(name, grace_s=0.0)

    def down(self, grace_s: float = 10.0) -> None:
        # This lab's order, then anything else state.json named (a lab saved
        # with other replica counts): nothing it started is left running.
        self._adopt_saved_pids()
        names = [*reversed((jaeger.JAEGER, *self.order(), CONSOLE)), *self.running]
        for name in names:
            running = self.running.pop(name, None)
            if running is not None:
                processes.stop(running, grace_s)
        (self.run_dir / "state.json").unlink(missing_ok=True)

    def check_ports_free(self) -> None:
        import socket

        listeners = {name: port for name, port in self.ports.model_dump().items()
                     if name.endswith("_port")
                     # Jaeger's only with --tracing: a lab without it leaves them be.
                     and (self.options.tracing or not name.startswith("jaeger_"))}
        # The replicas' ports (the rule in topology.py), and no two listeners on one port.
        for service in (*self.gateway_names[1:], *self.engine_names[1:]):
            listeners[f"{service} port"] = self.port_of(service)
        for hop in hops(self.ports, self.replicas):
            if split_replica(hop.name)[1] > 1:
                listeners[f"{hop.name} hop port"] = hop.listen_port
        clashes = [port for port in set(listeners.values())
                   if list(listeners.values()).count(port) > 1]
        if clashes:
            raise StartError(f"ports {sorted(clashes)} are used twice by this lab's listeners "
                             "(STREAMLAB_REPLICA_PORT_STEP too small for the replicas?)")
        for name, port in listeners.items():
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind((self.ports.host, port))
                except OSError as exc:
                    env = f"STREAMLAB_{name.upper()}" if name.endswith("_port") \
                        else "STREAMLAB_REPLICA_PORT_STEP"
                    raise StartError(
                        f"port {port} ({name}) is in use: is a lab already up? Run "
                        f"`streamlab down`, or choose another port with {env}=..."
                    ) from exc

    # ---- state shared with other processes ------------------------------------
    def save_state(self) -> None:
        state = {
            "ports": self.ports.model_dump(),
            "replicas": asdict(self.replicas),
            "services": {n: {"pid": r.pid, "log": str(r.log)} for n, r in self.running.items()},
            # Scenarios attached from another process read the idle timeouts and
            # the services' settings (keepalives, ...) here.
            "nginx": asdict(self.options.nginx),
            "proxy": self.edge_proxy,
            "proxy_config": str(self.options.proxy_config) if self.options.proxy_config else None,
            "gateway_env": service_env("STREAMLAB_GATEWAY_", self.options.gateway_env),
            "engine_env": service_env("STREAMLAB_ENGINE_", self.options.engine_env),
            "tracing": self.options.tracing,
        }
        (self.run_dir / "state.json").write_text(json.dumps(state, indent=2))

    def _follow_saved_pids(self) -> None:
        """Once this lab runs something, state.json is the truth about its pids:
        the suite's lab is restarted from other processes (`streamlab bench cancel
        --background` in a subprocess), and a test that then signalled the engine
        by the pid it started with hit a dead process while the new one served on."""
        if self.running:
            self._adopt_saved_pids()

    def _adopt_saved_pids(self) -> None:
        """Services that another process restarted (`bench scale` or `bench cancel
        --background` from the CLI, on a lab this object started) have their new
        pids in state.json only: take them, so down() stops them too. The test
        suite's lab leaked an engine and a gateway after each such run."""
        try:
            state = json.loads((self.run_dir / "state.json").read_text())
        except (OSError, ValueError):
            return
        for name, entry in state.get("services", {}).items():
            known = self.running.get(name)
            if known is not None and known.pid == int(entry["pid"]):
                continue
            if known is not None and known.popen is not None:
                known.popen.poll()  # ours, stopped by the other process: reap it
            self.running[name] = Running(ServiceSpec(name, []), int(entry["pid"]),
                                         Path(entry["log"]))

    @classmethod
    def attach(cls, run_dir: Path) -> Lab:
        """The lab that `streamlab up` left running in run_dir."""
        state = json.loads((run_dir / "state.json").read_text())
        nginx_options = nginx.NginxOptions(**state.get("nginx", {}))
        replicas = state.get("replicas", {})
        lab = cls(Ports(**state["ports"]), LabOptions(
            run_dir=run_dir, nginx=nginx_options, gateway_env=state.get("gateway_env", {}),
            engine_env=state.get("engine_env", {}), gateways=replicas.get("gateways", 1),
            engines=replicas.get("engines", 1),
            store="redis" if replicas.get("redis") else "memory",
            proxy=state.get("proxy", "nginx"), tracing=bool(state.get("tracing", False)),
            proxy_config=Path(state["proxy_config"]) if state.get("proxy_config") else None))
        for name, entry in state["services"].items():
            lab.running[name] = Running(ServiceSpec(name, []), int(entry["pid"]),
                                        Path(entry["log"]))
        return lab

    def status(self) -> dict[str, dict[str, Any]]:
        """The services, and the console's row when this lab started one."""
        self._follow_saved_pids()
        result = super().status()
        # The edge proxy's row keeps nginx's slot name; which proxy stands there:
        result["nginx"]["proxy"] = self.edge_proxy
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
