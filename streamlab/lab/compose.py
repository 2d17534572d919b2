"""The lab as a running compose project, seen through its published ports.

`STREAMLAB_TARGET=compose` makes the CLI (`status`, `chat`) and the pytest
`lab` fixture attach to a topology that `docker compose up` started, instead
of starting local processes. Compose publishes the same ports on 127.0.0.1 as
the local lab uses (lab.env, or STREAMLAB_*_PORT overrides), so everything
that talks to a `Lab` through its URLs works unchanged. What differs is the
lifecycle: services are stopped and started through the compose command, and
this class never brings the project up or down (whoever ran `up` owns that).
It is a LabTarget (target.py) without the `pids` and `logs` capabilities:
its services' processes and logs live in containers.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import yaml
from dotenv import dotenv_values
from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from streamlab.errors import StreamlabError
from streamlab.lab import processes
from streamlab.lab.compose_config import HEALTH_PATHS, TLS_DIR, proxy_compose_file
from streamlab.lab.endpoints import REDIS, ServedLab, http_ok
from streamlab.lab.local import LabOptions
from streamlab.lab.proxies import proxy_class
from streamlab.lab.target import Capability
from streamlab.lab.topology import REPO_ROOT, Ports, Replicas, split_replica
from streamlab.paths import run_dir

Target = Literal["local", "compose"]
COMPOSE_CALL_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 60.0


class TargetSettings(BaseSettings):
    """Which lab the CLI and the tests talk to."""

    model_config = SettingsConfigDict(env_prefix="STREAMLAB_", extra="ignore")

    target: Target = "local"


class ComposeSettings(BaseSettings):
    """How to reach the compose project (env prefix STREAMLAB_COMPOSE_)."""

    model_config = SettingsConfigDict(env_prefix="STREAMLAB_COMPOSE_", extra="ignore")

    # The compose program, split like a shell would: "docker compose" (v2),
    # "docker-compose" (v1) or "podman-compose".
    command: str = "docker compose"
    # Project name (-p); empty means compose's own default (the directory name).
    project: str = ""
    file: Path = REPO_ROOT / "compose.yaml"
    # A second file layered on it: compose.replicas.yaml runs 2 gateways, 2
    # engines and Redis (docs/topology.md); CI's compose lab does.
    override: Path | None = None
    # The edge proxy: another than nginx adds its compose.<proxy>.yaml
    # (docs/proxies.md), which puts it in the `nginx` service. One of the
    # registry's (proxies.PROXIES), so a new proxy needs no change here.
    proxy: str = "nginx"

    @field_validator("proxy")
    @classmethod
    def _known_proxy(cls, value: str) -> str:
        proxy_class(value)  # ValueError naming the known ones
        return value

    def argv(self, *args: str) -> list[str]:
        project = ["-p", self.project] if self.project else []
        override = ["-f", str(self.override)] if self.override else []
        if self.proxy != "nginx":
            override += ["-f", str(proxy_compose_file(self.proxy))]
        return [*shlex.split(self.command), "-f", str(self.file), *override, *project, *args]


def selected_target() -> Target:
    return TargetSettings().target


class ComposeError(StreamlabError, RuntimeError):
    pass


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=value lines, as compose's `env_file` reads them; a missing file reads
    as empty."""
    if not path.exists():
        return {}
    return {key: value for key, value in dotenv_values(path).items() if value is not None}


def service_env_file(service: str) -> Path:
    """The env file compose.yaml gives a service: STREAMLAB_<SERVICE>_ENV_FILE,
    or the service's compose.env (the same default as the compose file's)."""
    name = os.environ.get(f"STREAMLAB_{service.upper()}_ENV_FILE",
                          f"services/{service}/compose.env")
    return REPO_ROOT / name


