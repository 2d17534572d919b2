"""nginx at the lab's edge, behind the same interface as the other proxies.

The lab's own config is still streamlab/lab/nginx.py's template, rendered as it
always was. A user's nginx.conf (`--proxy-config`) is templated the way the
official nginx image does it: `${STREAMLAB_UPSTREAM}`-style names substituted
before nginx reads the file (envsubst, limited to the lab's own names, so
nginx's `$variables` stay as they are).
"""

from __future__ import annotations

import re
from pathlib import Path

from streamlab.lab import nginx
from streamlab.lab.proxies.base import EdgeProxy, ProxySetup

_LAB_NAME = re.compile(r"\$\{(STREAMLAB_[A-Z_]+)\}")


def substitute(text: str, values: dict[str, str]) -> str:
    """`${STREAMLAB_X}` → its value; a name the lab does not set is an error
    (nginx would otherwise read `${...}` as a variable and fail obscurely)."""

    def value(match: re.Match[str]) -> str:
        if match.group(1) not in values:
            raise KeyError(f"{match.group(0)} is not one of the lab's placeholders: "
                           f"{', '.join(sorted(values))}")
        return values[match.group(1)]

    return _LAB_NAME.sub(value, text)


class Nginx(EdgeProxy):
    name = "nginx"
    config_name = "nginx.conf"

    def __init__(self, options: nginx.NginxOptions | None = None, tls_dir: Path | None = None,
                 gateways: int = 1) -> None:
        self.options = options or nginx.NginxOptions()
        self.tls_dir = tls_dir
        self.gateways = gateways

    def find(self) -> str:
        return nginx.find_nginx()

    def write_config(self, setup: ProxySetup) -> Path:
        if setup.user_config is None:
            return nginx.write_config(setup.ports, setup.run_dir, self.options, self.tls_dir,
                                      gateways=self.gateways)
        setup.run_dir.mkdir(parents=True, exist_ok=True)
        path = setup.run_dir / self.config_name
        path.write_text(substitute(setup.user_config.read_text(), setup.environment()))
        return path

    def command(self, binary: str, config: Path, setup: ProxySetup) -> list[str]:
        return [binary, "-p", str(setup.run_dir), "-e", str(setup.run_dir / "error.log"),
                "-c", str(config)]

    def check_command(self, binary: str, config: Path, setup: ProxySetup) -> list[str] | None:
        # The lab's own template is tested; a user's config is checked first.
        if setup.user_config is None:
            return None
        return [binary, "-t", *self.command(binary, config, setup)[1:]]

    def reload_command(self, binary: str, config: Path, setup: ProxySetup,
                       pid: int) -> list[str]:
        return ["kill", "-HUP", str(pid)]

    def health_path(self, setup: ProxySetup) -> str:
        # The lab's config answers its own health check without the gateway.
        return "/readyz" if setup.user_config else "/nginx-health"
