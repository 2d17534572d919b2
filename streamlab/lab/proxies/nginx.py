"""nginx at the lab's edge, behind the same interface as the other proxies.

The lab's own config is still streamlab/lab/nginx.py's template, rendered as it
always was. A user's nginx.conf (`--proxy-config`) is templated the way the
official nginx image does it: `${STREAMLAB_UPSTREAM}`-style names substituted
before nginx reads the file (envsubst, limited to the lab's own names, so
nginx's `$variables` stay as they are).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from streamlab.lab import nginx
from streamlab.lab.proxies.access_log import AccessLine, number, shaped
from streamlab.lab.proxies.base import EdgeProxy, IdleDirective, ProxySetup, fix

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
    version_args = ("-v",)
    install_hint = "sudo apt-get install -y nginx"
    idle_directives = tuple(
        IdleDirective(directive, "s", re.compile(rf"^\s*({directive})\s+(\S+?)\s*;", re.M))
        for directive in ("proxy_read_timeout", "send_timeout", "proxy_send_timeout"))

    probe_fixes = MappingProxyType({
        "buffering": fix("proxy_buffering off; (or the app's X-Accel-Buffering: no, unless "
                         "ignored)"),
        "compression": fix("proxy_buffering off; or gzip_types without text/event-stream"),
        "idle-cut": fix("proxy_read_timeout above the longest pause, and heartbeats"),
        "websocket": fix("proxy_http_version 1.1; proxy_set_header Upgrade/Connection"),
        "slow-reader": fix("send_timeout (and proxy_buffering off; so the engine is held back)"),
        "client-leaves": fix("proxy_buffering off; (buffered, nginx ran the prefill to its end)"),
        "client-address": fix("proxy_set_header X-Forwarded-For $remote_addr;"),
        "headers-held": fix("proxy_buffering off; (headers go out with the first body write "
                            "otherwise)"),
        "reload": fix("worker_shutdown_timeout longer than a stream"),
        "ceiling": fix("worker_connections (each stream holds two) and worker_rlimit_nofile"),
    })
    reload_bound = (re.compile(r"^\s*worker_shutdown_timeout\s+\S+;[^\n]*$", re.M),
                    lambda seconds: f"worker_shutdown_timeout {seconds}s;")
    ceiling_pattern = re.compile(r"worker_connections\s+\d+;")

    # compose.yaml's own `nginx` service (hand-written, not generated: the
    # other proxies' compose.<name>.yaml replace it); a unit test keeps these
    # equal to its build args. Its config there is proxies/nginx/compose.conf,
    # rendered by compose_config.nginx_config, health answer included.
    compose_health_path = "/nginx-health"
    compose_config_name = "compose.conf"
    compose_build_args = MappingProxyType(
        {"NGINX_IMAGE": "${NGINX_IMAGE:-nginx:1.27.5}"})

    def __init__(self, options: nginx.NginxOptions | None = None, tls_dir: Path | None = None,
                 gateways: int = 1) -> None:
        self.options = options or nginx.NginxOptions()
        self.tls_dir = tls_dir
        self.gateways = gateways

    @classmethod
    def access_line(cls, doc: Mapping[str, Any]) -> AccessLine | None:
        if doc.get("proxy") != "nginx":
            return None
        end = number(doc.get("msec"))
        total = number(doc.get("request_time")) or 0.0
        return shaped("nginx", request_id=doc.get("request_id"),
                      trace_id=doc.get("trace_id") or "", status=doc.get("status"),
                      bytes_sent=doc.get("bytes_sent"), total_s=total, end=end,
                      upstream_header_s=number(doc.get("upstream_header_time")),
                      upstream_response_s=number(doc.get("upstream_response_time")))

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
