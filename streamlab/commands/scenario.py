"""`streamlab scenario list|run`: reproduce a failure, broken and fixed, with a verdict.

    streamlab scenario list
    streamlab scenario list --json                # the catalogue as data
    streamlab scenario run idle-cut --both        # exit 0 only if every verdict is as expected
    streamlab scenario run all --json             # every scenario, machine-readable
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from streamlab.commands.lab import DEFAULT_RUN_DIR, RunDir, attached
from streamlab.toxiproxy import ToxiproxyError

if TYPE_CHECKING:
    from streamlab.scenarios import Mode, Outcome, Scenario
    from streamlab.scenarios.model import Figure

# The catalogue (and the websockets client its measures use) is imported inside
# the commands: every `streamlab ...` start would otherwise pay for it.

app = typer.Typer(help="Reproduce each streaming failure, broken and fixed, and measure it.",
                  no_args_is_help=True)
console = Console()
err = Console(stderr=True)


@app.command("list")
def list_scenarios(
    as_json: Annotated[bool, typer.Option(
        "--json", help="The whole catalogue as data: setups and checks per mode (bounds at "
                       "the default timing).")] = False,
) -> None:
    """Every scenario, and what its broken and fixed setups are."""
    from streamlab.scenarios import CATALOGUE, Timing

    if as_json:
        print(json.dumps([s.as_json(Timing()) for s in CATALOGUE.values()], indent=2))
        return
    table = Table("scenario", "what it shows", "broken", "fixed")
    for scenario in CATALOGUE.values():
        table.add_row(scenario.name, scenario.summary, scenario.broken.story,
                      scenario.fixed.story)
    console.print(table)


@app.command("run")
def run_command(
    name: Annotated[str, typer.Argument(help="A scenario (see `list`), or `all`.")],
    broken: Annotated[bool, typer.Option("--broken", help="Only the broken setup.")] = False,
    fixed: Annotated[bool, typer.Option("--fixed", help="Only the fixed setup.")] = False,
    both: Annotated[bool, typer.Option("--both", help="Both (the default).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    all_figures: Annotated[bool, typer.Option(
        "--all-figures", help="Every measured figure, not only the scenario's own.")] = False,
    run_dir: RunDir = DEFAULT_RUN_DIR,
    prefill_ms: Annotated[int | None, typer.Option(help="Fake model prefill.")] = None,
    gap_ms: Annotated[int | None, typer.Option(help="Fake model gap between tokens.")] = None,
    tokens: Annotated[int | None, typer.Option(help="Tokens per reply.")] = None,
    think_s: Annotated[float | None, typer.Option(
        help="Think pause (default: twice the lab's short idle timeout).")] = None,
    heartbeat_s: Annotated[float | None, typer.Option(
        help="Ping interval when a scenario turns pings on.")] = None,
    watchdog_s: Annotated[float | None, typer.Option(help="Client read timeout.")] = None,
    tolerance_s: Annotated[float | None, typer.Option(help="Slack on timing checks.")] = None,
) -> None:
    """Run one scenario (or all) and print figures and a verdict per mode.

    Exits 0 only when every verdict is as expected: the broken setup broke and
    the fixed one worked."""
    from streamlab.scenarios import CATALOGUE, MODES, run, timing_for
    from streamlab.scenarios.model import ScenarioUnavailable

    if name != "all" and name not in CATALOGUE:
        err.print(f"[red]no scenario {name!r}[/]; one of: {', '.join(CATALOGUE)}, all")
        raise typer.Exit(2)
    modes: tuple[Mode, ...] = MODES if both or broken == fixed else (
        ("broken",) if broken else ("fixed",))
    scenarios = list(CATALOGUE.values()) if name == "all" else [CATALOGUE[name]]
    lab = attached(run_dir)
    timing = timing_for(lab, prefill_ms=prefill_ms, gap_ms=gap_ms, tokens=tokens,
                        think_s=think_s, heartbeat_s=heartbeat_s, watchdog_s=watchdog_s,
                        tolerance_s=tolerance_s)

    async def run_all() -> list[Outcome]:
        outcomes = []
        for scenario in scenarios:
            for mode in modes:
                outcomes.append(await run(lab, scenario, mode, timing))
            if not as_json:
                print_outcomes(scenario, outcomes[-len(modes):], all_figures)
        return outcomes

    try:
        outcomes = asyncio.run(run_all())
    except ToxiproxyError as exc:
        err.print(f"[red]{exc}[/] (is the lab up? `streamlab status`)")
        raise typer.Exit(1) from exc
    except ScenarioUnavailable as exc:
        err.print(f"[red]cannot run here:[/] {exc}")
        raise typer.Exit(1) from exc
    if as_json:
        print(json.dumps([o.as_json() for o in outcomes], indent=2))
    if not all(o.as_expected for o in outcomes):
        raise typer.Exit(1)


def _format(value: Figure) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def print_outcomes(scenario: Scenario, outcomes: list[Outcome], all_figures: bool) -> None:
    table = Table(title=f"{scenario.name}: {scenario.summary}", title_justify="left")
    table.add_column("figure")
    for outcome in outcomes:
        table.add_column(outcome.mode)
    checked = [c.check.figure for o in outcomes for c in o.checks]
    names = list(dict.fromkeys([*scenario.shown, *checked]))  # ordered, no repeats
    if all_figures or not names:
        names += sorted({k for o in outcomes for k in o.figures} - set(names))
    for figure in names:
        table.add_row(figure, *(_format(o.figures.get(figure)) for o in outcomes))
    table.add_section()
    table.add_row("setup", *(o.story for o in outcomes))
    table.add_row("expected", *("\n".join(
        f"{'[green]✓[/]' if c.holds else '[red]✗[/]'} {c.description}" for c in o.checks)
        for o in outcomes))
    table.add_row("verdict", *(
        f"[green]{o.verdict}[/]" if o.as_expected else f"[bold red]{o.verdict}[/]"
        for o in outcomes))
    console.print(table)
