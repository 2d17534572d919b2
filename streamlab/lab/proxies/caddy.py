"""Caddy at the lab's edge (proxies/caddy/Caddyfile.template, docs/proxies.md)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from streamlab.lab.proxies.access_log import AccessLine, first, number, shaped, trace_of
from streamlab.lab.proxies.base import (
    EdgeProxy,
    IdleDirective,
    ProxySetup,
    fix,
    insert_health_answer,
    no_fix,
)

# The admin API's address in the lab's Caddyfile: a socket in the run dir.
ADMIN_SOCKET = "unix/{$STREAMLAB_RUN_DIR}/admin.sock"
# The compose health answer, and the line of the template it goes before (the
# catch-all `handle`, which would otherwise take the path to the gateway).
_CATCH_ALL = "\thandle {\n"
_HEALTH = (
    "\t# The compose health check (compose.caddy.yaml), answered by Caddy itself.\n"
    "\thandle /caddy-health {\n"
    '\t\trespond "ok" 200\n'
    "\t}\n\n")


class Caddy(EdgeProxy):
    name = "caddy"
    config_name = "Caddyfile"
    version_args = ("version",)
    install_hint = "sudo apt-get install -y caddy"
    # Caddy's durations are Go's: a bare number is nanoseconds.
    idle_directives = tuple(
        IdleDirective(directive, "ns", re.compile(rf"^\s*({directive})\s+(\S+)", re.M))
        for directive in ("read_timeout", "write_timeout"))

    probe_fixes = MappingProxyType({
        "buffering": no_fix("none needed: an event stream is flushed at every write"),
        "compression": fix("encode: leave text/event-stream out of its match"),
        "idle-cut": fix("transport http { read_timeout }, and heartbeats"),
        "websocket": no_fix("none needed: reverse_proxy upgrades"),
        "slow-reader": no_fix("none per write: servers { write_timeout } is a whole-answer "
                              "deadline"),
        "client-leaves": fix("no flush_interval -1 (with it, Caddy notices at its next write)"),
        "client-address": no_fix("none needed: reverse_proxy sets X-Forwarded-For"),
        "headers-held": no_fix("none needed"),
        "reload": no_fix("none needed: its reload kept every stream, even at grace_period 1s"),
        "ceiling": no_fix("none: no connection limit by default"),
    })
    reload_bound = (re.compile(r"^\s*grace_period\s+\S+[^\n]*$", re.M),
                    lambda seconds: f"\tgrace_period {seconds}s")

    compose_health_path = "/caddy-health"
    compose_config_name = "compose.Caddyfile"
    # Debian's package, as the local lab's.
    compose_build_args = MappingProxyType(
        {"CADDY_BASE_IMAGE": "${CADDY_BASE_IMAGE:-debian:12.12-slim}"})

    @classmethod
    def access_line(cls, doc: Mapping[str, Any]) -> AccessLine | None:
        if not str(doc.get("logger", "")).startswith("http.log.access"):
            return None
        request = doc.get("request") or {}
        headers = request.get("headers") or {}
        response_headers = doc.get("resp_headers") or {}
        end = number(doc.get("ts"))
        total = number(doc.get("duration")) or 0.0
        return shaped("caddy",
                      request_id=first(headers.get("X-Request-Id"))
                      or first(response_headers.get("X-Request-Id")),
                      trace_id=trace_of(first(headers.get("Traceparent")))
                      or trace_of(first(response_headers.get("Traceresponse"))),
                      status=doc.get("status"), bytes_sent=doc.get("size"), total_s=total,
                      end=end)

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

    def with_compose_health(self, text: str) -> str:
        return insert_health_answer(self.name, text, _CATCH_ALL, _HEALTH, before=True)
