"""`streamlab check URL --model M`: a streaming conformance report for any
OpenAI-compatible server (docs/check.md).

    streamlab check http://127.0.0.1:8000/v1 --model my-model
    streamlab check https://api.example.com/v1 --model m --api-key-env EXAMPLE_KEY --json
    streamlab check http://127.0.0.1:8000/v1 --model m --junit check.xml \\
        --metrics-url http://127.0.0.1:8000/metrics

The command parses, calls the runner (streamlab/experiments/check/runner.py)
and renders its Report: the table, --json, or --junit FILE besides either.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from streamlab.experiments.check.junit import junit_xml
from streamlab.experiments.check.runner import CHECKS, check_url
from streamlab.experiments.check.target import CheckTarget
from streamlab.experiments.check.verdict import (
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    exit_status,
    line,
)
from streamlab.experiments.render import as_json_text, show
from streamlab.lab.target import TargetUnreachable

app = typer.Typer()
console = Console()

EXIT_CODES = """Exit status: 0 every check passed or is n/a; 1 a check failed (or
errored); 2 usage (a bad URL or option, an unset --api-key-env); 3 the target
is unreachable."""


@app.command("check", epilog=EXIT_CODES)
def check_command(
    url: Annotated[str, typer.Argument(help="The server's OpenAI base URL: http://HOST:PORT/v1")],
    model: Annotated[str, typer.Option(help="The model to ask for.")],
    api_key_env: Annotated[str | None, typer.Option(
        help="The environment variable that holds the API key (never the key itself: "
             "it would land in the shell's history).")] = None,
    metrics_url: Annotated[str | None, typer.Option(
        help="The server's Prometheus /metrics: the cancel and slow-reader checks read "
             "running generations there (vLLM's, the lab engine's).")] = None,
    only: Annotated[list[str] | None, typer.Option(
        help=f"Run only these checks (repeatable): {', '.join(CHECKS)}.")] = None,
    silence_s: Annotated[float, typer.Option(
        help="The silence before the first token to ask a streamlab gateway for "
             "(longer than --idle-cut-s; other servers get a long prompt).")] = 25.0,
    idle_cut_s: Annotated[float, typer.Option(
        help="The idle timeout a heartbeat must beat: a proxy's read timeout (nginx and "
             "cloud load balancers: 60 s; 20 s leaves a margin).")] = 20.0,
    streams: Annotated[int, typer.Option(help="Concurrency check: streams at once.")] = 8,
    as_json: Annotated[bool, typer.Option("--json", help="Print the Report as JSON.")] = False,
    junit: Annotated[Path | None, typer.Option(
        help="Also write JUnit XML here: one testcase per check.")] = None,
) -> None:
    """A streaming conformance report on any OpenAI-compatible server.

    Framing, errors, first byte vs first token, heartbeat and an idle cut, a
    client that leaves, a reader that stops, resume, concurrency. One line per
    check: pass, fail (the evidence and the fix) or n/a (why)."""
    api_key = None
    if api_key_env is not None:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            console.print(f"[red]{api_key_env} is not set[/]")
            raise typer.Exit(EXIT_USAGE)
    unknown = [name for name in only or () if name not in CHECKS]
    if unknown:
        console.print(f"[red]Unknown check {unknown[0]!r}[/]: {', '.join(CHECKS)}")
        raise typer.Exit(EXIT_USAGE)
    try:
        target = CheckTarget(url, model, api_key=api_key, metrics_url=metrics_url,
                             silence_s=silence_s, idle_cut_s=idle_cut_s, streams=streams)
    except ValueError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(EXIT_USAGE) from None
    try:
        report = asyncio.run(check_url(target, tuple(only) if only else CHECKS))
    except TargetUnreachable as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(EXIT_UNREACHABLE) from None
    if junit is not None:
        junit.write_text(junit_xml(report))
    if as_json:
        print(as_json_text(report))
    else:
        show(report, console)
        # One line per check, whole (a table cell wraps): the evidence and the fix.
        for part in report.parts:
            console.print(line(part), markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(exit_status(report))
