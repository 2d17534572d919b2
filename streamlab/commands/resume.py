"""`streamlab resume run`: a stream cut mid-way, without resume and with it."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from streamlab.commands.lab import DEFAULT_RUN_DIR, RunDir, attached
from streamlab.resume_scenario import Mode, Outcome, ResumeTiming, run

app = typer.Typer(help="Resume with Last-Event-ID (the /v1/streams surface).",
                  no_args_is_help=True)
console = Console()


@app.command("run")
def run_command(
    run_dir: RunDir = DEFAULT_RUN_DIR,
    broken: Annotated[bool, typer.Option("--broken", help="Only the client without resume.")]
    = False,
    fixed: Annotated[bool, typer.Option("--fixed", help="Only the resuming client.")] = False,
    both: Annotated[bool, typer.Option("--both", help="Both (the default).")] = False,
    hop: Annotated[str, typer.Option(help="Where to cut: edge or upstream.")] = "edge",
    cut_bytes: Annotated[int, typer.Option(help="Bytes the first connection gets.")] = 900,
    tokens: Annotated[int, typer.Option(help="Tokens in the stream.")] = 40,
    gap_ms: Annotated[int, typer.Option(help="Fake model gap between tokens.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Cut one stream with Toxiproxy limit_data; exit 0 only if the client without
    resume loses data and the resuming one gets every token exactly once."""
    if hop not in ("edge", "upstream"):
        raise typer.BadParameter(f"hop must be edge or upstream, not {hop!r}")
    modes: tuple[Mode, ...] = (
        ("broken", "fixed") if both or broken == fixed else ("broken",) if broken else ("fixed",))
    lab = attached(run_dir)
    timing = ResumeTiming(tokens=tokens, gap_ms=gap_ms, hop=hop, cut_bytes=cut_bytes)
    outcomes = asyncio.run(run(lab, modes, timing))
    if as_json:
        print(json.dumps([o.as_json() for o in outcomes], indent=2))
    else:
        _print(outcomes, timing)
    if not all(o.as_expected for o in outcomes):
        raise typer.Exit(1)


def _print(outcomes: list[Outcome], timing: ResumeTiming) -> None:
    console.print(f"[bold]resume[/]: {timing.tokens} tokens, first connection cut after "
                  f"{timing.cut_bytes} bytes on {timing.hop} (Toxiproxy limit_data)")
    names = list(outcomes[0].figures)
    table = Table("figure", *(o.mode for o in outcomes))
    for name in names:
        table.add_row(name, *(str(o.figures.get(name)) for o in outcomes))
    console.print(table)
    for outcome in outcomes:
        verdict = ("[green]as expected[/]" if outcome.as_expected
                   else "[red]NOT as expected[/]")
        console.print(f"{outcome.mode}: {verdict}")
        for check, ok in outcome.checks:
            mark = "[green]✓[/]" if ok else "[red]✗[/]"
            console.print(f"  {mark} {check.describe():<28} {check.why}")
