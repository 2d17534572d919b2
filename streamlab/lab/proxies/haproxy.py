"""HAProxy at the lab's edge (proxies/haproxy/haproxy.cfg.template, docs/proxies.md)."""

from __future__ import annotations

from pathlib import Path

from streamlab.lab.proxies.base import EdgeProxy, ProxySetup


class HAProxy(EdgeProxy):
    name = "haproxy"
    config_name = "haproxy.cfg"

    def command(self, binary: str, config: Path, setup: ProxySetup) -> list[str]:
        # -W: master-worker, so a reload (SIGUSR2 to the master) keeps the pid
        # the lab supervises while a new worker takes the listeners; -db: stay
        # in the foreground.
        return [binary, "-W", "-db", "-f", str(config), "-p", str(setup.run_dir / "haproxy.pid")]

    def check_command(self, binary: str, config: Path, setup: ProxySetup) -> list[str]:
        return [binary, "-c", "-f", str(config)]

    def reload_command(self, binary: str, config: Path, setup: ProxySetup,
                       pid: int) -> list[str]:
        return ["kill", "-USR2", str(pid)]
