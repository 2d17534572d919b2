"""Rich tables for the bench reports (the terminal view of their JSON)."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def _cell(stat: dict[str, float | None], fmt: str = "{:.0f}", spread: bool = True) -> str:
    median, low, high = stat["median"], stat["min"], stat["max"]
    if median is None:
        return "-"
    text = fmt.format(median)
    if spread and low is not None and high is not None and high > low:
        text += f" [dim]±{fmt.format((high - low) / 2)}[/]"
    return text


def transports_table(report: dict[str, Any]) -> Table:
    timing = report["timing"]
    table = Table(
        title=(f"{timing['answer_tokens']} tokens, {timing['token_gap_ms']} ms apart · "
               f"median of {report['repetitions']} (± half the range)"
               + (" · gzip" if report.get("gzip") else "")),
        caption="bytes: Toxiproxy's count on the edge proxy (gRPC: the engine proxy); "
                "CPU: the gateway process (kernel accounting). Absolute times vary by machine.",
    )
    for column in TRANSPORT_COLUMNS:
        table.add_column(column, justify="left" if column == "transport" else "right",
                         no_wrap=True)
    for row in transport_rows(report):
        table.add_row(*row)
    return table


TRANSPORT_COLUMNS = ("transport", "TTFT ms", "total ms", "requests", "tokens", "bytes up",
                     "bytes down", "B/token", "gw CPU ms", "CPU µs/token")


def transport_rows(report: dict[str, Any], markup: bool = True) -> list[list[str]]:
    rows = []
    for t in report["transports"]:
        s = t["summary"]
        failed = sum(1 for r in t["runs"] if not r["done"] or not r["in_order"])
        name = t["name"] + (f" ({failed} failed)" if failed else "")
        rows.append([
            name, _cell(s["ttft_ms"]), _cell(s["total_ms"]), _cell(s["requests"], spread=False),
            _cell(s["tokens"], spread=False), _cell(s["bytes_up"]), _cell(s["bytes_down"]),
            _cell(s["bytes_per_token"], spread=False), _cell(s["gateway_cpu_ms"], "{:.1f}"),
            _cell(s["cpu_us_per_token"], "{:.0f}", spread=False),
        ])
    if not markup:
        rows = [[cell.replace("[dim]", "").replace("[/]", "") for cell in row] for row in rows]
    return rows


def markdown(columns: tuple[str, ...] | list[str], rows: list[list[str]]) -> str:
    """A GitHub table, for pasting a run into the README."""
    lines = ["| " + " | ".join(columns) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
