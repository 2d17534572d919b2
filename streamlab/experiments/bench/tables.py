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
        caption="bytes: Toxiproxy's count on the edge proxy (TLS rows: edge-h2; gRPC: the "
                "engine proxy); CPU: the gateway process, nginx's workers (kernel "
                "accounting). Absolute times vary by machine.",
    )
    for column in TRANSPORT_COLUMNS:
        table.add_column(column, justify="left" if column == "transport" else "right",
                         no_wrap=True)
    for row in transport_rows(report):
        table.add_row(*row)
    return table


TRANSPORT_COLUMNS = ("transport", "TTFT ms", "total ms", "requests", "tokens", "bytes up",
                     "bytes down", "B/token", "gw CPU ms", "CPU µs/token", "nginx µs/token")


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
            # Reports from before nginx was measured have no such figure.
            _cell(s.get("nginx_cpu_us_per_token", {"median": None, "min": None, "max": None}),
                  "{:.0f}", spread=False),
        ])
    if not markup:
        rows = [[cell.replace("[dim]", "").replace("[/]", "") for cell in row] for row in rows]
    return rows


def markdown(columns: tuple[str, ...] | list[str], rows: list[list[str]]) -> str:
    """A GitHub table, for pasting a run into the docs."""
    lines = ["| " + " | ".join(columns) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


RELAY_COLUMNS = ("path", "conc.", "streams", "ok", "TTFT p50", "p90", "p99", "ICL p50",
                 "ICL p99", "relay CPU ms/1k tok", "engine CPU ms/1k tok", "client CPU ms")


def relay_rows(report: dict[str, Any]) -> list[list[str]]:
    def ms(value: float | None, fmt: str = "{:.1f}") -> str:
        return "-" if value is None or value != value else fmt.format(value)

    rows = []
    for c in report["cells"]:
        engine_k = (c["engine_cpu_ms"] * 1000 / c["tokens"]
                    if c["engine_cpu_ms"] is not None and c["tokens"] else None)
        relay = "-" if c["server"] == "engine" else (
            f"{ms(c['server_cpu_per_1k_tokens_ms'], '{:.0f}')} ({c['server']})")
        label = c["path"] + (f" @ {c['gap_ms']} ms" if c["gap_ms"] != report["timing"][
            "token_gap_ms"] else "")
        rows.append([label, str(c["concurrency"]), str(c["streams"]), str(c["completed"]),
                     ms(c["ttft_ms"]["p50"]), ms(c["ttft_ms"]["p90"]), ms(c["ttft_ms"]["p99"]),
                     ms(c["icl_ms"]["p50"]), ms(c["icl_ms"]["p99"]), relay,
                     ms(engine_k, "{:.0f}"), ms(c["client_cpu_ms"], "{:.0f}")])
    return rows


TARGET_COLUMNS = ("target", "measured", "met")


def target_rows(report: dict[str, Any]) -> list[list[str]]:
    return [[t["target"], f"{t['measured']:g} {t['unit']}", "yes" if t["met"] else "NO"]
            for t in report["targets"]]


def plain_table(title: str, columns: tuple[str, ...], rows: list[list[str]]) -> Table:
    table = Table(title=title)
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right", no_wrap=i > 0)
    for row in rows:
        table.add_row(*row)
    return table


SCALE_COLUMNS = ("clock", "streams", "ok", "batch", "ICL p50", "p90", "p99", "TTFT p99", "load",
                 "µs/token: engine", "toxiproxy", "toxiproxy-backend", "gateway", "nginx",
                 "client", "total")


def scale_rows(report: dict[str, Any]) -> list[list[str]]:
    """One row per cell of `bench scale`: cadence (ms) and CPU per token (µs)."""
    rows = []
    for cell in report["cells"]:
        icl, ttft, per = cell["icl_ms"], cell["ttft_ms"], cell["us_per_token"]
        known = [v for v in per.values() if v is not None]

        def us(name: str, per: dict[str, float | None] = per) -> str:
            value = per.get(name)
            return "-" if value is None else f"{value:.0f}"

        rows.append([cell["clock"], str(cell["streams"]), f"{cell['completed']}",
                     str(cell["mean_batch"] or "-"),
                     str(icl.get("p50", "-")), str(icl.get("p90", "-")),
                     str(icl.get("p99", "-")), str(ttft.get("p99", "-")),
                     f"{cell['loadavg'][0]:.1f}", us("engine"), us("toxiproxy"),
                     us("toxiproxy-backend"), us("gateway"), us("nginx"), us("client"),
                     f"{sum(known):.0f}" if known else "-"])
    return rows


SLOW_COLUMNS = ("measure", "value", "P4 target")


def slow_rows(cell: dict[str, Any]) -> list[list[str]]:
    """Cell c) of `bench scale`: one row per figure."""
    late = cell.get("heartbeat_late_ms") or {}
    rows = [["streams complete", f"{cell['completed']}/{cell['streams']}", "all"],
            ["failures", ", ".join(f"{k}: {v}" for k, v in cell["errors"].items()) or "none",
             ""],
            ["most streams the gateway held at once", str(cell.get("gateway_streams_held", "-")),
             ""],
            ["gateway RSS per stream held (KiB)", str(cell["gateway_kib_per_stream"]), "<= 30"],
            ["gateway RSS before / peak (MiB)",
             f"{cell['gateway_rss_before_mib']} / {cell['gateway_rss_peak_mib']}", ""],
            ["heartbeat lateness p50 / p90 / p99 (ms)",
             " / ".join(str(late.get(q, "-")) for q in ("p50", "p90", "p99")), "p99 <= 1000"],
            ["inter-chunk p50 / p99 (ms)",
             f"{cell['icl_ms'].get('p50', '-')} / {cell['icl_ms'].get('p99', '-')}", ""],
            ["TTFT p50 / p99 (ms)",
             f"{cell['ttft_ms'].get('p50', '-')} / {cell['ttft_ms'].get('p99', '-')}", ""],
            ["load average (1 min)", f"{cell['loadavg'][0]:.1f}", ""]]
    rows += [[f"open files at peak: {name}", str(n), "< 20,000"]
             for name, n in cell["peak_fds"].items()]
    rows += [[f"µs CPU per token: {name}", "-" if us is None else f"{us:.0f}", ""]
             for name, us in cell["us_per_token"].items()]
    return rows
