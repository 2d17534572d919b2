"""`streamlab soak`: a bounded chaos soak against the running lab."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from streamlab.commands.lab import DEFAULT_RUN_DIR, attached
from streamlab.soak import SoakReport, soak

app = typer.Typer()
console = Console()


def report_table(report: SoakReport) -> Table:
    table = Table("figure", "value", title="chaos soak")
    for outcome, count in sorted(report.outcomes.items()):
        table.add_row(f"streams {outcome}", str(count))
    table.add_row("toxics applied", str(report.toxics_applied))
    table.add_row("engine kills + restarts", str(report.engine_restarts))
    table.add_row("generations left running", str(report.engine_left_running))
    table.add_row("gateway RSS start → end",
                  f"{report.gateway_rss_start_mb:.1f} → {report.gateway_rss_end_mb:.1f} MiB")
    table.add_row("duration", f"{report.duration_s:.1f} s")
    table.add_row("verdict", "[green]pass[/]" if report.passed else "[red]FAIL[/]")
    return table


@app.command("soak")
def soak_command(
    streams: Annotated[int, typer.Option(help="Streams to run in all.")] = 200,
    concurrency: Annotated[int, typer.Option(help="Streams open at once.")] = 20,
    duration: Annotated[float, typer.Option(help="Upper bound in seconds.")] = 60.0,
    engine_kills: Annotated[int, typer.Option(help="Engine kills during the run.")] = 2,
    seed: Annotated[int, typer.Option(help="Random seed (behaviours, toxics).")] = 7,
    run_dir: Annotated[Path, typer.Option(help="The lab's run dir.")] = DEFAULT_RUN_DIR,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Streams with random client behaviour (read fully, abandon, stop reading)
    while random toxics come and go on every hop and the engine is killed and
    restarted. Exits 1 unless: no stream hung, no completed stream lost or
    duplicated a token, no generation is left running, and the gateway's RSS is
    back within 1.2x of its start."""
    lab = attached(run_dir)
    if lab.pids is None:
        console.print("[red]The soak reads the gateway's RSS by pid: a local lab only "
                      "(STREAMLAB_TARGET=local).[/]")
        raise typer.Exit(1)
    with Progress(console=console, transient=True, disable=as_json) as progress:
        task = progress.add_task("soaking", total=streams)
        report = asyncio.run(soak(lab, streams=streams, concurrency=concurrency,
                                  duration_s=duration, engine_kills=engine_kills, seed=seed,
                                  progress=lambda: progress.advance(task)))
    if as_json:
        print(json.dumps({"outcomes": dict(report.outcomes), "passed": report.passed,
                          "toxics_applied": report.toxics_applied,
                          "engine_restarts": report.engine_restarts,
                          "engine_left_running": report.engine_left_running,
                          "gateway_rss_start_mb": round(report.gateway_rss_start_mb, 1),
                          "gateway_rss_end_mb": round(report.gateway_rss_end_mb, 1),
                          "duration_s": round(report.duration_s, 1)}, indent=2))
    else:
        console.print(report_table(report))
    if not report.passed:
        raise typer.Exit(1)
