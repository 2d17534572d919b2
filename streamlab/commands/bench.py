"""`streamlab bench`: measure the transports and the relay on a running lab."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from streamlab.bench.tables import TRANSPORT_COLUMNS, markdown, transport_rows, transports_table
from streamlab.bench.transports import Targets, Timing, run_transports, transport_names
from streamlab.commands.lab import DEFAULT_RUN_DIR, RunDir, attached
from streamlab.lab import Lab

app = typer.Typer(help=__doc__, no_args_is_help=True)
console = Console()
err = Console(stderr=True)


def targets_of(lab: Lab) -> Targets:
    def pid(name: str) -> int | None:
        running = lab.running.get(name)
        return running.pid if running else None

    return Targets(edge_url=lab.edge_url,
                   engine_hop=f"{lab.ports.host}:{lab.ports.engine_proxy_port}",
                   toxiproxy_url=lab.toxiproxy_url, gateway_pid=pid("gateway"),
                   engine_pid=pid("engine"))


def _progress() -> Progress:
    # On stderr, so `--json > file` stays clean.
    return Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err, transient=True)


@app.command()
def transports(
    run_dir: RunDir = DEFAULT_RUN_DIR,
    repetitions: Annotated[int, typer.Option("--reps", "-n", min=1,
                                             help="Runs per transport.")] = 5,
    intervals: Annotated[str, typer.Option(help="Short-polling intervals, ms.")] = "50,250,1000",
    tokens: Annotated[int, typer.Option(min=1, help="Tokens per answer.")] = 50,
    gap_ms: Annotated[int, typer.Option(min=1, help="Model's gap between tokens.")] = 50,
    gzip: Annotated[bool, typer.Option(help="Let HTTP clients accept gzip (nginx "
                                            "compresses streams and JSON).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    as_markdown: Annotated[bool, typer.Option("--markdown", help="Print a Markdown table.")
                           ] = False,
    plot: Annotated[Path | None, typer.Option(help="Write the timeline and costs PNG here.")
                    ] = None,
) -> None:
    """Polling (several intervals), long polling, SSE, WebSocket and direct gRPC, same model."""
    lab = attached(run_dir)
    intervals_ms = [int(x) for x in intervals.split(",") if x.strip()]
    names = transport_names(intervals_ms)
    timing = Timing(token_gap_ms=gap_ms, answer_tokens=tokens)
    with _progress() as progress:
        task = progress.add_task("warming up", total=len(names) * (repetitions + 1))

        def on_run(name: str, rep: int) -> None:
            label = name if rep < 0 else f"{name} · run {rep + 1}/{repetitions}"
            progress.update(task, description=label)
            progress.advance(task)

        report = run_transports(targets_of(lab), timing, repetitions, intervals_ms, gzip,
                                on_run).as_json()
    if plot is not None:
        from streamlab.bench.plot import plot_transports

        plot_transports(report, plot)
        err.print(f"plot written to {plot}")
    if as_json:
        print(json.dumps(report, indent=2))
        return
    if as_markdown:
        print(markdown(TRANSPORT_COLUMNS, transport_rows(report, markup=False)))
        return
    console.print(transports_table(report))
