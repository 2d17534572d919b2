"""`streamlab soak`: a bounded chaos soak against the running lab, and its self-test."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.progress import Progress

from streamlab.commands.completion import complete_broken
from streamlab.commands.conventions import OutputConsole, fail
from streamlab.commands.exits import EXIT_CODES, experiment_exits, reach, verdict_exit
from streamlab.commands.lab import DEFAULT_RUN_DIR, RunDir
from streamlab.exit_codes import EXIT_USAGE
from streamlab.experiments.render import show
from streamlab.experiments.soak import soak_as_asked
from streamlab.experiments.soak_verdict import BROKEN

app = typer.Typer()
console = OutputConsole()


@app.command("soak", epilog=EXIT_CODES)
def soak_command(
    streams: Annotated[int, typer.Option(help="Streams to run in all.")] = 200,
    concurrency: Annotated[int, typer.Option(help="Streams open at once.")] = 20,
    duration_s: Annotated[float, typer.Option(
        "--duration-s", "--duration", help="Upper bound in seconds.")] = 60.0,
    engine_kills: Annotated[int, typer.Option(help="Engine kills during the run.")] = 2,
    seed: Annotated[int, typer.Option(help="Random seed (behaviours, toxics).")] = 7,
    toxics: Annotated[bool, typer.Option(help="Toxics come and go on every hop.")] = True,
    broken: Annotated[str | None, typer.Option(
        help=f"Run against one broken thing (the verdict must fail): "
             f"{', '.join(BROKEN)}.", autocompletion=complete_broken)] = None,
    self_test: Annotated[bool, typer.Option(
        "--self-test", help="Run against every broken thing in turn, without toxics "
                            "(each must fail its own checks), then against the lab as it "
                            "is (it must pass).")] = False,
    run_dir: RunDir = DEFAULT_RUN_DIR,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """A chaos soak: toxics and engine kills under mixed clients.

    Clients with different behaviours (read fully, through an idle-cutting hop
    with a think pause, resume, abandon, stop reading, poll and walk away) while
    random toxics come and go on every hop and the engine is killed and
    restarted. Exits 1 unless every check holds: no hang, no corrupt text,
    enough untouched streams and ≥ 90 % of them complete, every generation
    whose client left cancelled within its bound, nothing left running, no idle
    cut, the gateway's RSS back within 1.2x.

    With --broken NAME it is expected to fail, and exits 1 when it does (so a
    script sees the failure); --self-test exits 0 only if every broken thing
    failed its checks and the lab as it is passed. Needs a lab with pids (the
    gateway's RSS), the engine's record and restarts: a local lab (exit 2
    otherwise, naming what is missing)."""
    if broken is not None and broken not in BROKEN:
        fail(f"Unknown broken thing {broken!r}: {', '.join(BROKEN)}", EXIT_USAGE)
    lab = reach(run_dir)
    with (experiment_exits(),
          Progress(console=console, transient=True, disable=as_json or self_test) as progress):
        task = progress.add_task(f"soaking{f' ({broken})' if broken else ''}", total=streams)
        report = asyncio.run(soak_as_asked(lab, broken, self_test, streams, concurrency,
                                           duration_s, engine_kills, seed, toxics,
                                           lambda: progress.advance(task)))
    show(report, console, as_json=as_json)
    # A broken run's verdict is to fail; it exits 1 all the same, so a script sees it.
    verdict_exit(report)
