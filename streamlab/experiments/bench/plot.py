"""The benches' plots, each drawn from the bench's Report (its tables and figures).

Transports: one lane per transport, a mark per token at the moment the client
saw it (the run with the median total), the model's own token times in the top
lane, and a dashed line from the model's first token to each lane's first
arrival (the TTFT the transport added); below, gateway CPU and wire bytes per
run. Slow readers: the gateway's RSS growth and the tokens generated over time.
Scale: cadence and CPU per token per cell; cell c: open files and heartbeat
lateness against their bounds.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: the bench runs in terminals and CI

import matplotlib.pyplot as plt  # after choosing the backend
from matplotlib.figure import Figure as Drawing

from streamlab.experiments.report import Artifact, Figure, Report, Table

LANE_COLOURS = ["#555555", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#d62728", "#8c564b",
                "#e377c2", "#17becf"]


def table(report: Report, title: str) -> Table:
    return next(t for t in report.tables if t.title == title)


def column(t: Table, name: str) -> list[Figure]:
    i = t.columns.index(name)
    return [row[i] for row in t.rows]


def number(value: Figure) -> float:
    """A figure on an axis: nothing measured draws as 0."""
    return float(value) if isinstance(value, int | float) else 0.0


def plot(report: Report, path: Path) -> Report:
    """Draw the experiment's plot at `path`; the report with it among its artifacts.
    Import this module late: matplotlib is slow to load and most runs plot nothing."""
    drawn = draw(report, path)
    return replace(report, artifacts=report.artifacts + tuple(
        Artifact("plot", str(p), title) for p, title in drawn))


def draw(report: Report, path: Path) -> list[tuple[Path, str]]:
    """The plot(s) of `report`'s experiment at `path`: (file, title) of each drawn.
    `bench scale` draws its cadence at `path` (scale.png inside it, when it is a
    directory) and cell c beside it as scale-slow.png."""
    if report.experiment == "bench transports":
        plot_transports(report, path)
        return [(path, "token arrivals and costs per transport")]
    if report.experiment == "bench slow-readers":
        plot_slow_readers(report, path)
        return [(path, "gateway RSS and tokens generated, per relay")]
    if report.experiment == "bench scale":
        target = path / "scale.png" if path.suffix != ".png" else path
        drawn = []
        for part in report.parts or (report,):
            if part.variant == "cadence":
                plot_scale(part, target)
                drawn.append((target, "cadence and CPU per token as streams grow"))
            elif part.variant == "slow":
                plot_slow(part, target.with_name("scale-slow.png"))
                drawn.append((target.with_name("scale-slow.png"),
                              "slow streams: open files and heartbeat lateness"))
        return drawn
    raise ValueError(f"{report.experiment} has no plot")


def _save(fig: Drawing, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_transports(report: Report, path: Path) -> None:
    """Render `bench transports`' report to a PNG at `path`."""
    arrivals, costs = table(report, "arrivals"), table(report, "transports")
    lanes: dict[str, list[float]] = {}
    for lane, ms in zip(column(arrivals, "lane"), column(arrivals, "ms"), strict=True):
        lanes.setdefault(str(lane), []).append(number(ms))
    names = [str(n) for n in column(costs, "transport")]
    model_ms = lanes.get("model", [])
    ordered = [("model", model_ms), *((n, lanes.get(n, [])) for n in names)]

    fig = plt.figure(figsize=(12, 8.5), layout="constrained")
    grid = fig.add_gridspec(2, 2, height_ratios=[2.2, 1])
    timeline = fig.add_subplot(grid[0, :])
    for row, (_name, times) in enumerate(ordered):
        y = len(ordered) - 1 - row
        colour = LANE_COLOURS[row % len(LANE_COLOURS)]
        timeline.scatter([t / 1000 for t in times], [y] * len(times), marker="|", s=140,
                         color=colour, linewidths=1.5)
        if row > 0 and times and model_ms:
            timeline.plot([model_ms[0] / 1000, times[0] / 1000], [y, y], linestyle="--",
                          color="#1f77b4", linewidth=0.8)
    timeline.set_yticks(range(len(ordered)), [name for name, _ in reversed(ordered)])
    timeline.set_xlabel("seconds since the request started")
    f = report.figures
    timeline.set_title(
        f"When each token reached the client: {f['tokens']} tokens, "
        f"{f['gap_ms']} ms apart (median run of {f['repetitions']})")
    timeline.grid(axis="x", alpha=0.3)

    colours = LANE_COLOURS[1:len(names) + 1]
    cpu = fig.add_subplot(grid[1, 0])
    cpu.bar(names, [number(v) for v in column(costs, "gw CPU ms")], color=colours)
    cpu.set_ylabel("gateway CPU per run (ms)")
    cpu.set_title("Server work (median)")
    cpu.tick_params(axis="x", rotation=35)

    wire = fig.add_subplot(grid[1, 1])
    up = [number(v) / 1024 for v in column(costs, "bytes up")]
    down = [number(v) / 1024 for v in column(costs, "bytes down")]
    wire.bar(names, down, color=colours)
    wire.bar(names, up, bottom=down, color="#bbbbbb")
    wire.set_ylabel("KiB on the wire per run")
    wire.set_title("Bytes on the wire, median (colour: down, grey: up)")
    wire.tick_params(axis="x", rotation=35)
    _save(fig, path)


