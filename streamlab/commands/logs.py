"""`streamlab logs [SERVICE] [-f]`: the lab's logs, what `docker compose logs`
is to a compose lab.

    streamlab logs                  # the last lines of every service's log
    streamlab logs gateway -f       # the gateway's, then each new line until Ctrl-C
    streamlab logs --tail 0 engine  # the engine's whole log
    streamlab logs --json           # {"logs": {service: {"path", "lines"}}}

A local lab writes each process's output to `<run dir>/logs/SERVICE.log`
(nginx's own error log is `<run dir>/nginx/error.log`); this prints them, each
line after its service's name when there are several, as compose does. With
STREAMLAB_TARGET=compose it runs `docker compose logs` on the project.
`--follow` polls the files (a few times a second) until Ctrl-C or until the
lab is stopped (`streamlab down`).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Annotated

import typer

from streamlab.commands.completion import complete_services
from streamlab.commands.conventions import AsJson, fail, print_json
from streamlab.commands.lab import DEFAULT_RUN_DIR, RunDir, attached
from streamlab.exit_codes import EXIT_UNEXPECTED, EXIT_USAGE
from streamlab.lab.compose import ComposeLab

app = typer.Typer()

POLL_S = 0.25
# A poll reads at most this much of a log: a burst is printed over a few polls.
CHUNK = 1 << 20


def tail_lines(path: Path, count: int) -> list[str]:
    """The last `count` lines of a log (every line for 0), read from its end:
    a long-running lab's log is not read whole for 50 lines."""
    try:
        with path.open("rb") as log:
            size = log.seek(0, 2)
            start, data = size, b""
            while start > 0 and (count == 0 or data.count(b"\n") <= count):
                start = max(0, start - 64 * 1024)
                log.seek(start)
                data = log.read(size - start)
    except FileNotFoundError:
        return []
    lines = data.decode(errors="replace").splitlines()
    if start > 0:  # the first line read is a part of one
        lines = lines[1:]
    return lines[-count:] if count else lines


class Follower:
    """New lines of each log since the last poll, from where each one ends now.
    A log that shrank (rotated, truncated) is read again from its start."""

    def __init__(self, logs: Mapping[str, Path]) -> None:
        self.logs = dict(logs)
        self.offsets = {name: _size(path) for name, path in self.logs.items()}
        self.partial = dict.fromkeys(self.logs, b"")

    def poll(self) -> list[tuple[str, str]]:
        lines = []
        for name, path in self.logs.items():
            size = _size(path)
            if size < self.offsets[name]:
                self.offsets[name], self.partial[name] = 0, b""
            if size == self.offsets[name]:
                continue
            with path.open("rb") as log:
                log.seek(self.offsets[name])
                read = log.read(CHUNK)
            self.offsets[name] += len(read)
            *whole, self.partial[name] = (self.partial[name] + read).split(b"\n")
            lines += [(name, line.decode(errors="replace")) for line in whole]
        return lines


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def follow(follower: Follower, write: Callable[[str, str], None],
           going: Callable[[], bool], poll_s: float = POLL_S) -> None:
    """Write each new line until `going()` is false (the lab stopped); Ctrl-C
    ends it too, as the caller catches."""
    while going():
        for name, line in follower.poll():
            write(name, line)
        time.sleep(poll_s)
    for name, line in follower.poll():  # what the last moments wrote
        write(name, line)


@app.command("logs")
def logs_command(
    service: Annotated[str | None, typer.Argument(
        help="Only this service's log (default: every service's).",
        autocompletion=complete_services)] = None,
    follow_logs: Annotated[bool, typer.Option(
        "--follow", "-f", help="Then print each new line, until Ctrl-C or the lab stops.")
    ] = False,
    tail: Annotated[int, typer.Option(
        min=0, help="Lines of each log to print first (0: the whole log).")] = 50,
    run_dir: RunDir = DEFAULT_RUN_DIR,
    as_json: AsJson = False,
) -> None:
    """Print the lab's logs (every service's, or one's); -f follows them.

    A local lab's logs are files under the run dir; a compose lab's (with
    STREAMLAB_TARGET=compose) are `docker compose logs`."""
    if as_json and follow_logs:
        fail("--json prints one document: drop --follow", EXIT_USAGE)
    lab = attached(run_dir, running=False)  # a dead lab's logs say why it died
    if isinstance(lab, ComposeLab):
        _compose_logs(lab, service, follow_logs, tail, as_json)
        return
    logs = lab.logs
    if logs is None:
        fail("this lab keeps no log files the CLI can read", EXIT_USAGE)
    if service is not None:
        if service == lab.edge_proxy and service not in logs:
            service = "nginx"  # the edge proxy keeps nginx's slot (status names it so too)
        if service not in logs:
            fail(f"no service {service!r} in this lab; it has: {', '.join(logs)}", EXIT_USAGE)
        logs = {service: logs[service]}
    if as_json:
        print_json({"run_dir": str(run_dir), "logs": {
            name: {"path": str(path), "lines": tail_lines(path, tail)}
            for name, path in logs.items()}})
        return
    width = max(len(name) for name in logs)

    def write(name: str, line: str) -> None:
        sys.stdout.write(f"{name:<{width}} | {line}\n" if len(logs) > 1 else f"{line}\n")

    follower = Follower(logs) if follow_logs else None  # from where the logs end now
    for name, path in logs.items():
        for line in tail_lines(path, tail):
            write(name, line)
    sys.stdout.flush()
    if follower is None:
        return

    def write_now(name: str, line: str) -> None:
        write(name, line)
        sys.stdout.flush()

    try:
        follow(follower, write_now, going=(run_dir / "state.json").exists)
    except KeyboardInterrupt:
        return
    print("the lab stopped", file=sys.stderr)


def _compose_logs(lab: ComposeLab, service: str | None, follow_logs: bool, tail: int,
                  as_json: bool) -> None:
    argv = lab.settings.argv("logs", "--no-color", "--tail", str(tail) if tail else "all",
                             *(["--follow"] if follow_logs else []),
                             *([service] if service else []))
    if not as_json:
        try:
            code = subprocess.run(argv, check=False).returncode
        except KeyboardInterrupt:
            return
        except OSError as exc:
            fail(f"`{' '.join(argv)}` did not run: {exc}")
        # compose's own status (125: the project is not there) is not one of
        # ours: a failure is 1, as everywhere (its words went to stderr).
        raise typer.Exit(EXIT_UNEXPECTED if code else 0)
    try:
        done = subprocess.run(argv, check=False, capture_output=True, text=True)
    except OSError as exc:
        fail(f"`{' '.join(argv)}` did not run: {exc}")
    if done.returncode:
        fail(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}")
    print_json({"compose": argv, "logs": {
        name: {"lines": lines} for name, lines in by_service(done.stdout.splitlines()).items()}})


def by_service(lines: Iterable[str]) -> dict[str, list[str]]:
    """`docker compose logs --no-color` lines (`gateway-1  | text`; `gateway_1 |`
    from docker-compose 1) by service, as the local lab's `logs --json` gives them."""
    grouped: dict[str, list[str]] = {}
    for line in lines:
        prefix, sep, text = line.partition("|")
        if not sep:
            continue  # compose's own words, not a service's line
        name = re.sub(r"[-_]\d+$", "", prefix.strip())
        grouped.setdefault(name, []).append(text[1:] if text.startswith(" ") else text)
    return grouped
