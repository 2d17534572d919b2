"""Caddy at the lab's edge (proxies/caddy/Caddyfile.template, docs/proxies.md)."""

from __future__ import annotations

from pathlib import Path

from streamlab.lab.proxies.base import EdgeProxy, ProxySetup

# The admin API's address in the lab's Caddyfile: a socket in the run dir.
ADMIN_SOCKET = "unix/{$STREAMLAB_RUN_DIR}/admin.sock"


class Caddy(EdgeProxy):
    name = "caddy"
    config_name = "Caddyfile"

    def environment(self, setup: ProxySetup) -> dict[str, str]:
        # Caddy keeps its data (certificates, the autosaved config) under
        # XDG_DATA_HOME and XDG_CONFIG_HOME, else under HOME: the run dir, so a
        # lab writes nothing outside it.
        home = str(setup.run_dir)
        return {**super().environment(setup), "XDG_DATA_HOME": home, "XDG_CONFIG_HOME": home}

    def command(self, binary: str, config: Path, setup: ProxySetup) -> list[str]:
        return [binary, "run", "--config", str(config), "--adapter", "caddyfile"]

    def check_command(self, binary: str, config: Path, setup: ProxySetup) -> list[str]:
        return [binary, "validate", "--config", str(config), "--adapter", "caddyfile"]

    def reload_command(self, binary: str, config: Path, setup: ProxySetup,
                       pid: int) -> list[str]:
        # Through the admin socket the lab's Caddyfile sets, and a user's that
        # sets the same (docs/proxies.md); any other reaches Caddy's default
        # admin address (localhost:2019), and one with `admin off` cannot reload.
        command = [binary, "reload", "--config", str(config), "--adapter", "caddyfile"]
        if ADMIN_SOCKET in config.read_text():
            command += ["--address", f"unix/{setup.run_dir}/admin.sock"]
        return command
