"""The one renderer: any Report as rich tables for the terminal, as JSON, or as
Markdown tables for the docs.

    tables(report)      rich tables: the verdict and its checks, the figures, each Table
    show(report, ...)   print them (or the JSON, or Markdown) to a console
    as_json_text(...)   Report.as_json, indented

A bench's plot is drawn from its Report by bench/plot.py (`plot(report, path)`):
this module sits below every experiment family and imports none of them.

A report's parts are drawn only when it has no tables of its own: a bench's
tables already summarise its cells, and the soak's self-test its runs.
"""

from __future__ import annotations

import json
import math

from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable

from streamlab.experiments.report import Figure, Report, Table


def cell(value: Figure) -> str:
    """One figure as plain text: '-' for nothing measured, a whole number without
    decimals, few digits for small numbers, thousands separated from 10,000."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        if abs(value) >= 10_000:
            return f"{value:,.0f}"
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"
    return value


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

