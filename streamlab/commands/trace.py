"""`streamlab trace REQUEST_ID`: one stream's timeline across every hop, from
the client's timings, the edge proxy's JSON log line and the gateway's and the
engine's spans in the lab's Jaeger (`streamlab up --tracing`; docs/tracing.md).

    streamlab trace 103473eb12224d999cebadabd12ea791          # a waterfall
    streamlab trace 103473eb12224d999cebadabd12ea791 --json   # the data
"""

from __future__ import annotations

from typing import Annotated

import httpx
import typer

from streamlab.commands.conventions import AsJson, fail, print_json
from streamlab.commands.lab import DEFAULT_RUN_DIR, RunDir, attached
from streamlab.exit_codes import EXIT_UNREACHABLE, EXIT_USAGE
from streamlab.lab.local import Lab
from streamlab.lab.trace_timeline import collect

app = typer.Typer()


@app.command(short_help="One stream's timeline across every hop (`up --tracing`).")
def trace(
    request_id: Annotated[str, typer.Argument(
        help="The stream's request id (X-Request-Id; `chat` prints it, a scenario's "
             "report lists those it judged).")],
    run_dir: RunDir = DEFAULT_RUN_DIR,
    wait_s: Annotated[float, typer.Option(
        "--wait-s", min=0.0, help="How long to wait for the spans to reach Jaeger.")] = 3.0,
    as_json: AsJson = False,
) -> None:
    """One stream's timeline: connect, headers, queue, prefill, first token at
    each hop, heartbeats, cuts, resume, end."""
    lab = attached(run_dir)
    if not isinstance(lab, Lab):
        fail("streamlab trace reads a local lab's logs and Jaeger: not the compose lab yet",
             EXIT_USAGE)
    if not lab.options.tracing:
        fail("this lab is up without tracing: `streamlab down`, then `streamlab up --tracing`",
             EXIT_USAGE)
    try:
        timeline = collect(lab, request_id, wait_s=wait_s)
    except httpx.HTTPError as exc:
        fail(f"Jaeger did not answer: {exc}", EXIT_UNREACHABLE)
    if as_json:
        print_json(timeline.as_json())
    else:
        for line in timeline.render():
            typer.echo(line)
    if not timeline.marks:
        raise typer.Exit(1)
