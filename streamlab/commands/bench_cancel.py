"""`streamlab bench-cancel`: cancel latency and wasted tokens over many abandoned streams."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from services.client.abandon import abandon_streams
from streamlab.commands.lab import DEFAULT_RUN_DIR, attached

app = typer.Typer()
console = Console()


@app.command("bench-cancel")
def bench_cancel(
    streams: Annotated[int, typer.Option(help="Abandoned streams to open.")] = 200,
    concurrency: Annotated[int, typer.Option(help="Streams open at once.")] = 20,
    gap_ms: Annotated[int, typer.Option(help="Fake model gap between tokens.")] = 20,
    location: Annotated[str, typer.Option(help="nginx location to go through.")] = "/",
    run_dir: Annotated[Path, typer.Option(help="The lab's run dir.")] = DEFAULT_RUN_DIR,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Open streams through the edge, leave each after 1-8 tokens, and report how
    fast the engine saw each cancel (p50/p99) and how many tokens it wasted."""
    lab = attached(run_dir)
    url = f"{lab.edge_url}{location.rstrip('/')}/v1/chat/completions"
    with Progress(console=console, transient=True, disable=as_json) as progress:
        task = progress.add_task("abandoning streams", total=streams)
        report = asyncio.run(abandon_streams(
            url, lab.engine_stats, streams=streams, concurrency=concurrency, gap_ms=gap_ms,
            progress=lambda: progress.advance(task)))
    figures = {
        "streams": report.streams, "cancelled": report.cancelled,
        "still_running": report.still_running,
        "cancel_latency_p50_ms": round(report.p50_ms, 1),
        "cancel_latency_p99_ms": round(report.percentile(0.99), 1),
        "cancel_latency_max_ms": round(max(report.latencies_ms, default=float("nan")), 1),
        "tokens_after_cancel": report.tokens_after_cancel,
        "tokens_after_client_left": report.tokens_after_leaving,
    }
    if as_json:
        print(json.dumps(figures, indent=2))
    else:
        table = Table("figure", "value", title=f"{streams} abandoned streams, gap {gap_ms} ms")
        for key, value in figures.items():
            table.add_row(key.replace("_", " "), str(value))
        console.print(table)
    if report.still_running or report.cancelled < report.streams:
        raise typer.Exit(1)
