"""HAProxy at the lab's edge (proxies/haproxy/haproxy.cfg.template, docs/proxies.md)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from streamlab.lab.proxies.access_log import AccessLine, captured, number, shaped, trace_of
from streamlab.lab.proxies.base import (
    EdgeProxy,
    IdleDirective,
    ProxySetup,
    fix,
    insert_health_answer,
    no_fix,
)

# The compose health answer, and the line of the template it goes after.
_BIND = '  bind "${STREAMLAB_LISTEN}"\n'
_HEALTH = (
    "  # The compose health check (compose.haproxy.yaml), answered by HAProxy\n"
    "  # itself and left out of the log (one every 2 s).\n"
    "  http-request set-log-level silent if { path /haproxy-health }\n"
    '  http-request return status 200 content-type text/plain string "ok" '
    "if { path /haproxy-health }\n")


class HAProxy(EdgeProxy):
    name = "haproxy"
    config_name = "haproxy.cfg"
    version_args = ("-v",)
    install_hint = "sudo apt-get install -y haproxy"
    # A bare number is milliseconds in HAProxy's timeouts.
    idle_directives = tuple(
        IdleDirective(f"timeout {side}", "ms",
                      re.compile(rf"^\s*(timeout\s+{side})\s+\"?([^\s\"]+)\"?", re.M))
        for side in ("server", "client", "tunnel"))

    probe_fixes = MappingProxyType({
        "buffering": no_fix("none needed: HAProxy never buffers a response body"),
        "compression": fix("compression type without text/event-stream"),
        "idle-cut": fix("timeout server (and timeout client, timeout tunnel), and heartbeats"),
        "websocket": no_fix("none needed in mode http (timeout tunnel bounds it)"),
        "slow-reader": fix("timeout client (it never buffers a body)"),
        "client-leaves": fix("option abortonclose (else the gateway hears at HAProxy's next "
                             "write)"),
        "client-address": fix("option forwardfor"),
        "headers-held": no_fix("none needed"),
        "reload": fix("hard-stop-after longer than a stream (reload: -W, kill -USR2)"),
        "ceiling": fix("maxconn (global and per frontend)"),
    })
    reload_bound = (re.compile(r"^\s*hard-stop-after\s+\S+[^\n]*$", re.M),
                    lambda seconds: f"  hard-stop-after {seconds}s")
    ceiling_pattern = re.compile(r"^\s*maxconn\s+\d+[^\n]*$", re.M)

    compose_health_path = "/haproxy-health"
    compose_config_name = "compose.cfg"
    # Debian's package, as the local lab's.
    compose_build_args = MappingProxyType(
        {"HAPROXY_BASE_IMAGE": "${HAPROXY_BASE_IMAGE:-debian:12.12-slim}"})

    @classmethod
    def access_line(cls, doc: Mapping[str, Any]) -> AccessLine | None:
        if doc.get("proxy") != "haproxy":
            return None
        start = number(doc.get("accept_unix_ms"))
        start = start / 1000 if start else None
        total = (number(doc.get("total_ms")) or 0.0) / 1000
        header = number(doc.get("upstream_header_ms"))
        return shaped("haproxy",
                      request_id=captured(doc.get("request_id"))
                      or captured(doc.get("upstream_request_id")),
                      trace_id=trace_of(captured(doc.get("traceparent")))
                      or trace_of(captured(doc.get("traceresponse"))),
                      status=doc.get("status"), bytes_sent=doc.get("bytes"), total_s=total,
                      start=start, upstream_header_s=header / 1000
                      if header is not None and header >= 0 else None)

    @classmethod
    def access_log(cls, lab_run_dir: Path, setup: ProxySetup) -> Path:
        # HAProxy logs to its stdout (no file target without syslog): the
        # lab's log of the process, which stands in nginx's slot.
        return lab_run_dir / "logs" / "nginx.log"

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

    def with_compose_health(self, text: str) -> str:
        return insert_health_answer(self.name, text, _BIND, _HEALTH, before=False)
