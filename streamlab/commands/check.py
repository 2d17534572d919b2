"""`streamlab check URL`: a streaming conformance report for any
OpenAI-compatible server (docs/check.md).

    streamlab check http://127.0.0.1:8000/v1
    streamlab check https://api.example.com/v1 --model m --api-key-env EXAMPLE_KEY --json
    streamlab check http://127.0.0.1:8080/v1 --extra-body '{"ignore_eos": true}' \\
        --answer-tokens 3000 --junit check.xml

The command parses, calls the runner (streamlab/experiments/check/runner.py)
and renders its Report: the table and one line a check, or --json (one
document whatever happens: usage errors and an unreachable target included),
and --junit FILE besides either. Progress and every error go to stderr.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Annotated, Any, NoReturn

import typer

from streamlab.commands.completion import complete_checks
from streamlab.commands.conventions import OutputConsole, StreamlabCommand, split_list
from streamlab.exit_codes import EXIT_INTERRUPTED, EXIT_UNREACHABLE, EXIT_USAGE
from streamlab.experiments.check.junit import junit_xml
from streamlab.experiments.check.runner import CHECKS, NoModel, check_url
from streamlab.experiments.check.target import CheckTarget
from streamlab.experiments.check.verdict import document, exit_status, line
from streamlab.experiments.render import show
from streamlab.lab.target import TargetUnreachable

app = typer.Typer()
console = OutputConsole()
errors = OutputConsole(stderr=True)

EXIT_CODES = """Exit status: 0 every check passed or is n/a; 1 a check failed (or
errored); 2 usage (a bad URL or option, an unset --api-key-env, no model); 3 the
target is unreachable. Under --json stdout is one JSON document in every case."""


def print_document(doc: dict[str, Any]) -> None:
    print(json.dumps(doc, indent=2, default=str))


class JsonUsageErrors(StreamlabCommand):
    """Under --json a usage error is a JSON document too (`| jq` never breaks),
    the check's own: its schema, no checks, the error (commands/conventions.py
    prints it, as it does every command's)."""

    def error_document(self, args: Sequence[str], kind: str, message: str,
                       code: int) -> dict[str, Any]:
        return document(None, url=next((a for a in args if "://" in a), ""),
                        error=(kind, message))


def stop_on_sigterm() -> None:
    """SIGTERM (a CI job's end, `kill`) ends the run as Ctrl-C does: every
    check is cancelled and every process the check started (its Toxiproxy) is
    stopped on the way out, none left on its ports."""
    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupt)


