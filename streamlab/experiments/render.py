"""The one renderer: any Report as rich tables for the terminal, as JSON, or as
Markdown tables for the docs.

    tables(report)      rich tables: the verdict and its checks, the figures, each Table
    show(report, ...)   print them (or the JSON, or Markdown) to a console
    as_json_text(...)   Report.as_json, indented
    summary(report)     a report in one line (a table's cell), and colour(report) its colour
    print_scenario(...) the scenario command's text (the block at the end): the
                        catalogue, a scenario, its last runs, a run's tables

A bench's plot is drawn from its Report by bench/plot.py (`plot(report, path)`):
this module sits below every experiment family and imports none of them.

A report's parts are drawn only when it has no tables of its own: a bench's
tables already summarise its cells, and the soak's self-test its runs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table as RichTable
from rich.text import Text

from streamlab.experiments.report import JSON, Figure, Report, Table, figure_text

# One figure as text: the renderer's name for report.figure_text.
cell = figure_text


def _shown(value: Figure | str) -> str:
    """As a rich table shows it: measured words ("connect: [Errno 111]") are not markup."""
    return escape(value if isinstance(value, str) else cell(value))


def _heading(report: Report) -> str:
    head = report.experiment + (f" [{report.variant}]" if report.variant else "")
    return f"{head}: {report.verdict}" + (f" ({report.reason})" if report.reason else "")


def table_of(table: Table) -> RichTable:
    out = RichTable(title=escape(table.title), caption=escape(table.caption) or None)
    for i, column in enumerate(table.columns):
        out.add_column(column, justify="left" if i == 0 else "right")
    for row in table.rows:
        out.add_row(*(_shown(cell(v)) for v in row))
    return out


def verdict_table(report: Report, with_figures: bool = True) -> RichTable:
    """The report's checks (measured, target, met) and, with `with_figures`, its figures."""
    out = RichTable("check", "measured", "met", "why", title=escape(_heading(report)),
                    caption=escape(report.story) or None)
    for result in report.checks:
        out.add_row(_shown(result.description), _shown(result.measured),
                    "[green]yes[/]" if result.holds else "[red]NO[/]", _shown(result.check.why))
    if with_figures:
        judged = {r.check.figure for r in report.checks}
        for name, value in report.figures.items():
            if name not in judged:
                out.add_row(_shown(name), _shown(value), "", "")
    return out


def tables(report: Report) -> list[RichTable]:
    """Everything a terminal shows of `report`, in order (a report that only
    gathers parts, with nothing of its own to show, shows just its parts)."""
    verdict = verdict_table(report, with_figures=True)
    for artifact in report.artifacts:
        verdict.add_row(_shown(f"{artifact.kind}: {artifact.title}"), _shown(artifact.path), "",
                        "")
    out = [verdict] if verdict.row_count or report.status != "ran" else []
    out += [table_of(t) for t in report.tables]
    if not report.tables:
        for part in report.parts:
            out += tables(part)
    return out


def summary(report: Report, shown: Sequence[str] = ()) -> str:
    """A report in one line, for a table's cell: its verdict (its reason, when it
    did not run), the figures named in `shown` that it has, then its story:
    "UNEXPECTED (done no, error ...); cut by `timeout server` 1 s (line 5)"."""
    figures = ", ".join(f"{k} {cell(report.figures[k])}" for k in shown if k in report.figures)
    return (report.verdict + (f" ({report.reason})" if report.reason else "")
            + (f" ({figures})" if figures else "") + (f"; {report.story}" if report.story else ""))


def colour(report: Report) -> str:
    """The verdict's colour: green as expected, red not, yellow not run (skipped, error)."""
    if report.status != "ran":
        return "yellow"
    return "green" if report.as_expected else "red"


def markdown(table: Table) -> str:
    """A GitHub table, for pasting a run into the docs."""
    lines = ["| " + " | ".join(table.columns) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(table.columns))) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.rows]
    return "\n".join(lines)


def as_json_text(report: Report) -> str:
    return json.dumps(report.as_json(), indent=2)


def show(report: Report, console: Console, *, as_json: bool = False,
         as_markdown: bool = False) -> None:
    """Print `report` the way the command line asked: JSON (plain print, so that
    `--json > file` holds nothing else), Markdown tables, or rich tables."""
    if as_json:
        print(as_json_text(report))
    elif as_markdown:
        print("\n\n".join(markdown(t) for t in report.tables))
    else:
        for table in tables(report):
            console.print(table)


# --- The scenario command's text (commands/scenario.py) ----------------------
# `scenario list`'s lines, `scenario show` (a scenario as its --json document
# has it, or its last runs), and `scenario run`'s tables: each run's verdict,
# a scenario's modes side by side, a plan's summary. Drawn from data (the
# documents, Reports, names), so this module still imports no family.


def catalogue_line(name: str, summary: str, name_width: int, width: int | None) -> Text:
    """`name  summary`, the summary cut with an ellipsis so the line fits `width`
    (a wrapped catalogue is a wall of text at 80 columns); whole without one
    (piped: `| grep` must see every word)."""
    line = Text(f"{name:<{name_width}}  ", style="bold")
    line.append(summary)
    if width is not None:
        line.truncate(max(width, name_width + 4), overflow="ellipsis")
    return line


def _indented(console: Console, line: str) -> None:
    # Indented as a whole, wrapped lines too, so each item stands out under its mode.
    console.print(Padding(Text(line), (0, 0, 0, 2), expand=False))


