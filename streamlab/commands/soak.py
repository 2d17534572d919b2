"""`streamlab soak`: a bounded chaos soak against the running lab, and its self-test."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from streamlab.commands.lab import DEFAULT_RUN_DIR, attached
from streamlab.experiments.soak import SoakReport, soak
from streamlab.experiments.soak_verdict import BROKEN, SELF_TEST
from streamlab.lab.target import LabTarget

app = typer.Typer()
console = Console()


def report_table(report: SoakReport, title: str = "chaos soak") -> Table:
    table = Table("figure", "value", title=title)
    for name, value in report.figures.items():
        table.add_row(name, "—" if value is None else str(value))
    for check in report.checks():
        mark = "[green]ok[/]" if check.holds else "[red]FAIL[/]"
        table.add_row(f"check {check.description}", mark)
    table.add_row("verdict", "[green]pass[/]" if report.passed else "[red]FAIL[/]")
    return table


def report_json(report: SoakReport) -> dict[str, Any]:
    return {"passed": report.passed, "knobs": dict(report.knobs), "lab_fault": report.lab_fault,
            "figures": report.figures, "failed": report.failed,
            "checks": [{"check": c.description, "holds": c.holds, "why": c.check.why}
                       for c in report.checks()]}


@app.command("soak")
def soak_command(
    streams: Annotated[int, typer.Option(help="Streams to run in all.")] = 200,
    concurrency: Annotated[int, typer.Option(help="Streams open at once.")] = 20,
    duration: Annotated[float, typer.Option(help="Upper bound in seconds.")] = 60.0,
    engine_kills: Annotated[int, typer.Option(help="Engine kills during the run.")] = 2,
    seed: Annotated[int, typer.Option(help="Random seed (behaviours, toxics).")] = 7,
    toxics: Annotated[bool, typer.Option(help="Toxics come and go on every hop.")] = True,
    broken: Annotated[str | None, typer.Option(
        help=f"Run against one broken thing (the verdict must fail): "
             f"{', '.join(BROKEN)}.")] = None,
    self_test: Annotated[bool, typer.Option(
        "--self-test", help="Run against every broken thing in turn, without toxics "
                            "(each must fail its own checks), then against the lab as it "
                            "is (it must pass).")] = False,
    run_dir: Annotated[Path, typer.Option(help="The lab's run dir.")] = DEFAULT_RUN_DIR,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Clients with different behaviours (read fully, through an idle-cutting
    hop with a think pause, resume, abandon, stop reading, poll and walk away)
    while random toxics come and go on every hop and the engine is killed and
    restarted. Exits 1 unless every check holds: no hang, no corrupt text,
    enough untouched streams and ≥ 90 % of them complete, every generation
    whose client left cancelled within its bound, nothing left running, no
    idle cut, the gateway's RSS back within 1.2x. With --broken NAME it is
    expected to fail, and exits 1 when it does (so a script sees the failure);
    --self-test exits 0 only if every broken thing failed its checks and the
    lab as it is passed."""
    if broken is not None and broken not in BROKEN:
        console.print(f"[red]Unknown broken thing {broken!r}[/]: {', '.join(BROKEN)}")
        raise typer.Exit(2)
    lab = attached(run_dir)
    if lab.pids is None:
        console.print("[red]The soak reads the gateway's RSS by pid: a local lab only "
                      "(STREAMLAB_TARGET=local).[/]")
        raise typer.Exit(1)
    options: dict[str, Any] = {"streams": streams, "concurrency": concurrency,
                               "duration_s": duration, "seed": seed, "toxics": toxics}
    if self_test:
        raise typer.Exit(0 if _self_test(lab, options, engine_kills, as_json) else 1)
    thing = BROKEN[broken] if broken else None
    with Progress(console=console, transient=True, disable=as_json) as progress:
        task = progress.add_task(f"soaking{f' ({broken})' if broken else ''}", total=streams)
        report = asyncio.run(soak(
            lab, engine_kills=thing.engine_kills if thing else engine_kills,
            knobs=thing.knobs if thing else None, lab_fault=thing.lab_fault if thing else "",
            progress=lambda: progress.advance(task), **options))
    if as_json:
        print(json.dumps(report_json(report), indent=2))
    else:
        console.print(report_table(report, f"chaos soak{f': {broken}' if broken else ''}"))
    if not report.passed:
        raise typer.Exit(1)


def _self_test(lab: LabTarget, options: dict[str, Any], engine_kills: int,
               as_json: bool) -> bool:
    rows: list[dict[str, Any]] = []
    for thing in SELF_TEST:
        # The broken thing alone, without toxics: its failure must be its own.
        report = asyncio.run(soak(lab, engine_kills=thing.engine_kills, knobs=thing.knobs,
                                  lab_fault=thing.lab_fault, **{**options, "toxics": False}))
        caught = set(thing.guarded_by) <= set(report.failed)
        rows.append({"broken": thing.name, "expected_failing": list(thing.guarded_by),
                     "failed": report.failed, "as_expected": caught and not report.passed,
                     "figures": report.figures})
    report = asyncio.run(soak(lab, engine_kills=engine_kills, **options))
    rows.append({"broken": "(none: the lab as it is)", "expected_failing": [],
                 "failed": report.failed, "as_expected": report.passed,
                 "figures": report.figures})
    ok = all(row["as_expected"] for row in rows)
    if as_json:
        print(json.dumps({"passed": ok, "runs": rows}, indent=2))
        return ok
    table = Table("broken", "must fail", "failed", "verdict", title="soak self-test")
    for row in rows:
        table.add_row(row["broken"], ", ".join(row["expected_failing"]) or "nothing",
                      ", ".join(row["failed"]) or "nothing",
                      "[green]as expected[/]" if row["as_expected"] else "[red]UNEXPECTED[/]")
    console.print(table)
    return ok
