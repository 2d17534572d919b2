"""Ports and hops of the lab, defined once (in lab.env) and read here.

The local-process lab, the pytest fixtures and compose.yaml all take their
ports from lab.env, so a port changes in one place. Environment variables of
the same names override it (the tests do, to run on free ports).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parent.parent
LAB_ENV = REPO_ROOT / "lab.env"


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
    gateway_port: int
    engine_port: int
    # The lab console (streamlab/console): a client of the lab, not a hop of it.
    console_port: int

    @classmethod
    def load(cls) -> Ports:
        """Ports from lab.env, overridden by STREAMLAB_* environment variables."""
        return cls()


@dataclass(frozen=True)
class Hop:
    """One Toxiproxy proxy: a named listener in front of the next service."""

    name: str
    listen_port: int
    upstream_port: int
    # The compose service listening on upstream_port (compose.yaml's service names).
    upstream_service: str = ""


# The faultable hops by name, client side first (as hops() builds them).
HOP_NAMES = ("edge", "edge-h2", "upstream", "engine")


def hops(ports: Ports) -> tuple[Hop, ...]:
    """The faultable hops, client side first. Two edges into nginx: the plain
    HTTP/1.1 listener and the TLS + HTTP/2 one (a TCP proxy passes TLS through
    unchanged, so its toxics act on the encrypted bytes)."""
    return (
        Hop("edge", ports.edge_port, ports.nginx_port, "nginx"),
        Hop("edge-h2", ports.edge_h2_port, ports.nginx_h2_port, "nginx"),
        Hop("upstream", ports.upstream_port, ports.gateway_port, "gateway"),
        Hop("engine", ports.engine_proxy_port, ports.engine_port, "engine"),
    )


def edge_url(ports: Ports) -> str:
    return f"http://{ports.host}:{ports.edge_port}"


def edge_h2_url(ports: Ports) -> str:
    """The HTTP/2 edge: TLS with the lab CA's certificate (streamlab/tls.py)."""
    return f"https://{ports.host}:{ports.edge_h2_port}"


def console_url(ports: Ports) -> str:
    return f"http://{ports.host}:{ports.console_port}"
