"""`streamlab console`: the lab console, a page that streams through the edge
while you break hops and press Stop (docs/console.md).

`streamlab up` starts it beside the lab; run it yourself to put it elsewhere:

    streamlab console                       # lab.env's host and console port
    streamlab console --port 9475           # STREAMLAB_CONSOLE_* settings work too
"""

from __future__ import annotations

import socket
import sys
from typing import Annotated

import typer

from streamlab.commands.conventions import fail, print_json
from streamlab.commands.lab import DEFAULT_RUN_DIR, RunDir
from streamlab.lab.topology import Ports

app = typer.Typer()


@app.command("console")
def console(
    host: Annotated[str | None, typer.Option(help="Listen here (default: lab.env's host).")
                    ] = None,
    port: Annotated[int | None, typer.Option(
        help="Listen on this port (default: STREAMLAB_CONSOLE_PORT from lab.env).")] = None,
    run_dir: RunDir = DEFAULT_RUN_DIR,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print where it serves as one JSON document, then serve.")] = False,
) -> None:
    """Serve the lab console (streams, toxics, presets, counters).

    Streams over every transport, toxics, presets and the engine's counters, in
    a browser."""
    import uvicorn

    from streamlab.console.app import create_app
    from streamlab.lab.console_settings import ConsoleSettings

    settings = ConsoleSettings.for_ports(Ports.load(), run_dir)
    settings = settings.model_copy(update={k: v for k, v in {"host": host, "port": port}.items()
                                           if v is not None})
    url = f"http://{settings.host}:{settings.port}/"
    # Before saying where it serves: a port in use is this command's failure
    # (exit 1, one document under --json), not uvicorn's exit 3 after the
    # "serving" document, which the CLI reserves for "no lab".
    try:
        with socket.create_server((settings.host, settings.port)):
            pass
    except OSError as exc:
        fail(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc} "
             "(another console? `--port`)")
    if as_json:
        print_json({"url": url, "edge": settings.edge_url})
        sys.stdout.flush()
    else:
        print(f"streamlab console on {url} (streams through {settings.edge_url})", flush=True)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port,
                log_level="warning", timeout_graceful_shutdown=2)