def compose_replicas(settings: ComposeSettings) -> Replicas:
    """How many gateways and engines the project runs, and whether Redis does,
    from the service names of its compose files (`gateway`, `gateway-2`, …;
    engine-gpu and the like are other services). The published port of
    replica k follows topology.py's rule (compose.replicas.yaml's defaults)."""
    names: set[str] = set()
    for path in (settings.file, settings.override):
        if path is not None:
            full = path if path.is_absolute() else REPO_ROOT / path
            names |= set((yaml.safe_load(full.read_text()) or {}).get("services") or {})
    counts = {"gateway": 0, "engine": 0}
    for name in names:
        base, _ = split_replica(name)  # engine-gpu is no replica: ("engine-gpu", 1)
        if base in counts:
            counts[base] += 1
    return Replicas(gateways=max(counts["gateway"], 1), engines=max(counts["engine"], 1),
                    redis=REDIS in names)


class ComposeLab(ServedLab):
    """A compose project as a LabTarget: it stops, kills and starts a service
    through the compose command; its processes and logs live in containers."""

    OWN_CAPABILITIES = ServedLab.OWN_CAPABILITIES | {Capability.RESTART_SERVICE}

    def __init__(self, ports: Ports, settings: ComposeSettings | None = None) -> None:
        settings = settings or ComposeSettings()
        super().__init__(ports, compose_replicas(settings))
        # The services' settings, read from the env files compose gives them, so
        # scenarios size their bounds (keepalives, ...) as for a local lab.
        self.options = LabOptions(
            run_dir=run_dir() / "compose",
            engine_env=read_env_file(service_env_file("engine")),
            gateway_env=read_env_file(service_env_file("gateway")))
        self.run_dir = self.options.run_dir
        self.settings = settings
        self.edge_proxy = settings.proxy

    def probes(self) -> dict[str, Callable[[], bool]]:
        probes = super().probes()
        # The edge proxy's own health answer (compose_config.HEALTH_PATHS).
        path = HEALTH_PATHS[self.edge_proxy]
        probes["nginx"] = lambda: http_ok(f"{self.nginx_url}{path}")
        return probes

    @property
    def tls_dir(self) -> Path:
        """The certificates compose.yaml mounts into nginx (`streamlab compose tls`)."""
        return Path(os.environ.get("STREAMLAB_TLS_DIR", TLS_DIR))

    @classmethod
    def from_env(cls) -> ComposeLab:
        return cls(Ports.load(), ComposeSettings())

    def compose(self, *args: str) -> str:
        argv = self.settings.argv(*args)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, check=True,
                                  timeout=COMPOSE_CALL_TIMEOUT_S, cwd=REPO_ROOT)
        except subprocess.CalledProcessError as exc:
            raise ComposeError(f"`{shlex.join(argv)}` failed ({exc.returncode}): "
                               f"{exc.stderr.strip()}") from exc
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ComposeError(f"`{shlex.join(argv)}` did not run: {exc}") from exc
        return done.stdout

    # ---- lifecycle: attach only ----------------------------------------------
    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """The whole chain answers through every published port, within a deadline."""
        for name, probe in self.probes().items():
            processes.wait_until(probe, timeout_s, f"compose service {name}",
                                 log_hint=self._log_hint)
        processes.wait_until(self.chain_ready, timeout_s, "the chain (edge /readyz)",
                             log_hint=self._log_hint)

    def stop_service(self, name: str, grace_s: float = 10.0) -> None:
        self.compose("stop", "-t", f"{grace_s:.0f}", name)

    def kill_service(self, name: str) -> None:
        """SIGKILL, no grace: a crash, for fault tests."""
        self.compose("kill", name)

    def start_service(self, name: str) -> None:
        # `start` returns once the container runs; readiness is ours to wait for.
        self.compose("start", name)
        processes.wait_until(self.probes()[name], READY_TIMEOUT_S, f"compose service {name}",
                             log_hint=self._log_hint)
        # Like the local lab: the whole chain, so nginx drops stale upstream connections.
        processes.wait_until(self.chain_ready, READY_TIMEOUT_S, "the chain (edge /readyz)",
                             log_hint=self._log_hint)

    def _log_hint(self) -> str:
        project = f" -p {self.settings.project}" if self.settings.project else ""
        return (f"is the compose project up? See `{self.settings.command}{project} ps` "
                f"and `... logs` (services: {', '.join(self.order())})")

