"""ConsoleSettings: the one typed settings object of `streamlab console`.

It lives with the lab, not the console: the local lab starts the console with
them (local.py), and a lab imports nothing of its clients (the import
contracts in pyproject.toml)."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from streamlab.lab.endpoints import ServedLab
from streamlab.lab.topology import Ports, edge_url


class ConsoleSettings(BaseSettings):
    """Where the console listens and what it talks to (env prefix STREAMLAB_CONSOLE_).

    The addresses are of two kinds: `edge_url` is the edge as the *browser*
    sees it (the page streams from there); the others are what the console's
    own server dials. In the local lab all are 127.0.0.1; in compose the
    server dials service names while the browser uses the published edge."""

    model_config = SettingsConfigDict(env_prefix="STREAMLAB_CONSOLE_", extra="ignore",
                                      frozen=True)

    host: str
    port: int
    edge_url: str
    toxiproxy_url: str
    # Hops served by another Toxiproxy process than toxiproxy_url's: hop → API URL
    # (the lab runs two; streamlab/lab/topology.py). As an env var, a JSON object.
    toxiproxy_routes: dict[str, str] = {}
    engine_target: str  # host:port of the engine itself (GetStats), past every proxy
    gateway_url: str  # the gateway itself, for its /metrics
    # How often the page asks for the engine's and the gateway's counters.
    panel_interval_ms: int = 500
    # More `host:port` values a browser may reach the console by (its Host
    # header), besides 127.0.0.1, localhost and [::1] on `port` and `host`
    # itself (streamlab/console/guard.py). As an env var, a JSON list.
    allowed_hosts: list[str] = []
    # The local lab's run dir (its state.json says whether it is up with
    # --tracing; `/api/trace/{id}` reads its logs and Jaeger, as `streamlab
    # trace` does). Empty: no local lab to read (the compose lab).
    run_dir: str = ""

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The environment wins over the defaults `for_ports` derives from lab.env:
        # compose gives the console service names that way.
        return env_settings, init_settings

    @classmethod
    def for_ports(cls, ports: Ports, run_dir: Path | None = None) -> ConsoleSettings:
        """The lab's addresses from its ports (and its run dir, a local lab's),
        each overridable by STREAMLAB_CONSOLE_*."""
        lab = ServedLab(ports)
        return cls(host=ports.host, port=ports.console_port, edge_url=edge_url(ports),
                   toxiproxy_url=lab.toxiproxy_url, toxiproxy_routes=lab.toxiproxy_routes(),
                   engine_target=lab.engine_target,
                   gateway_url=lab.gateway_url, run_dir=str(run_dir or ""))

    def environment(self) -> dict[str, str]:
        """These settings as the environment of a console process (lab.py starts one)."""
        return {f"STREAMLAB_CONSOLE_{name.upper()}":
                json.dumps(value) if isinstance(value, dict | list) else str(value)
                for name, value in self.model_dump().items()}
