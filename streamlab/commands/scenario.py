"""`streamlab scenario list|show|run`: reproduce a failure, broken and fixed, with a verdict.

    streamlab scenario list                       # one line per scenario
    streamlab scenario list --json                # the catalogue as data
    streamlab scenario show idle-cut [--json]     # one scenario: modes, setups, checks, needs
    streamlab scenario show idle-cut --last       # its last run per mode: verdict, the streams
                                                  # it judged, `streamlab trace ID` for each
    streamlab scenario run idle-cut --both        # exit 0 only if every verdict is as expected
    streamlab scenario run all --json             # every scenario: one report, machine-readable
    streamlab scenario run all --shuffle --repeat 3 [--seed S]
                                                  # any order: each repeat shuffled

The command parses, calls the runner (streamlab/experiments/scenarios/runner.py:
run_plan, which holds the run/skip/error policy) and prints its Report as the
one renderer (streamlab/experiments/render.py) draws it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from streamlab.commands.completion import (
    complete_probes,
    complete_proxies,
    complete_scenarios,
    complete_scenarios_or_all,
)
from streamlab.commands.conventions import OutputConsole, fail, plot_extra, print_json, split_list
from streamlab.commands.exits import reach
from streamlab.commands.lab import DEFAULT_RUN_DIR, RunDir
from streamlab.exit_codes import EXIT_UNEXPECTED, EXIT_UNREACHABLE, EXIT_USAGE
from streamlab.experiments.render import (
    catalogue_line,
    print_last_runs,
    print_plan_summary,
    print_scenario,
    scenario_table,
    verdict_markup,
)
from streamlab.lab.target import Capability
from streamlab.lab.watchdog import ToxiproxyWatchdog

if TYPE_CHECKING:
    from streamlab.experiments.report import Report
    from streamlab.experiments.scenarios import Mode, Scenario

# The catalogue (and the websockets client its measures use) is imported inside
# the commands: every `streamlab ...` start would otherwise pay for it.

# One line: rich rewraps the epilog. The codes are the ones every experiment
# command shares (commands/exits.py).
EXIT_CODES = ("Exit status: 0 every verdict as expected (a scenario this lab or machine "
              "cannot run, a capability it needs missing, is shown as skipped and is no "
              "wrong verdict); 1 a verdict not as expected (a check failed, or a measure "
              "crashed: an error); 2 usage (an unknown scenario or option); 3 the target is "
              "unreachable (no lab up, its Toxiproxy API down).")

app = typer.Typer(help="Reproduce each streaming failure, broken and fixed, and measure it.",
                  short_help="Reproduce each streaming failure, broken and fixed.",
                  no_args_is_help=True)
console = OutputConsole()
err = OutputConsole(stderr=True)


@app.command("list")
def list_scenarios(
    as_json: Annotated[bool, typer.Option(
        "--json", help="The whole catalogue as data: setups and checks per mode (bounds at "
                       "the default timing).")] = False,
) -> None:
    """Every scenario, one line each (`scenario show NAME` for the rest).

    On a terminal each summary is cut to the width; piped, every line is whole."""
    from streamlab.experiments.scenarios import Timing, all_scenarios

    if as_json:
        print_json([s.as_json(Timing()) for s in all_scenarios()])
        return
    catalogue = all_scenarios()
    name_width = max(len(s.name) for s in catalogue)
    width = console.width if console.is_terminal else None
    for scenario in catalogue:
        console.print(catalogue_line(scenario.name, scenario.summary, name_width, width),
                      highlight=False, soft_wrap=width is None)


@app.command("show")
def show_scenario(
    name: Annotated[str, typer.Argument(help="A scenario (see `scenario list`).",
                                        autocompletion=complete_scenarios)],
    as_json: Annotated[bool, typer.Option(
        "--json", help="The scenario as data (bounds at the default timing).")] = False,
    last: Annotated[bool, typer.Option(
        "--last", help="Its last run in this lab instead, per mode: the verdict and the "
                       "streams it judged, each with the `streamlab trace ID` that draws "
                       "it.")] = False,
    run_dir: RunDir = DEFAULT_RUN_DIR,
) -> None:
    """One scenario: its modes, setups, checks and needs.

    What it shows, each mode's story, setup and checks (bounds at the default
    timing), and what it needs of the lab. With --last: its last run from this
    run dir instead (each mode's verdict and the request ids of its streams)."""
    from streamlab.experiments.scenarios import Timing, get, names

    if name not in names():
        fail(f"no scenario {name!r}; one of: {', '.join(names())}", EXIT_USAGE)
    if last:
        show_last(name, run_dir, as_json)
        return
    doc = get(name).as_json(Timing())
    if as_json:
        print_json(doc)
    else:
        print_scenario(doc, console)


def last_runs(name: str, run_dir: Path) -> dict[str, Any]:
    """`scenario show NAME --last --json`: each mode's last run (when, verdict,
    whether the lab was traced) and its streams, each with its trace command."""
    from streamlab.experiments.scenarios.runner import last_run

    # The runner keeps them under the lab's artifacts dir (runner.artifacts_dir).
    kept = last_run(run_dir / "scenarios", name)
    if kept is None:
        fail(f"no run of {name} recorded in {run_dir}: `streamlab scenario run {name}` "
             "keeps its last one", EXIT_UNEXPECTED)
    modes = {}
    for mode, run in sorted(kept["modes"].items()):
        report = run.get("report")
        modes[mode] = {
            "ran_unix": run.get("ran_unix"), "status": run.get("status"),
            "verdict": run.get("verdict"), "as_expected": run.get("as_expected"),
            "reason": run.get("reason") or "", "traced": bool(run.get("traced")),
            "streams": [{"request_id": i, "trace": _trace_command(i, run_dir)}
                        for i in run.get("request_ids") or []],
            "figures": report.get("figures") if isinstance(report, dict) else {}}
    return {"scenario": name, "run_dir": str(run_dir), "modes": modes}


def _trace_command(request_id: str, run_dir: Path) -> str:
    extra = "" if run_dir == DEFAULT_RUN_DIR else f" --run-dir {run_dir}"
    return f"streamlab trace {request_id}{extra}"


def show_last(name: str, run_dir: Path, as_json: bool) -> None:
    doc = last_runs(name, run_dir)
    if as_json:
        print_json(doc)
    else:
        print_last_runs(doc, console)


@app.command("run", epilog=EXIT_CODES)
def run_command(
    name: Annotated[str, typer.Argument(help="A scenario (see `list`), or `all`.",
                                        autocompletion=complete_scenarios_or_all)],
    broken: Annotated[bool, typer.Option("--broken", help="Only the broken setup.")] = False,
    fixed: Annotated[bool, typer.Option("--fixed", help="Only the fixed setup.")] = False,
    both: Annotated[bool, typer.Option("--both", help="Both (the default).")] = False,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Machine-readable output: the whole run as one report.")] = False,
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
    streams: Annotated[int | None, typer.Option(
        min=1, help="Streams of the storm scenarios (reconnect-storm, owner-killed-storm).")
    ] = None,
    shuffle: Annotated[bool, typer.Option(
        "--shuffle", help="Run the (scenario, mode) pairs in a random order, a new one per "
                          "repeat: no verdict may depend on what ran before it.")] = False,
    repeat: Annotated[int, typer.Option(
        min=1, help="Run everything this many times.")] = 1,
    seed: Annotated[int | None, typer.Option(
        help="Seed of the shuffle (printed on every shuffled run), to replay an order.")
    ] = None,
    plot: Annotated[Path | None, typer.Option(
        callback=plot_extra, help="Write the token arrivals, broken above fixed, as a PNG "
                                   "here (with `all`: a directory, one PNG a scenario).")
    ] = None,
) -> None:
    """Run one scenario (or all) and print figures and a verdict per mode.

    Exits 0 only when every verdict is as expected: the broken setup broke and
    the fixed one worked."""
    from streamlab.experiments import scenarios

    known = scenarios.names()
    if name != "all" and name not in known:
        fail(f"no scenario {name!r}; one of: {', '.join(known)}, all", EXIT_USAGE)
    modes: tuple[Mode, ...] = scenarios.MODES if both or broken == fixed else (
        ("broken",) if broken else ("fixed",))
    plan = scenarios.plan_runs(list(known) if name == "all" else [name], modes,
                               repeat=repeat, shuffle=shuffle, seed=seed)
    lab = reach(run_dir)
    timing = scenarios.timing_for(
        lab, prefill_ms=prefill_ms, gap_ms=gap_ms, tokens=tokens, think_s=think_s,
        heartbeat_s=heartbeat_s, watchdog_s=watchdog_s, tolerance_s=tolerance_s,
        load_scale=load_scale, streams=streams)
    # One table per scenario (its modes side by side) unless the order is mixed
    # or repeated; then one table per run and a summary of every run at the end.
    progress = None if as_json else Progress(
        per_run=shuffle or repeat > 1, modes=len(modes),
        total=sum(len(order) for order in plan.rounds), all_figures=all_figures)
    if plan.seed is not None and not as_json:
        console.print(f"shuffled with --seed {plan.seed}")
        for number, order in enumerate(plan.rounds, 1):
            console.print(f"repeat {number}: " + ", ".join(f"{n} {m}" for n, m in order))
    # A lab that can restart its services gets the Toxiproxy watchdog: a hop
    # process that wedges or dies mid-plan is restarted, not the end of the plan.
    watchdog = (ToxiproxyWatchdog(lab) if Capability.RESTART_SERVICE in lab.capabilities
                else None)
    try:
        report = asyncio.run(scenarios.run_plan(
            lab, plan, timing, on_start=progress.started if progress else None,
            on_report=progress.ended if progress else None, watchdog=watchdog))
    except scenarios.TargetUnreachable as exc:
        fail(f"{exc} (is the lab up? `streamlab status`)", EXIT_UNREACHABLE)
    if watchdog is not None and not as_json:
        for restart in watchdog.restarts:
            err.print(f"[yellow]watchdog:[/] {restart.describe()}")
    if plot is not None:
        report = write_plots(report, known if name == "all" else (name,), plot)
    if as_json:
        print_json(report.as_json())
    elif name == "all" or shuffle or repeat > 1:
        print_plan_summary(report, console)
    if not report.as_expected:
        raise typer.Exit(EXIT_UNEXPECTED)


def write_plots(report: Report, names: Sequence[str], plot: Path) -> Report:
    """Each scenario's arrivals plot (one scenario: at `plot`; several: `plot`
    is a directory, NAME.png inside), listed among the plan report's artifacts."""
    from streamlab.experiments.report import Artifact
    from streamlab.experiments.scenarios import plot as plots

    drawn = []
    for scenario in names:
        rows = plots.lanes(report, scenario)
        if not rows:  # skipped, errored, or a measure that records no arrivals
            err.print(f"[yellow]no plot for {scenario}[/]: no run recorded token arrivals")
            continue
        path = plot if len(names) == 1 else plot / f"{scenario}.png"
        plots.draw(scenario, rows, path)
        err.print(f"plot written to {path}", markup=False)
        drawn.append(Artifact("plot", str(path), f"{scenario}: token arrivals"))
    return replace(report, artifacts=report.artifacts + tuple(drawn))


class Progress:
    """Says each run's start and end as it goes (a scenario's mode can take a
    minute), and renders the reports (the runner calls back)."""

    def __init__(self, *, per_run: bool, modes: int, total: int, all_figures: bool) -> None:
        self.per_run, self.modes, self.total = per_run, modes, total
        self.all_figures = all_figures
        self.done = 0
        self.pending: list[Report] = []  # the current scenario's modes, not yet shown
        self.started_at = time.monotonic()

    def _head(self, repeat: int, scenario: str, mode: str) -> str:
        again = f"repeat {repeat}: " if self.per_run else ""
        return f"[bold][{self.done + 1}/{self.total}][/] {again}{scenario} {mode}"

    def started(self, repeat: int, scenario: str, mode: Mode) -> None:
        self.started_at = time.monotonic()
        console.print(f"{self._head(repeat, scenario, mode)} ...", highlight=False)

    def ended(self, repeat: int, report: Report) -> None:
        from streamlab.experiments.scenarios import get

        took = time.monotonic() - self.started_at
        outcome = verdict_markup(report)
        console.print(f"{self._head(repeat, report.experiment, report.variant)} ... {outcome} "
                      f"({took:.0f} s)", highlight=False)
        self.done += 1
        scenario = get(report.experiment)
        if self.per_run:
            if report.status == "ran":
                self._show(scenario, [report])
            return
        self.pending.append(report)
        if len(self.pending) == self.modes:  # the scenario's modes side by side
            ran = [r for r in self.pending if r.status == "ran"]
            if ran:
                self._show(scenario, ran)
            self.pending = []

    def _show(self, scenario: Scenario, reports: list[Report]) -> None:
        console.print(scenario_table(f"{scenario.name}: {scenario.summary}", scenario.shown,
                                     reports, self.all_figures))


MATRIX_EXIT_CODES = ("Exit status: 0 every cell measured and as expected where it must be; 1 "
                     "a cell not measured (a lab that did not come up, a probe that "
                     "crashed), your --proxy-config fails a check, or a ready form fails "
                     "the checks its proxy's fix should make hold; 2 usage.")


@app.command("matrix", epilog=MATRIX_EXIT_CODES)
def matrix_command(
    proxy: Annotated[list[str] | None, typer.Option(
        "--proxy", help="Proxies to run: repeat it, or separate with commas (default: all "
                        "four).", autocompletion=complete_proxies)] = None,
    proxy_config: Annotated[Path | None, typer.Option(
        "--proxy-config", exists=True, dir_okay=False,
        help="Your own config for the proxy (one --proxy): probed as it is.")] = None,
    probe: Annotated[list[str] | None, typer.Option(
        "--probe", help="Probes to run: repeat it, or separate with commas (default: every "
                        "probe).", autocompletion=complete_probes)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="The matrix as data.")] = False,
    as_markdown: Annotated[bool, typer.Option(
        "--markdown", help="The matrix as a Markdown table.")] = False,
    plot_file: Annotated[Path | None, typer.Option(
        "--plot", help="Draw the matrix as a coloured grid (PNG) here.")] = None,
    from_json: Annotated[Path | None, typer.Option(
        "--from-json", exists=True, dir_okay=False,
        help="Run nothing: render a matrix saved with --json.")] = None,
) -> None:
    """Does each edge proxy break token streams, out of the box and fixed?

    For each proxy, a lab of its own on free ports, every edge probe in it
    (out of the box, then streaming-ready; or your --proxy-config as it is),
    the lab down again; then the matrix: proxy x failure, each cell the
    probe's checks judged (as expected or UNEXPECTED), the figures, the
    directive that fixes it. Exits 1 if a cell could not be measured, your
    config fails a check, or a proxy's fix does not make the checks that
    failed out of the box hold (they do not discriminate)."""
    from streamlab.experiments.scenarios import edge_matrix, edge_probes
    from streamlab.lab.proxies import PROXY_NAMES

    proxy, probe = split_list(proxy), split_list(probe)
    proxies = list(dict.fromkeys(proxy or PROXY_NAMES))
    unknown = [p for p in proxies if p not in PROXY_NAMES]
    unknown_probes = [p for p in probe if p not in edge_probes.probe_names()]
    if unknown or unknown_probes:
        fail(f"unknown: {', '.join(unknown + unknown_probes)}; proxies: "
             f"{', '.join(PROXY_NAMES)}; probes: {', '.join(edge_probes.probe_names())}",
             EXIT_USAGE)
    if proxy_config is not None and len(proxies) != 1:
        fail("--proxy-config needs exactly one --proxy (the config's proxy)", EXIT_USAGE)
    probes = [edge_probes.get_probe(p) for p in probe] if probe else list(edge_probes.PROBES)
    say = edge_matrix.stderr_say if as_json or as_markdown else (
        # A lab's progress quotes a proxy's own refusal ("[emerg]", "[/path:3]"): as it is.
        lambda line: console.print(line, highlight=False, markup=False))
    if from_json is not None:
        matrix = edge_matrix.Matrix.from_json(json.loads(from_json.read_text()))
        matrix.probes = [p for p in matrix.probes if not probe or p in probe]
        matrix.rows = [r for r in matrix.rows if not proxy or r.proxy in proxy]
    else:
        matrix = asyncio.run(edge_matrix.run_matrix(proxies, probes, user_config=proxy_config,
                                                    say=say))
    if plot_file is not None:
        try:
            say(f"plot: {edge_matrix.plot(matrix, plot_file)}")
        except ImportError:
            err.print("[yellow]--plot needs matplotlib: pip install -e '.[plot]'[/]")
    if as_json:
        print_json(matrix.as_json())
    elif as_markdown:
        print(edge_matrix.markdown(matrix), end="")
    else:
        print_matrix(matrix)
    for proxy_name, probe_name in matrix.undiscriminating:
        err.print(f"[red]{escape(proxy_name)} {escape(probe_name)}: the ready form fails the "
                  "checks that failed out of the box[/]")
    if not matrix.measured or matrix.yours_broken or matrix.undiscriminating:
        raise typer.Exit(EXIT_UNEXPECTED)


def print_matrix(matrix: Any) -> None:
    """The matrix as a table: a row per failure and proxy."""
    from streamlab.experiments.render import colour, summary
    from streamlab.experiments.scenarios.edge_matrix import rows_for_table, shown

    yours = any("yours" in row.forms for row in matrix.rows)
    table = Table("failure", "proxy", "your config" if yours else "out of the box",
                  *(() if yours else ("ready",)), "fixing directive",
                  title="proxy matrix" + ("" if yours else
                                          " (ready: the lab's streaming-ready config)"),
                  title_justify="left", show_lines=True)
    for failure, name, first, ready, fix in rows_for_table(matrix):
        cells = [f"[{colour(r)}]{escape(summary(r, shown(failure)))}[/]" for r in (first, ready)
                 if r is not None]
        table.add_row(failure, name, *cells, escape(fix))
    console.print(table)
