"""The one renderer on a hand-made report: the terminal shows every check with
what was measured and whether it was met, each table, and a part only where no
table summarises the parts; JSON is Report.as_json; Markdown is each table."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from streamlab.experiments import render
from streamlab.experiments.report import Check, Figures, Report, Table, judge


def report(with_table: bool) -> Report:
    figures: Figures = {"ttft_ms": 4.5, "streams": 12_000, "note": "quiet machine", "missing": None,
                        "errors": "connect: [refused] 2"}
    checks = judge((Check("ttft_ms", "<=", 3.0, "adds little"), Check("streams", ">", 0)),
                   figures)
    table = Table("cells", ("path", "ms"), (("grpc", 1.25), ("chain", None)), caption="c")
    part = Report("bench x", "one part", figures={"part_figure": 1})
    return Report("bench x", figures=figures, checks=checks,
                  tables=(table,) if with_table else (), parts=(part,))


def shown(r: Report) -> str:
    console = Console(width=200, record=True)
    render.show(r, console)
    return console.export_text()


def test_the_terminal_shows_checks_measured_and_met_then_the_tables() -> None:
    text = shown(report(with_table=True))
    assert "bench x: UNEXPECTED" in text
    assert "ttft_ms <= 3" in text
    assert "4.5" in text
    assert "NO" in text
    assert "12,000" in text  # an unjudged figure, in the verdict table
    assert "connect: [refused] 2" in text  # a measured word is not markup
    assert "chain" in text
    assert "part_figure" not in text
    assert "part_figure" in shown(report(with_table=False))


def test_json_is_the_reports_own(capsys: pytest.CaptureFixture[str]) -> None:
    r = report(with_table=True)
    render.show(r, Console(), as_json=True)
    assert json.loads(capsys.readouterr().out) == r.as_json()


def test_markdown_is_each_table() -> None:
    assert render.markdown(report(with_table=True).tables[0]) == (
        "| path | ms |\n|---|---:|\n| grpc | 1.25 |\n| chain | - |")


@pytest.mark.parametrize(("value", "text"), [
    (None, "-"), (float("nan"), "-"), (True, "yes"), (0.01234, "0.0123"), (1234.56, "1234.6"),
    (12.0, "12"), (12_345.6, "12,346"), (12, "12"), (123_456, "123,456"), ("word", "word")])
def test_a_figure_as_text(value: float | int | bool | str | None, text: str) -> None:
    assert render.cell(value) == text
