"""Starting, watching and stopping the lab's processes.

Each service runs in its own session (process group), so a Ctrl-C in the
terminal that ran `streamlab up` does not reach it and `stop()` can signal the
whole group. Stopping is SIGTERM, a grace period, then SIGKILL, and always a
reap when the process is our child.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from streamlab.errors import StreamlabError


class StartError(StreamlabError, RuntimeError):
    pass


# Open files the lab's processes want: at 5,000 streams nginx holds ~10,000
# sockets, each Toxiproxy process ~10,000 (two per stream per HTTP hop), the
# gateway ~5,000. Below this, start() says so once (the lab still starts).
OPEN_FILES_WANTED = 16_384
_open_files_warned = False


def open_files_hard_limit() -> int:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return hard if hard != resource.RLIM_INFINITY else 1 << 20


def raise_open_files() -> str | None:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit, so every process
    the lab starts inherits it (and the load generator in this process has it too).
    The hard limit stays: raising it needs CAP_SYS_RESOURCE, which even root lacks
    on some machines. Returns what could not be raised, or None."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            return f"open files: soft limit stays at {soft} (hard {hard}): {exc}"
    limit = open_files_hard_limit()
    if limit < OPEN_FILES_WANTED:
        return (f"open files: the hard limit is {limit}, below the {OPEN_FILES_WANTED} that "
                "5,000 streams need per process (raise it with `ulimit -Hn` as root, or in "
                "/etc/security/limits.conf); the lab starts, with fewer streams at once")
    return None


@dataclass
class ServiceSpec:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    # Returns True once the service answers; may raise while it is starting.
    ready: Callable[[], bool] = lambda: True
    ready_timeout_s: float = 20.0
    cwd: Path | None = None


@dataclass
class Running:
    spec: ServiceSpec
    pid: int
    log: Path
    popen: subprocess.Popen[bytes] | None = None  # set when we are the parent


def start(spec: ServiceSpec, log_dir: Path) -> Running:
    global _open_files_warned
    shortfall = raise_open_files()
    if shortfall and not _open_files_warned:
        print(f"streamlab: {shortfall}", file=sys.stderr)
        _open_files_warned = True
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{spec.name}.log"
    with log.open("ab") as out:
        popen = subprocess.Popen(
            spec.argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **spec.env, "PYTHONUNBUFFERED": "1"},
            cwd=spec.cwd,
            start_new_session=True,
        )
    return Running(spec, popen.pid, log, popen)


@contextlib.contextmanager
def serving(spec: ServiceSpec, log_dir: Path, grace_s: float = 5.0) -> Iterator[Running]:
    """The service started and ready for the block, stopped after it (a
    server a test or a check runs beside it)."""
    running = start(spec, log_dir)
    try:
        wait_ready(running)
        yield running
    finally:
        stop(running, grace_s=grace_s)


def wait_ready(running: Running) -> None:
    """Poll the service's readiness probe until its deadline; fail fast if it dies."""
    spec = running.spec

    def died() -> str | None:
        if alive(running):
            return None
        return (f"{spec.name} exited during start-up; "
                f"last lines of {running.log}:\n{tail(running.log)}")

    wait_until(spec.ready, spec.ready_timeout_s, spec.name, died=died,
               log_hint=lambda: f"last lines of {running.log}:\n{tail(running.log)}")


def wait_until(
    probe: Callable[[], bool],
    timeout_s: float,
    what: str,
    died: Callable[[], str | None] = lambda: None,
    log_hint: Callable[[], str] = lambda: "",
) -> None:
    """Poll `probe` every 50 ms until it returns True, or raise StartError at the deadline."""
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        if (reason := died()) is not None:
            raise StartError(reason)
        try:
            if probe():
                return
        except Exception as exc:  # not up yet: connection refused and the like
            last_error = exc
        time.sleep(0.05)
    raise StartError(f"{what} was not ready within {timeout_s:g} s "
                     f"(last probe error: {last_error!r}); {log_hint()}")


def alive(running: Running) -> bool:
    if running.popen is not None:
        return running.popen.poll() is None
    return pid_alive(running.pid)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return True


def stop(running: Running, grace_s: float = 10.0) -> None:
    """SIGTERM the process group, wait up to grace_s, then SIGKILL; reap our children.
    A grace of 0 sends SIGKILL straight away (a crash)."""
    _signal_group(running.pid, signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and alive(running):
        time.sleep(0.05)
    if alive(running):
        _signal_group(running.pid, signal.SIGKILL)
    if running.popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            running.popen.wait(timeout=5)
    else:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and pid_alive(running.pid):
            time.sleep(0.05)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def free_ports(count: int) -> list[int]:
    """`count` distinct ports on 127.0.0.1 that nothing listened on a moment ago
    (all bound at once, so none repeats; then closed for the caller to bind)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