def parse_extra_body(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"--extra-body is not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise ValueError("--extra-body must be a JSON object")
    return parsed


@app.command("check", epilog=EXIT_CODES, cls=JsonUsageErrors)
def check_command(
    url: Annotated[str, typer.Argument(help="The server's OpenAI base URL: http://HOST:PORT/v1")],
    model: Annotated[str | None, typer.Option(
        help="The model to ask for (default: the first /v1/models lists).")] = None,
    api_key_env: Annotated[str | None, typer.Option(
        help="The environment variable that holds the API key (never the key itself: "
             "it would land in the shell's history).")] = None,
    metrics_url: Annotated[str | None, typer.Option(
        help="The server's Prometheus metrics (default: /metrics at the URL's root, "
             "where vLLM, SGLang, TGI and llama.cpp's server serve them).")] = None,
    running_gauge: Annotated[str | None, typer.Option(
        help="The gauge of generations running now, when it is none of vLLM's, "
             "SGLang's, llama.cpp's, TGI's or the lab's.")] = None,
    only: Annotated[list[str] | None, typer.Option(
        help=f"Run only these checks (repeat it, or separate with commas): "
             f"{', '.join(CHECKS)}.", autocompletion=complete_checks)] = None,
    extra_body: Annotated[str | None, typer.Option(
        help='JSON merged into every request: \'{"ignore_eos": true}\', min_tokens, '
             "chat_template_kwargs ...")] = None,
    prompt_words: Annotated[int, typer.Option(
        help="The long prompt's words (heartbeat, idle-cut: a prefill to wait through).",
        min=1)] = 3000,
    answer_tokens: Annotated[int, typer.Option(
        help="The long answer's max_tokens (cancel, slow-reader): lower it on a small "
             "context.", min=16)] = 12000,
    silence_s: Annotated[float, typer.Option(
        help="The silence before the first token to ask a streamlab gateway for "
             "(longer than --idle-cut-s).")] = 25.0,
    idle_cut_s: Annotated[float, typer.Option(
        help="The idle timeout a heartbeat must beat: a proxy's read timeout (nginx and "
             "cloud load balancers: 60 s; 20 s leaves a margin).")] = 20.0,
    concurrency: Annotated[int, typer.Option(
        "--concurrency", "--streams", help="Concurrency check: streams at once.", min=1)] = 8,
    leave_streams: Annotated[int, typer.Option(
        help="Cancel check without metrics: long streams left at once (more than the "
             "server's slots).", min=1)] = 2,
    stream_deadline_s: Annotated[float, typer.Option(
        help="No stream is read for longer than this (an answer that never ends).")] = 120.0,
    timeout_s: Annotated[float, typer.Option(
        help="Each request's read timeout: no byte (headers included) for this long is an "
             "error.")] = 60.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
    junit: Annotated[Path | None, typer.Option(
        help="Also write JUnit XML here: one testcase per check.")] = None,
) -> None:
    """A streaming conformance report on any OpenAI-compatible server.

    Framing, errors, the stream's shape and tool calls, the Responses API,
    first byte vs first token, heartbeats through every silence and an idle
    cut, a client that leaves, a reader that stops, resume, concurrency. One
    line per check: pass, fail (the evidence and the fix) or n/a (why)."""

    def fail(kind: str, message: str, code: int) -> None:
        errors.print(message, markup=False, highlight=False, style="red")
        if as_json:
            print_document(document(None, url=url, model=model or "", error=(kind, message)))
        raise typer.Exit(code)

    api_key = None
    if api_key_env is not None:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            fail("usage", f"{api_key_env} is not set", EXIT_USAGE)
    only = split_list(only)
    unknown = [name for name in only if name not in CHECKS]
    if unknown:
        fail("usage", f"unknown check {unknown[0]!r}: one of {', '.join(CHECKS)}", EXIT_USAGE)
    try:
        target = CheckTarget(url, model or "", api_key=api_key, metrics_url=metrics_url,
                             running_gauge=running_gauge, silence_s=silence_s,
                             idle_cut_s=idle_cut_s, streams=concurrency,
                             extra_body=parse_extra_body(extra_body), prompt_words=prompt_words,
                             answer_tokens=answer_tokens, leave_streams=leave_streams,
                             stream_deadline_s=stream_deadline_s, timeout_s=timeout_s)
    except ValueError as exc:
        fail("usage", str(exc), EXIT_USAGE)
        return

    def interrupted() -> NoReturn:
        errors.print("interrupted: every check stopped, the check's hop with them",
                     style="red")
        sys.exit(EXIT_INTERRUPTED)

    def progress(text: str) -> None:
        errors.print(text, markup=False, highlight=False, style="dim")

    stop_on_sigterm()
    try:
        report = asyncio.run(check_url(target, tuple(only) if only else CHECKS,
                                       progress=progress))
    except TargetUnreachable as exc:
        fail("unreachable", str(exc), EXIT_UNREACHABLE)
        return
    except NoModel as exc:
        fail("usage", f"{exc}: give --model", EXIT_USAGE)
        return
    except KeyboardInterrupt:
        interrupted()
    except BaseExceptionGroup as group:
        # The signal's KeyboardInterrupt raised inside a task group (anyio's
        # connect_tcp, mid-connect) comes out wrapped: still an interrupt.
        if group.subgroup(lambda exc: isinstance(exc, KeyboardInterrupt)) is None:
            raise
        interrupted()
    if junit is not None:
        junit.write_text(junit_xml(report))
    if as_json:
        print_document(document(report, url=url, model=str(report.figures.get("model", ""))))
    else:
        console.print(f"{url} · model {report.figures.get('model')} · through "
                      f"{report.figures.get('hop')}", markup=False, highlight=False)
        show(replace(report, figures={}), console)  # the run's own figures are that line
        # One line per check, whole (a table cell wraps): the evidence and the fix.
        for part in report.parts:
            console.print(line(part), markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(exit_status(report))