def setup_lines(setup: Mapping[str, JSON]) -> list[str]:
    """A setup's toxics one per line, then its other settings on one line
    (`setup` is Setup.as_json())."""
    rest = dict(setup)
    toxics: Any = rest.pop("toxics", None) or []
    lines = []
    for toxic in toxics if isinstance(toxics, list) else []:
        attributes = " ".join(f"{k}={v}" for k, v in (toxic.get("attributes") or {}).items())
        lines.append(f"toxic on {toxic['hop']}: {toxic['type']} {toxic.get('stream', '')} "
                     f"{attributes}".rstrip())
    knobs: Any = rest.pop("knobs", None) or {}
    settings = [f"{k}={v}" for k, v in rest.items()]
    settings += [f"{k}={v}" for k, v in (knobs.items() if isinstance(knobs, dict) else [])]
    return [*lines, " ".join(settings)]


def print_scenario(doc: Mapping[str, JSON], console: Console) -> None:
    """`scenario show NAME`: a scenario from its document (Scenario.as_json):
    what it needs, each mode's story, setup and checks (bounds as the document
    holds them)."""
    modes: Any = doc["modes"]  # mode → {story, setup, expect: [{check, why, ...}]}
    needs: Any = doc["needs"]
    console.print(f"[bold]{doc['name']}[/]: {doc['summary']}", highlight=False)
    console.print(f"needs: {', '.join(needs) or 'nothing beyond a lab that is up'}",
                  highlight=False)
    for mode, variant in modes.items():
        console.print(f"\n[bold]{mode}[/]: {variant['story']}", highlight=False)
        for line in setup_lines(variant["setup"]):
            _indented(console, f"setup: {line}")
        for check in variant["expect"]:
            why = check["why"]
            _indented(console, f"check: {check['check']}" + (f" ({why})" if why else ""))
    console.print("\n[dim]bounds shown at the default timing; `scenario run` scales them "
                  "to the lab's[/]")


def print_last_runs(doc: Mapping[str, JSON], console: Console) -> None:
    """`scenario show NAME --last`: each mode's last run from its document (when,
    the verdict, the streams it judged with the command that draws each)."""
    modes: Any = doc["modes"]  # mode → {ran_unix, verdict, reason, traced, streams: [{trace}]}
    console.print(f"[bold]{doc['scenario']}[/]: last run in {escape(str(doc['run_dir']))}",
                  highlight=False)
    for mode, run in modes.items():
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run["ran_unix"] or 0))
        verdict = run["verdict"] + (f" ({run['reason']})" if run["reason"] else "")
        console.print(f"\n[bold]{mode}[/] at {when}: {escape(verdict)}", highlight=False)
        if not run["streams"]:
            _indented(console, "no stream named (this measure records none)")
        for stream in run["streams"]:
            # One line each, never wrapped: a command to copy.
            console.print(f"  {stream['trace']}", soft_wrap=True, highlight=False,
                          markup=False)
        if run["streams"] and not run["traced"]:
            _indented(console, "(the lab was up without --tracing: `streamlab trace` needs a "
                               "lab up with `streamlab up --tracing`, and the run again)")


def verdict_markup(report: Report) -> str:
    """One run's verdict, coloured: skipped and errors with their reason."""
    if report.status == "skipped":
        return f"[yellow]skipped[/]: {escape(report.reason)}"
    if report.status == "error":
        return f"[bold red]ERROR[/]: {escape(report.reason)}"
    colour = "green" if report.as_expected else "bold red"
    return f"[{colour}]{report.verdict}[/]"


def print_plan_summary(report: Report, console: Console) -> None:
    """A plan's runs (`scenario run all`, --shuffle, --repeat): one row a run,
    then the counts, and the seed that replays a shuffled order."""
    seed = report.figures.get("seed")
    table = RichTable("#", "repeat", "scenario", "mode", "verdict",
                      title="summary" + (f" (--seed {seed})" if seed is not None else ""),
                      title_justify="left")
    number = 0
    for repeat, part in enumerate(report.parts, 1):
        for run in part.parts:
            number += 1
            table.add_row(str(number), str(repeat), run.experiment, run.variant,
                          verdict_markup(run))
    console.print(table)
    figures = report.figures
    console.print(f"{figures['as_expected']} as expected, {figures['unexpected']} unexpected, "
                  f"{figures['skipped']} skipped, of {figures['runs']} runs"
                  + (f"; replay this order with --seed {seed}" if seed is not None else ""))


def scenario_cell(value: Figure) -> str:
    """A figure as a scenario's table shows it: seconds to the millisecond
    (0.450, where cell() gives 0.45), whole numbers unseparated."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def scenario_table(title: str, shown: Sequence[str], reports: Sequence[Report],
                   all_figures: bool) -> RichTable:
    """A scenario's runs side by side, a column a mode: the figures it shows
    (`shown`, then those its checks judge; every one with `all_figures`), the
    setup, the checks ticked, the verdict, the files it wrote."""
    table = RichTable(title=title, title_justify="left")
    table.add_column("figure")
    for report in reports:
        table.add_column(report.variant)
    checked = [c.check.figure for r in reports for c in r.checks]
    names = list(dict.fromkeys([*shown, *checked]))  # ordered, no repeats
    if all_figures or not names:
        names += sorted({k for r in reports for k in r.figures} - set(names))
    for figure in names:
        table.add_row(figure, *(scenario_cell(r.figures.get(figure)) for r in reports))
    table.add_section()
    table.add_row("setup", *(r.story for r in reports))
    table.add_row("expected", *("\n".join(
        f"{'[green]✓[/]' if c.holds else '[red]✗[/]'} {c.description}" for c in r.checks)
        for r in reports))
    table.add_row("verdict", *(
        f"[green]{r.verdict}[/]" if r.as_expected else f"[bold red]{r.verdict}[/]"
        for r in reports))
    if any(r.artifacts for r in reports):
        table.add_row("files", *("\n".join(f"{a.title}: {a.path}" for a in r.artifacts)
                                 for r in reports))
    return table
