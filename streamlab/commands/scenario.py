"""`streamlab scenario list|run`: reproduce a failure, broken and fixed, with a verdict.

    streamlab scenario list
    streamlab scenario list --json                # the catalogue as data
    streamlab scenario run idle-cut --both        # exit 0 only if every verdict is as expected
    streamlab scenario run all --json             # every scenario, machine-readable
    streamlab scenario run all --shuffle --repeat 3 [--seed S]
                                                  # any order: each repeat shuffled
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from streamlab.commands.lab import DEFAULT_RUN_DIR, RunDir, attached
from streamlab.lab.toxiproxy import ToxiproxyError

if TYPE_CHECKING:
    from streamlab.experiments.report import Figure
    from streamlab.experiments.scenarios import Mode, Outcome, Scenario

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
    from streamlab.experiments.scenarios import CATALOGUE, Timing

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
    load_scale: Annotated[float | None, typer.Option(
        help="Share of a load scenario's full size (its streams) to run.")] = None,
    shuffle: Annotated[bool, typer.Option(
        "--shuffle", help="Run the (scenario, mode) pairs in a random order, a new one per "
                          "repeat: no verdict may depend on what ran before it.")] = False,
    repeat: Annotated[int, typer.Option(
        min=1, help="Run everything this many times.")] = 1,
    seed: Annotated[int | None, typer.Option(
        help="Seed of the shuffle (printed on every shuffled run), to replay an order.")
    ] = None,
) -> None:
    """Run one scenario (or all) and print figures and a verdict per mode.

    Exits 0 only when every verdict is as expected: the broken setup broke and
    the fixed one worked."""
    from streamlab.experiments.scenarios import CATALOGUE, MODES, run, timing_for
    from streamlab.experiments.scenarios.model import ScenarioUnavailable
    from streamlab.experiments.scenarios.runner import plan_runs

    if name != "all" and name not in CATALOGUE:
        err.print(f"[red]no scenario {name!r}[/]; one of: {', '.join(CATALOGUE)}, all")
        raise typer.Exit(2)
    modes: tuple[Mode, ...] = MODES if both or broken == fixed else (
        ("broken",) if broken else ("fixed",))
    names = list(CATALOGUE) if name == "all" else [name]
    plan = plan_runs(names, modes, repeat=repeat, shuffle=shuffle, seed=seed)
    # One table per scenario (its modes side by side) unless the order is mixed
    # or repeated; then one table per run and a summary of every run at the end.
    per_run = shuffle or repeat > 1
    lab = attached(run_dir)
    timing = timing_for(lab, prefill_ms=prefill_ms, gap_ms=gap_ms, tokens=tokens,
                        think_s=think_s, heartbeat_s=heartbeat_s, watchdog_s=watchdog_s,
                        tolerance_s=tolerance_s, load_scale=load_scale)
    if plan.seed is not None and not as_json:
        console.print(f"shuffled with --seed {plan.seed}")
        for number, order in enumerate(plan.rounds, 1):
            console.print(f"repeat {number}: " + ", ".join(f"{n} {m}" for n, m in order))
    runs: list[RunRecord] = []

    async def run_all() -> None:
        total = sum(len(order) for order in plan.rounds)
        for number, order in enumerate(plan.rounds, 1):
            for scenario_name, mode in order:
                scenario = CATALOGUE[scenario_name]
                if per_run and not as_json:
                    console.print(f"[bold][{len(runs) + 1}/{total}][/] repeat {number}: "
                                  f"{scenario_name} {mode}")
                try:
                    outcome = await run(lab, scenario, mode, timing)
                except ScenarioUnavailable as exc:
                    if name != "all":
                        raise
                    # `all` goes on: a scenario this machine cannot run (no
                    # chromium, no HTTP/2 edge) is no wrong verdict, but shown.
                    runs.append(RunRecord(number, scenario_name, mode, None, str(exc)))
                    if not as_json:
                        err.print(f"[yellow]skipped[/] {scenario_name} {mode}: {exc}")
                    continue
                except ToxiproxyError:
                    raise  # the lab is not there: nothing after this can run either
                except Exception as exc:
                    if name != "all" and not per_run:
                        raise
                    # A measure that crashed (a browser call that timed out, a
                    # client error) is a wrong verdict, not the end of the run:
                    # the rest still runs and the summary says which.
                    runs.append(RunRecord(number, scenario_name, mode, None,
                                          error=f"{type(exc).__name__}: {exc}"[:200]))
                    if not as_json:
                        err.print(f"[bold red]error[/] {scenario_name} {mode}: "
                                  f"{type(exc).__name__}: {exc}")
                    continue
                runs.append(RunRecord(number, scenario_name, mode, outcome))
                if as_json:
                    continue
                if per_run:
                    print_outcomes(scenario, [outcome], all_figures)
                elif mode == modes[-1]:  # the scenario's modes side by side
                    print_outcomes(scenario, [r.outcome for r in runs[-len(modes):]
                                              if r.outcome is not None
                                              and r.scenario == scenario_name], all_figures)

    try:
        asyncio.run(run_all())
    except ToxiproxyError as exc:
        err.print(f"[red]{exc}[/] (is the lab up? `streamlab status`)")
        raise typer.Exit(1) from exc
    except ScenarioUnavailable as exc:
        err.print(f"[red]cannot run here:[/] {exc}")
        raise typer.Exit(1) from exc
    outcomes = [r.outcome for r in runs if r.outcome is not None]
    if as_json:
        if per_run:
            print(json.dumps({"seed": plan.seed, "runs": [r.as_json() for r in runs]},
                             indent=2))
        else:
            print(json.dumps([o.as_json() for o in outcomes], indent=2))
    elif name == "all" or per_run:
        print_summary(runs, plan.seed)
    if not all(r.as_expected for r in runs):
        raise typer.Exit(1)


@dataclass(frozen=True)
class RunRecord:
    repeat: int
    scenario: str
    mode: Mode
    outcome: Outcome | None  # None: skipped (this machine cannot run it) or crashed
    skipped: str | None = None
    error: str | None = None  # the measure raised: counts as an unexpected verdict

    @property
    def as_expected(self) -> bool:
        return self.error is None and (self.outcome is None or self.outcome.as_expected)

    def as_json(self) -> dict[str, object]:
        return {"repeat": self.repeat, "scenario": self.scenario, "mode": self.mode,
                "skipped": self.skipped, "error": self.error,
                "outcome": self.outcome.as_json() if self.outcome else None}


def print_summary(runs: list[RunRecord], seed: int | None) -> None:
    wrong = [r for r in runs if not r.as_expected]
    skipped = sum(r.skipped is not None for r in runs)
    table = Table("#", "repeat", "scenario", "mode", "verdict",
                  title="summary" + (f" (--seed {seed})" if seed is not None else ""),
                  title_justify="left")
    for number, record in enumerate(runs, 1):
        if record.error is not None:
            verdict = f"[bold red]ERROR[/]: {record.error}"
        elif record.outcome is None:
            verdict = f"[yellow]skipped[/]: {record.skipped}"
        elif record.outcome.as_expected:
            verdict = f"[green]{record.outcome.verdict}[/]"
        else:
            verdict = f"[bold red]{record.outcome.verdict}[/]"
        table.add_row(str(number), str(record.repeat), record.scenario, record.mode, verdict)
    console.print(table)
    console.print(f"{len(runs) - skipped - len(wrong)} as expected, {len(wrong)} unexpected, "
                  f"{skipped} skipped, of {len(runs)} runs"
                  + (f"; replay this order with --seed {seed}" if seed is not None else ""))


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
