"""The transports figure: a timeline per transport, and what each transport cost.

Top: one lane per transport, a mark per token at the moment the client saw it
(the run with the median total), the model's own token times in the top lane,
and a dashed line from the model's first token to each lane's first arrival
(the TTFT the transport added). Bottom: gateway CPU and wire bytes per run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: the bench runs in terminals and CI

import matplotlib.pyplot as plt  # after choosing the backend

LANE_COLOURS = ["#555555", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#d62728", "#8c564b",
                "#e377c2", "#17becf"]


def plot_transports(report: dict[str, Any], path: Path) -> None:
    """Render `TransportsReport.as_json()` to a PNG at `path`."""
    transports = report["transports"]
    model_ms = report["model_token_times_ms"]
    lanes = [("model", model_ms)]
    for t in transports:
        runs = sorted((r for r in t["runs"] if r["done"]), key=lambda r: r["total_ms"])
        lanes.append((t["name"], runs[len(runs) // 2]["token_times_ms"] if runs else []))

    fig = plt.figure(figsize=(12, 8.5), layout="constrained")
    grid = fig.add_gridspec(2, 2, height_ratios=[2.2, 1])
    timeline = fig.add_subplot(grid[0, :])
    for row, (_name, times) in enumerate(lanes):
        y = len(lanes) - 1 - row
        colour = LANE_COLOURS[row % len(LANE_COLOURS)]
        timeline.scatter([t / 1000 for t in times], [y] * len(times), marker="|", s=140,
                         color=colour, linewidths=1.5)
        if row > 0 and times and model_ms:
            timeline.plot([model_ms[0] / 1000, times[0] / 1000], [y, y], linestyle="--",
                          color="#1f77b4", linewidth=0.8)
    timeline.set_yticks(range(len(lanes)), [name for name, _ in reversed(lanes)])
    timeline.set_xlabel("seconds since the request started")
    timing = report["timing"]
    timeline.set_title(
        f"When each token reached the client: {timing['answer_tokens']} tokens, "
        f"{timing['token_gap_ms']} ms apart (median run of {report['repetitions']})")
    timeline.grid(axis="x", alpha=0.3)

    names = [t["name"] for t in transports]
    colours = LANE_COLOURS[1:len(names) + 1]
    cpu = fig.add_subplot(grid[1, 0])
    cpu.bar(names, [t["summary"]["gateway_cpu_ms"]["median"] or 0 for t in transports],
            color=colours)
    cpu.set_ylabel("gateway CPU per run (ms)")
    cpu.set_title("Server work (median)")
    cpu.tick_params(axis="x", rotation=35)

    wire = fig.add_subplot(grid[1, 1])
    up = [(t["summary"]["bytes_up"]["median"] or 0) / 1024 for t in transports]
    down = [(t["summary"]["bytes_down"]["median"] or 0) / 1024 for t in transports]
    wire.bar(names, down, color=colours)
    wire.bar(names, up, bottom=down, color="#bbbbbb")
    wire.set_ylabel("KiB on the wire per run")
    wire.set_title("Bytes on the wire, median (colour: down, grey: up)")
    wire.tick_params(axis="x", rotation=35)

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_slow_readers(report: dict[str, Any], path: Path) -> None:
    """Render `slow_readers.compare()`'s report: the gateway's RSS growth and the
    tokens the engine generated over time, one line per relay."""
    fig, (memory, tokens) = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    for colour, run in zip(("#2ca02c", "#d62728"), report["runs"], strict=False):
        times = [s[0] for s in run["samples"]]
        label = f"{run['relay']} (peak +{run['growth_mb']:.0f} MiB)"
        memory.plot(times, [s[1] - run["base_rss_mb"] for s in run["samples"]], color=colour,
                    label=label)
        tokens.plot(times, [s[2] for s in run["samples"]], color=colour, label=run["relay"])
    requested = report["clients"] * report["answer_tokens"]
    tokens.axhline(requested, color="#555555", linestyle="--", linewidth=1,
                   label="every answer in full")
    memory.set(title=f"gateway RSS growth, {report['clients']} silent readers",
               xlabel="seconds", ylabel="MiB")
    tokens.set(title="tokens the engine generated for them", xlabel="seconds",
               ylabel="tokens")
    memory.legend()
    tokens.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


SCALE_PROCESSES = ("engine", "toxiproxy", "toxiproxy-backend", "gateway", "nginx", "client")
SCALE_COLOURS = {"batched": "#1f77b4", "per_stream": "#d62728"}


def plot_scale(report: dict[str, Any], path: Path) -> None:
    """Render `bench scale`'s report: N against inter-chunk p50/p99 and TTFT p99
    per clock (left), µs of CPU per token per process, stacked (right)."""
    fig, (cadence, cpu) = plt.subplots(1, 2, figsize=(13, 5), layout="constrained")
    cells = report["cells"]
    clocks = list(dict.fromkeys(c["clock"] for c in cells))
    for clock in clocks:
        mine = [c for c in cells if c["clock"] == clock and c["icl_ms"]]
        n = [c["streams"] for c in mine]
        colour = SCALE_COLOURS.get(clock, "#555555")
        cadence.plot(n, [c["icl_ms"]["p99"] for c in mine], "o-", color=colour,
                     label=f"{clock}: inter-chunk p99")
        cadence.plot(n, [c["icl_ms"]["p50"] for c in mine], "o--", color=colour,
                     label=f"{clock}: inter-chunk p50", alpha=0.7)
        cadence.plot(n, [c["ttft_ms"].get("p99", 0) for c in mine], ":", color=colour,
                     label=f"{clock}: TTFT p99", alpha=0.7)
    cadence.axhline(report["target_icl_p99_ms"], color="#555555", linewidth=1,
                    linestyle="--", label="p99 target")
    cadence.set(xscale="log", xlabel="concurrent streams", ylabel="ms (linear below 10)",
                title=f"Cadence at a {report['step_ms']} ms step, entering at "
                      f"{report.get('entry', 'edge')}")
    # symlog: an inter-chunk p50 of 0 (tokens bunched into one read) stays on the plot.
    cadence.set_yscale("symlog", linthresh=10)
    cadence.set_ylim(bottom=0)
    cadence.legend(fontsize=8)

    labels = [f"{c['clock']}\n{c['streams']}" for c in cells]
    bottom = [0.0] * len(cells)
    for colour, name in zip(LANE_COLOURS[1:], SCALE_PROCESSES, strict=False):
        values = [c["us_per_token"].get(name) or 0.0 for c in cells]
        cpu.bar(labels, values, bottom=bottom, color=colour, label=name)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    cpu.set(ylabel="µs of CPU per token", title="Where a token's CPU goes (per process)")
    cpu.tick_params(axis="x", labelsize=7)
    cpu.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_slow(cell: dict[str, Any], path: Path) -> None:
    """Render cell c) of `bench scale`: open files per process at the peak against
    the per-process limit (left), heartbeat lateness quantiles against P4's 1 s (right)."""
    fig, (files, late) = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    names = list(cell["peak_fds"])
    files.bar(names, [cell["peak_fds"][n] for n in names], color=LANE_COLOURS[1])
    files.axhline(20_000, color="#d62728", linewidth=1, linestyle="--",
                  label="20,000: open-file limit per process here")
    files.set(ylabel="open file descriptors (peak)",
              title=f"{cell['completed']}/{cell['streams']} slow streams complete · gateway "
                    f"{cell['gateway_kib_per_stream']} KiB RSS per stream")
    files.tick_params(axis="x", labelsize=8)
    files.legend(fontsize=8)
    quantiles = cell.get("heartbeat_late_ms") or {}
    late.bar(list(quantiles), list(quantiles.values()), color=LANE_COLOURS[2])
    late.axhline(cell["targets"]["heartbeat_late_p99_ms"], color="#d62728", linewidth=1,
                 linestyle="--", label="P4: p99 <= 1 s")
    late.set(ylabel="ms late", title=f"Heartbeat lateness ({cell.get('heartbeats', 0)} "
                                     f"heartbeats, every {cell['heartbeat_s']:g} s)")
    late.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
