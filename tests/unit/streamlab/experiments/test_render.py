"""The one renderer on a hand-made report: the terminal shows every check with
what was measured and whether it was met, each table, and a part only where no
table summarises the parts; JSON is Report.as_json; Markdown is each table."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from rich.console import Console

from streamlab.experiments import render
from streamlab.experiments.report import JSON, Check, Figures, Report, Table, judge


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


# The scenario command's text (render.py's last block; commands/scenario.py prints it).

@pytest.mark.parametrize(("value", "text"), [
    (None, "-"), (True, "yes"), (0.45, "0.450"), (12.3456, "12.346"), (12_345, "12345"),
    ("word", "word")])
def test_a_scenario_table_keeps_seconds_to_the_millisecond(value: float | int | bool | str | None,
                                                           text: str) -> None:
    assert render.scenario_cell(value) == text


def text_of(draw: Callable[[Console], object]) -> str:
    console = Console(width=200, record=True)
    draw(console)
    return console.export_text()


def test_a_scenario_is_drawn_from_its_document() -> None:
    doc: dict[str, JSON] = {
        "name": "cut", "summary": "a pause cuts it", "needs": [], "modes": {"broken": {
            "story": "no pings", "expect": [{"check": "done == False", "why": "truncated"}],
            "setup": {"location": "/short/", "knobs": {"think": 3},
                      "toxics": [{"hop": "edge", "type": "latency", "stream": "downstream",
                                  "attributes": {"latency": 600}}]}}}}
    assert text_of(lambda c: render.print_scenario(doc, c)).splitlines() == [
        "cut: a pause cuts it", "needs: nothing beyond a lab that is up", "",
        "broken: no pings", "  setup: toxic on edge: latency downstream latency=600",
        "  setup: location=/short/ think=3", "  check: done == False (truncated)", "",
        "bounds shown at the default timing; `scenario run` scales them to the lab's"]


def test_a_last_run_names_each_stream_and_the_tracing_it_needs() -> None:
    doc: dict[str, JSON] = {"scenario": "cut", "run_dir": "/r", "modes": {
        "broken": {"ran_unix": 0, "verdict": "broke as expected", "reason": "", "traced": False,
                   "streams": [{"request_id": "ab", "trace": "streamlab trace ab"}]},
        "fixed": {"ran_unix": 0, "verdict": "error", "reason": "boom", "traced": True,
                  "streams": []}}}
    text = text_of(lambda c: render.print_last_runs(doc, c))
    assert "\n  streamlab trace ab\n" in text
    assert "without --tracing" in text
    assert ": error (boom)\n  no stream named" in text


def test_a_runs_verdict_is_coloured_with_its_reason() -> None:
    assert render.verdict_markup(Report("cut", "broken", status="skipped", reason="no x")) == (
        "[yellow]skipped[/]: no x")
    assert render.verdict_markup(Report("cut", "fixed")) == "[green]works as expected[/]"
    failed = Report("cut", "fixed", checks=judge((Check("done", "==", True),), {"done": False}),
                    figures={"done": False})
    assert render.verdict_markup(failed) == "[bold red]UNEXPECTED[/]"
    table = text_of(lambda c: c.print(render.scenario_table("cut: x", ("done",), [failed], False)))
    assert "✗ done == True" in table
    assert "UNEXPECTED" in table


def test_a_reason_from_outside_is_printed_as_it_is_not_as_markup() -> None:
    """A proxy's or server's words ("[emerg]", "[/x]") in an error's reason."""
    reason = "nginx: [emerg] unknown directive [/x]"
    console = Console(record=True, width=200)
    console.print(render.verdict_markup(Report("x", "broken", status="error", reason=reason)))
    assert reason in console.export_text()