def plot_slow_readers(report: Report, path: Path) -> None:
    """Render `bench slow-readers`' report: the gateway's RSS growth and the
    tokens the engine generated over time, one line per relay."""
    samples = table(report, "samples")
    fig, (memory, tokens) = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    for colour, run in zip(("#2ca02c", "#d62728"), report.parts, strict=False):
        relay = run.variant
        mine = [row for row in samples.rows if row[0] == relay]
        times = [number(row[1]) for row in mine]
        base = number(run.figures["base_rss_mb"])
        label = f"{relay} (peak +{number(run.figures['growth_mb']):.0f} MiB)"
        memory.plot(times, [number(row[2]) - base for row in mine], color=colour, label=label)
        tokens.plot(times, [number(row[3]) for row in mine], color=colour, label=relay)
    clients = number(report.figures["clients"])
    tokens.axhline(clients * number(report.figures["answer_tokens"]), color="#555555",
                   linestyle="--", linewidth=1, label="every answer in full")
    memory.set(title=f"gateway RSS growth, {clients:.0f} silent readers",
               xlabel="seconds", ylabel="MiB")
    tokens.set(title="tokens the engine generated for them", xlabel="seconds",
               ylabel="tokens")
    memory.legend()
    tokens.legend()
    _save(fig, path)


SCALE_PROCESSES = ("engine", "toxiproxy", "toxiproxy-backend", "gateway", "nginx", "client")
SCALE_COLOURS = {"batched": "#1f77b4", "per_stream": "#d62728"}


def plot_scale(report: Report, path: Path) -> None:
    """Render `bench scale`'s cadence part: N against inter-chunk p50/p99 and TTFT
    p99 per clock (left), µs of CPU per token per process, stacked (right)."""
    fig, (cadence, cpu) = plt.subplots(1, 2, figsize=(13, 5), layout="constrained")
    cells = table(report, "cells")
    clock_of, streams = column(cells, "clock"), column(cells, "streams")
    p50, p99, ttft = column(cells, "ICL p50"), column(cells, "p99"), column(cells, "TTFT p99")
    for clock in dict.fromkeys(clock_of):
        mine = [i for i, c in enumerate(clock_of) if c == clock and p99[i] is not None]
        n = [number(streams[i]) for i in mine]
        colour = SCALE_COLOURS.get(str(clock), "#555555")
        cadence.plot(n, [number(p99[i]) for i in mine], "o-", color=colour,
                     label=f"{clock}: inter-chunk p99")
        cadence.plot(n, [number(p50[i]) for i in mine], "o--", color=colour,
                     label=f"{clock}: inter-chunk p50", alpha=0.7)
        cadence.plot(n, [number(ttft[i]) for i in mine], ":", color=colour,
                     label=f"{clock}: TTFT p99", alpha=0.7)
    cadence.axhline(number(report.figures["target_icl_p99_ms"]), color="#555555", linewidth=1,
                    linestyle="--", label="p99 target")
    cadence.set(xscale="log", xlabel="concurrent streams", ylabel="ms (linear below 10)",
                title=f"Cadence at a {report.figures['step_ms']} ms step, entering at "
                      f"{report.figures.get('entry', 'edge')}")
    # symlog: an inter-chunk p50 of 0 (tokens bunched into one read) stays on the plot.
    cadence.set_yscale("symlog", linthresh=10)
    cadence.set_ylim(bottom=0)
    cadence.legend(fontsize=8)

    # Each cell's part holds its CPU per token per process.
    labels = [f"{p.figures['clock']}\n{p.figures['streams']}" for p in report.parts]
    bottom = [0.0] * len(labels)
    for colour, name in zip(LANE_COLOURS[1:], SCALE_PROCESSES, strict=False):
        values = [number(p.figures.get(f"us_per_token_{name}")) for p in report.parts]
        cpu.bar(labels, values, bottom=bottom, color=colour, label=name)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    cpu.set(ylabel="µs of CPU per token", title="Where a token's CPU goes (per process)")
    cpu.tick_params(axis="x", labelsize=7)
    cpu.legend(fontsize=8)
    _save(fig, path)


def plot_slow(report: Report, path: Path) -> None:
    """Render `bench scale`'s cell c: open files per process at the peak against
    the per-process limit (left), heartbeat lateness quantiles against its bound
    (right), both bounds read from the report's checks."""
    from streamlab.experiments.bench.scale_slow import FD_LIMIT, TARGET_HEARTBEAT_LATE_P99_MS

    f = report.figures
    fig, (files, late) = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    processes = table(report, "processes")
    names = [str(n) for n in column(processes, "process")]
    files.bar(names, [number(v) for v in column(processes, "open files at peak")],
              color=LANE_COLOURS[1])
    files.axhline(FD_LIMIT, color="#d62728", linewidth=1, linestyle="--",
                  label=f"{FD_LIMIT:,}: open-file limit per process here")
    files.set(ylabel="open file descriptors (peak)",
              title=f"{f['completed']}/{f['streams']} slow streams complete · gateway "
                    f"{f['gateway_kib_per_stream']} KiB RSS per stream")
    files.tick_params(axis="x", labelsize=8)
    files.legend(fontsize=8)
    quantiles = {q: number(f[f"heartbeat_late_ms_{q}"]) for q in ("p50", "p90", "p99")
                 if f"heartbeat_late_ms_{q}" in f}
    late.bar(list(quantiles), list(quantiles.values()), color=LANE_COLOURS[2])
    late.axhline(TARGET_HEARTBEAT_LATE_P99_MS, color="#d62728", linewidth=1, linestyle="--",
                 label=f"bound: p99 <= {TARGET_HEARTBEAT_LATE_P99_MS} ms")
    late.set(ylabel="ms late", title=f"Heartbeat lateness ({f.get('heartbeats', 0)} "
                                     f"heartbeats, every {number(f['heartbeat_s']):g} s)")
    late.legend(fontsize=8)
    _save(fig, path)
